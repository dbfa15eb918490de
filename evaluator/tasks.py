"""Which tasks to score and which solution goes with each.

Tasks come from a single KernelBench-format ``.py`` file, KernelBench's jsonl (optionally
some levels) or a dataset parquet (opsynth's or the released Ops-6K). Solutions come from one
path (a single task) or a directory with one solution per task, named by the task's key:
``l<level>_<problem_id>`` for KernelBench, the row id otherwise. ``reference`` pairs every task
with its own ``Model`` renamed ``ModelNew``: the harness's sanity check.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from opsynth.evaluator.solution import Solution, SolutionError, load_solution
from opsynth.record import Task

_MODEL_CLASS = re.compile(r"^class Model\(", re.MULTILINE)


def load_tasks(path: Path, levels: Sequence[int] | None = None) -> list[Task]:
    """The tasks to score (``opsynth.tasksets.load_task_file``), a bad file as SolutionError."""
    from opsynth.tasksets import TaskSetError, load_task_file

    try:
        return load_task_file(path, levels)
    except TaskSetError as exc:
        raise SolutionError(f"--tasks {exc}") from None


def task_key(task: Task) -> str:
    level, problem = task.meta.get("level"), task.meta.get("problem_id")
    if level is not None and problem is not None:
        return f"l{level}_{problem}"
    return task.id


def group_of(task: Task) -> str:
    level = task.meta.get("level")
    return f"level{level}" if level is not None else ""


def reference_solution(task: Task) -> Solution:
    """The task's own module with ``ModelNew = Model`` appended (renaming the class would break
    ``super(Model, self)``); a different module object, so not a subclass of the task's Model."""
    if not _MODEL_CLASS.search(task.code):
        raise SolutionError(f"task {task_key(task)} has no top-level 'class Model('")
    return Solution("reference", task.code.rstrip() + "\n\n\nModelNew = Model\n")


def pair_up(
    tasks: list[Task], solutions: Path | None, reference: bool
) -> tuple[list[tuple[Task, Solution]], list[str]]:
    """(task, solution) pairs, and the keys of tasks that have no solution (skipped)."""
    if reference:
        return [(t, reference_solution(t)) for t in tasks], []
    if solutions is None:
        raise SolutionError("give --solutions PATH, or --reference to score each task's Model")
    if len(tasks) == 1 and (solutions.is_file() or (solutions / "model_new.py").is_file()):
        return [(tasks[0], load_solution(solutions))], []
    if not solutions.is_dir():
        raise SolutionError(f"--solutions {solutions}: not a solution or a folder of solutions")
    pairs, missing = [], []
    for task in tasks:
        key = task_key(task)
        for candidate in (solutions / key, solutions / f"{key}.py"):
            if candidate.exists():
                pairs.append((task, load_solution(candidate)))
                break
        else:
            missing.append(key)
    return pairs, missing
