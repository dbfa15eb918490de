"""Audit core: run a task set (e.g. the released Ops-6K) through every filter.

``load_task_set`` reads any Ops-6K-shaped parquet (columns ``ops`` as a JSON list string,
``data_source``, ``code``; the released transformers rows hold a bare module name in ``ops``,
read as a one-element list; opsynth task files with more columns load too). ``audit_tasks``
runs the static check, then the sandboxed execution stages, and returns a ``StepResult``:
kept and dropped tasks, every verdict row, and counts ``input``, ``kept`` and
``dropped_<reason>``. The CLI wiring lives elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from filters.pool import Progress, WorkerPool
from filters.static_check import StaticCheck
from opsynth.config import FiltersConfig
from opsynth.profile import ops_list
from opsynth.record import Task
from opsynth.stage import StepResult, apply_filters

REQUIRED_COLUMNS = ("ops", "data_source", "code")


def load_task_set(path: str | Path) -> list[Task]:
    """Tasks from a parquet file; the row index and file name go into ``meta``."""
    import pyarrow.parquet as pq

    path = Path(path)
    table = pq.read_table(path)
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(
            f"{path} lacks column(s) {', '.join(missing)}; expected {REQUIRED_COLUMNS}"
        )
    tasks = []
    for index, row in enumerate(table.to_pylist()):
        row["ops"] = json.dumps(ops_list(row["ops"]))
        if not row.get("meta"):
            row["meta"] = json.dumps({"source": path.name, "row": index})
        tasks.append(Task.from_row(row))
    return tasks


def audit_tasks(
    tasks: Sequence[Task],
    cfg: FiltersConfig,
    device: str = "auto",
    progress: Progress | None = None,
    *,
    pool: WorkerPool | None = None,
) -> StepResult:
    """Static check, then the execution stages on a sandboxed pool (``pool`` if given, else a
    fresh one that is closed afterwards). A task is kept when every stage passed."""
    if pool is None:
        with WorkerPool(cfg, device) as own:
            return _audit(tasks, own, progress)
    return _audit(tasks, pool, progress)


def _audit(tasks: Sequence[Task], pool: WorkerPool, progress: Progress | None) -> StepResult:
    pool.start()
    label = f"{pool.device}:{pool.stats.get('device_name') or ''}"
    torch_version = str(pool.stats.get("torch_version") or "")
    modules = frozenset(pool.cfg.task_modules)
    static = apply_filters(tasks, [StaticCheck(modules)], device=label, torch_version=torch_version)
    executed = pool.evaluate(static.kept, progress)

    result = StepResult()
    # one static verdict per task, in task order (duplicate rows share an id, not a verdict)
    for task, checked in zip(tasks, static.verdicts, strict=True):
        executed_rows = executed.get(task.id, []) if checked.passed else []
        result.add(task, [checked, *executed_rows])
    return result
