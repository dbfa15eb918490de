"""Writing a run as the folder that is pushed to the Hub: one parquet shard per config, the
dataset card, the run's config as TOML and its manifest.

The folder is the push: ``--dry-run DIR`` writes exactly it, and a push uploads exactly it, so
what one sees is what the Hub gets. It is built under a temporary name and swapped in whole;
a failed push leaves it in place for the retry. The same run always gives the same bytes
(no clock in the card, fixed parquet settings), which is what makes re-publishing a no-op.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ValidationError

from opsynth.config import PublishConfig, RunConfig, render_toml
from opsynth.publish.card import CardInput, render_card
from opsynth.publish.errors import PublishError
from opsynth.publish.layout import (
    CARD_PATH,
    CONFIG_PATH,
    MANIFEST_PATH,
    RECHECK_CONFIG_PATH,
    RECHECK_MANIFEST_PATH,
    config_frames,
    data_path,
)
from opsynth.publish.recheck import Recheck
from opsynth.rundata import RunData
from opsynth.store import write_bytes_atomic

PARQUET_COMPRESSION = "zstd"  # what the Hub's own parquet conversion uses


@dataclass(frozen=True)
class Export:
    root: Path
    files: list[str]  # paths relative to root, as in the repo
    rows: dict[str, int]  # config -> rows


def to_arrow(frame: pl.DataFrame) -> pa.Table:
    """polars' large string/list types as plain ones, so ``datasets`` reports ``string``
    features like the released Ops-6K's."""
    table = frame.to_arrow()
    fields = []
    for f in table.schema:
        if pa.types.is_large_string(f.type):
            f = f.with_type(pa.string())
        elif pa.types.is_large_list(f.type):
            f = f.with_type(pa.list_(f.type.value_type))
        fields.append(f)
    return table.cast(pa.schema(fields))


def config_toml(data: RunData, what: str = "the published run") -> str | None:
    """The run's (or audit's) config as TOML, or None when this opsynth cannot read it back
    (a run made by another version; its config is still in the manifest)."""
    try:
        config = RunConfig.model_validate(data.manifest.get("config", {}))
    except ValidationError:
        return None
    recorded = data.manifest.get("config_hash", "")
    header = [f"# config of {what} (run.json config_hash {recorded})"]
    return render_toml(config, header)


def manifest_json(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n").encode()


def looks_like_export(root: Path) -> bool:
    return (root / CARD_PATH).is_file() and (root / MANIFEST_PATH).is_file()


def export_run(
    data: RunData,
    out: Path,
    repo_id: str,
    version: str,
    settings: PublishConfig,
    recheck: Recheck | None = None,
):
    """Write the push folder at ``out`` (replacing an earlier export there) and return it;
    with ``recheck``, the card states it and its run.json ships too."""
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not looks_like_export(out):
        raise PublishError(
            f"{out} is not empty and holds no earlier export; pass a new or empty directory"
        )
    frames = config_frames(data, settings.include_rejected)
    toml = config_toml(data)
    recheck_toml = None if recheck is None else config_toml(recheck.data, "the re-check")
    rows = {name: frame.height for name, frame in frames.items()}
    card = render_card(
        data,
        CardInput(
            repo_id, version, settings, rows, toml is not None, recheck, recheck_toml is not None
        ),
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        for name, frame in frames.items():
            path = staging / data_path(name)
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(to_arrow(frame), path, compression=PARQUET_COMPRESSION)
        write_bytes_atomic(staging / MANIFEST_PATH, manifest_json(data.manifest))
        if recheck is not None:
            checked = manifest_json(recheck.data.manifest)
            write_bytes_atomic(staging / RECHECK_MANIFEST_PATH, checked)
        if recheck_toml is not None:
            write_bytes_atomic(staging / RECHECK_CONFIG_PATH, recheck_toml.encode())
        if toml is not None:
            write_bytes_atomic(staging / CONFIG_PATH, toml.encode())
        write_bytes_atomic(staging / CARD_PATH, card.encode())
        staging.chmod(0o755)
        _swap(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    return Export(out, files, rows)


def _swap(staging: Path, out: Path) -> None:
    """Put ``staging`` at ``out``; an old export moves aside first and is removed after."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
    staging.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
