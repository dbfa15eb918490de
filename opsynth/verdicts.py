"""Pure operations on tasks and their verdicts that every flow and benchmark shares: grouping
rows by task, whether a task passed, moving a task's history to its sized version, and the
outcome of a run (which rows are exported, which rejected, with what extra verdicts).

Plain functions over ``Task`` and ``Verdict``: no I/O, no Prefect, testable alone.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from opsynth.record import Task, Verdict

# Stages whose measures are copied onto an exported row, so a dataset user needn't join.
ANNOTATED_STAGES = ("runtime", "compile", "decontam", "dedup")
# verify's row is copied too where it timed the task (``filters.timing_in_verify``), which its
# ``scaled_ms`` measure shows: then it holds the runtime stage's measurements.
TIMING_STAGE, TIMING_MEASURE = "verify", "scaled_ms"


def group_by_task(verdicts: list[Verdict]) -> dict[str, list[Verdict]]:
    """Each task's rows, in the order given."""
    grouped: dict[str, list[Verdict]] = {}
    for v in verdicts:
        grouped.setdefault(v.task_id, []).append(v)
    return grouped


def passed_all(task_id: str, verdicts_by_task: dict[str, list[Verdict]]) -> bool:
    """Whether ``task_id`` has rows and passed every one."""
    found = verdicts_by_task.get(task_id, [])
    return bool(found) and all(v.passed for v in found)


def adopt_sized(
    originals: list[Task], sized: list[Task], candidates: list[Task], verdicts: list[Verdict]
) -> tuple[list[Task], list[Task], list[Verdict]]:
    """Put each sized task in its original's place among the candidates and move the
    original's verdicts (compose) to it, so every candidate row keeps its whole history. A
    sized task whose code another candidate already has stays unsized."""
    taken = {t.id for t in candidates}
    renamed: dict[str, Task] = {}
    for original, new in zip(originals, sized, strict=True):
        if new.id == original.id or new.id not in taken:
            renamed[original.id] = new
            taken.add(new.id)
        else:
            renamed[original.id] = original
    moved = [
        dataclasses.replace(v, task_id=renamed[v.task_id].id) if v.task_id in renamed else v
        for v in verdicts
    ]
    return [renamed[t.id] for t in originals], [renamed.get(t.id, t) for t in candidates], moved


def timing_measures(verdict: Verdict) -> dict[str, Any] | None:
    """The measures of the row that timed a task (runtime's, or verify's where it timed it
    itself: ``TIMING_MEASURE``), else None."""
    timed = verdict.stage == "runtime" or verdict.stage == TIMING_STAGE
    return verdict.measures if timed and TIMING_MEASURE in verdict.measures else None


def annotate(task: Task, verdicts: list[Verdict]) -> Task:
    """Copy the key measurements onto the accepted row so a dataset user needn't join."""
    summary: dict[str, Any] = {}
    for v in verdicts:
        if v.stage in ANNOTATED_STAGES or timing_measures(v) is not None:
            summary[v.stage] = v.measures
        if v.device:
            summary["device"] = v.device
        if v.torch_version:
            summary["torch_version"] = v.torch_version
    task.meta = {**task.meta, "filters": summary}
    return task


@dataclass
class Outcome:
    """What a run exports: the accepted rows (annotated, at most the target), every other
    candidate, and all verdicts with an ``over_target`` row for each accepted task past it."""

    exported: list[Task]
    rejected: list[Task]
    verdicts: list[Verdict]
    complete: bool


def outcome(
    candidates: list[Task], verdicts: list[Verdict], accepted: list[Task], cap: int | None
) -> Outcome:
    """The exported and rejected rows of a run that accepted ``accepted`` (in order) under a
    target of ``cap`` (None: no target). Tasks past the cap get an ``over_target`` verdict, so
    even they are accounted for."""
    over = [
        Verdict(t.id, "export", False, "over_target", f"target {cap} already met")
        for t in (accepted[cap:] if cap is not None else [])
    ]
    every = verdicts + over
    by_task = group_by_task(every)
    exported = [annotate(t, by_task[t.id]) for t in accepted[:cap]]
    exported_ids = {t.id for t in exported}
    rejected = [t for t in candidates if t.id not in exported_ids]
    complete = cap is None or len(exported) >= cap
    return Outcome(exported, rejected, every, complete)
