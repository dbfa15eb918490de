"""Audit core: run a task set (e.g. the released Ops-6K) through every filter.

``audit_tasks`` runs the static check, then the sandboxed execution stages, and returns a
``StepResult``: kept and dropped tasks, every verdict row, and counts ``input``, ``kept`` and
``dropped_<reason>``. Task sets are read by ``opsynth.tasksets``; the CLI wiring lives
elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence

from opsynth.config import FiltersConfig
from opsynth.filters.pool import Progress, WorkerPool
from opsynth.filters.static_check import StaticCheck
from opsynth.record import Task
from opsynth.stage import StepResult, apply_filters


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
