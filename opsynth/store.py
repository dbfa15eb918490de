"""The run directory: parquet files of task and verdict rows, written atomically.

Layout (see ARCHITECTURE.md): final files at the top (``seeds``, ``candidates``,
``verdicts``, ``accepted``, ``rejected`` parquet + ``run.json``) and content-addressed
intermediate results under ``work/``. Every write goes to a temporary file first and is
renamed into place, so a run killed at any instant leaves either the old file or the new
one, never half of one; a finished ``work/`` file is never recomputed.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from opsynth.record import SCHEMA_VERSION, Task, Verdict

# run.json ``status``. While a run works: ``running``. After export every final parquet file
# is written and consistent: ``complete`` (the target met) or ``short`` (the rounds ran out).
# A time-limited invocation's end (``opsynth run --time-limit``): the files are written and
# consistent too, but hold only the finished chunks, so only a reader that asks gets them.
RUNNING, COMPLETE, SHORT, STOPPED = "running", "complete", "short", "stopped"
FINISHED = (COMPLETE, SHORT)

TASK_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("ops", pa.string()),
        ("data_source", pa.string()),
        ("code", pa.string()),
        ("seed_ids", pa.string()),
        ("composer", pa.string()),
        ("composer_version", pa.string()),
        ("config_hash", pa.string()),
        ("meta", pa.string()),
        ("created_at", pa.string()),
    ]
)

VERDICT_SCHEMA = pa.schema(
    [
        ("task_id", pa.string()),
        ("stage", pa.string()),
        ("passed", pa.bool_()),
        ("reason", pa.string()),
        ("detail", pa.string()),
        ("measures", pa.string()),
        ("device", pa.string()),
        ("torch_version", pa.string()),
        ("elapsed_s", pa.float64()),
        ("created_at", pa.string()),
    ]
)


class RunDirError(RuntimeError):
    """A problem with the run directory, reported as one line with the fix."""


def digest(*parts: Any) -> str:
    """Stable short hash of JSON-serialisable parts; keys content-addressed work files."""
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def write_bytes_atomic(path: Path, blob: bytes) -> None:
    """Write ``blob`` to a temporary name beside ``path``, flush it to disk and rename it into
    place: readers see the old file or the new one, never part of one, and a crash leaves no
    half-written file under the real name. The one atomic write every stage uses."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # documents to share, unlike mkstemp's private default
        with os.fdopen(fd, "wb") as fh:
            fh.write(blob)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_table_atomic(table: pa.Table, path: Path) -> None:
    tagged = table.replace_schema_metadata({b"opsynth_schema": str(SCHEMA_VERSION).encode()})
    sink = pa.BufferOutputStream()
    pq.write_table(tagged, sink)
    write_bytes_atomic(path, sink.getvalue().to_pybytes())


def write_tasks(tasks: Iterable[Task], path: Path) -> None:
    rows = [t.to_row() for t in tasks]
    write_table_atomic(pa.Table.from_pylist(rows, schema=TASK_SCHEMA), path)


def write_verdicts(verdicts: Iterable[Verdict], path: Path) -> None:
    rows = [v.to_row() for v in verdicts]
    write_table_atomic(pa.Table.from_pylist(rows, schema=VERDICT_SCHEMA), path)


def read_table(path: Path) -> pa.Table:
    """The parquet table at ``path``, refused (one line) if unreadable or written with another
    record schema; readers that want columns (polars) start here rather than from rows."""
    try:
        table = pq.read_table(path)
    except Exception as exc:
        raise RunDirError(
            f"{path} is not a readable parquet file ({type(exc).__name__}); delete it and "
            "re-run to recompute that stage"
        ) from exc
    meta = table.schema.metadata or {}
    found = meta.get(b"opsynth_schema")
    if found is not None and int(found) != SCHEMA_VERSION:
        raise RunDirError(
            f"{path} was written with record schema {int(found)}, this opsynth reads "
            f"{SCHEMA_VERSION}; use a new --out directory"
        )
    return table


def _read_rows(path: Path) -> list[dict[str, Any]]:
    return read_table(path).to_pylist()


def read_tasks(path: Path) -> list[Task]:
    return [Task.from_row(r) for r in _read_rows(path)]


def read_verdicts(path: Path) -> list[Verdict]:
    return [Verdict.from_row(r) for r in _read_rows(path)]


class RunDir:
    """Paths and cached work of one run directory."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @classmethod
    def create(cls, root: Path) -> RunDir:
        root = Path(root)
        if root.exists() and not root.is_dir():
            raise RunDirError(f"--out {root} is a file, not a directory; pass a directory path")
        try:
            (root / "work").mkdir(parents=True, exist_ok=True)
            probe = root / ".write-probe"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise RunDirError(
                f"cannot write to output directory {root} ({exc.strerror}); choose a writable --out"
            ) from exc
        return cls(root)

    @classmethod
    def open_existing(cls, root: Path) -> RunDir:
        root = Path(root)
        if not (root / "run.json").is_file():
            raise RunDirError(
                f"{root} is not an opsynth run directory (no run.json); pass the --out of a run"
            )
        return cls(root)

    def path(self, name: str) -> Path:
        return self.root / name

    def work_path(self, stage: str, key: str) -> Path:
        return self.root / "work" / f"{stage}-{key}.parquet"

    # run.json -----------------------------------------------------------------------------
    def read_manifest(self) -> dict[str, Any]:
        path = self.root / "run.json"
        if not path.exists():
            return {}
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise RunDirError(
                f"{path} is not valid JSON ({exc.msg}); delete it and re-run (work/ is kept)"
            ) from exc

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        text = json.dumps(manifest, indent=2, sort_keys=True, default=str)
        write_text_atomic(self.root / "run.json", text)
