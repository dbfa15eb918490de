"""Reading task sets: the one loader every command uses (``load_task_file``: a KernelBench
jsonl, an Ops-6K-shaped parquet, or one task's ``.py``), and its per-format readers."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from opsynth.profile import REQUIRED_COLUMNS, ops_list
from opsynth.record import Task


class TaskSetError(ValueError):
    """A task set that cannot be read; one line that names the file and what is wrong."""


def load_task_file(path: str | Path, levels: Iterable[int] | None = None) -> list[Task]:
    """Tasks from ``path`` by its suffix: ``.parquet`` (``load_task_set``), ``.jsonl``
    (KernelBench, ``levels`` if given) or ``.py`` (one task). TaskSetError otherwise."""
    path = Path(path)
    if not path.is_file():
        raise TaskSetError(f"{path}: no such file")
    if path.suffix == ".py":
        return [Task(ops=[path.stem], data_source="file", code=path.read_text())]
    if path.suffix == ".jsonl":
        return load_kernelbench(path, levels or None)
    if path.suffix == ".parquet":
        return load_task_set(path)
    raise TaskSetError(f"{path}: expected a .parquet task set, a KernelBench .jsonl or a .py task")


def load_task_set(path: str | Path) -> list[Task]:
    """Tasks from an Ops-6K-shaped parquet (columns ``ops`` as a JSON list string,
    ``data_source``, ``code``; the released transformers rows hold a bare module name in
    ``ops``, read as a one-element list; opsynth task files with more columns load too). The
    row index and file name go into ``meta``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise TaskSetError(f"{path} is not a readable parquet file ({exc})") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise TaskSetError(
            f"{path} lacks column(s) {', '.join(missing)}; expected {REQUIRED_COLUMNS}"
        )
    tasks = []
    for index, row in enumerate(table.to_pylist()):
        row["ops"] = json.dumps(ops_list(row["ops"]))
        if not row.get("meta"):
            row["meta"] = json.dumps({"source": path.name, "row": index})
        tasks.append(Task.from_row(row))
    return tasks


def load_kernelbench(path: Path, levels: Iterable[int] | None = None) -> list[Task]:
    """KernelBench's jsonl (fields level, problem_id, name, code) as tasks. ``ops`` holds the
    problem name (level-2 names encode their operator sequence); ``data_source`` is
    ``kernelbench_l<level>`` so these rows can never pass for composed ones."""
    wanted = set(levels) if levels is not None else None
    tasks = []
    with open(path) as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                level, name, code = int(row["level"]), str(row["name"]), str(row["code"])
            except (json.JSONDecodeError, KeyError, ValueError) as exc:
                raise TaskSetError(f"{path}:{line_no} is not a KernelBench row ({exc})") from exc
            if wanted is not None and level not in wanted:
                continue
            tasks.append(
                Task(
                    ops=[name],
                    data_source=f"kernelbench_l{level}",
                    code=code,
                    meta={"level": level, "problem_id": row.get("problem_id"), "name": name},
                )
            )
    return tasks


def load_kernelbench_timings(path: Path, level: int) -> dict[int, float]:
    """KernelBench's published baseline timings (``baseline_time_torch.json``: level -> file
    name -> {mean, ...} in ms) keyed by problem id, the number before the first ``_`` of the
    file name. These are measurements of a known device, so they can calibrate another."""
    try:
        table = json.loads(Path(path).read_text())[f"level{level}"]
        return {int(name.split("_", 1)[0]): float(row["mean"]) for name, row in table.items()}
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        problem = f"{path} is not a KernelBench timing file with level {level}: {exc}"
        raise ValueError(problem) from exc
