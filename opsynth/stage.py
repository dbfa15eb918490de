"""The filter protocol every stage follows (modelled on datatrove's filters).

A filter is a small object with a ``name`` (its stage) and ``filter(task) -> Decision``.
``apply_filters`` runs a chain cheapest-first, writes one verdict row per task per filter it
reached, counts ``dropped_<reason>`` and keeps every dropped task (the exclusion side), so
nothing is ever silently lost.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from opsynth.record import Task, Verdict


@dataclass(frozen=True)
class Decision:
    keep: bool
    reason: str = "ok"
    detail: str = ""
    measures: dict[str, Any] = field(default_factory=dict)


KEEP = Decision(True)


def drop(reason: str, detail: str = "", **measures: Any) -> Decision:
    return Decision(False, reason, detail[:2000], measures)


class Filter(Protocol):
    name: str

    def filter(self, task: Task) -> Decision: ...


@dataclass
class StepResult:
    kept: list[Task] = field(default_factory=list)
    dropped: list[Task] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)

    def add(self, task: Task, verdicts: Sequence[Verdict]) -> None:
        """Record ``task``'s verdicts at this step: kept when every one passed, else dropped
        and counted under the first failing reason."""
        self.verdicts.extend(verdicts)
        self.counts["input"] += 1
        failed = next((v for v in verdicts if not v.passed), None)
        if failed is None:
            self.kept.append(task)
            self.counts["kept"] += 1
        else:
            self.dropped.append(task)
            self.counts[f"dropped_{failed.reason}"] += 1

    def extend(self, other: StepResult) -> None:
        self.kept += other.kept
        self.dropped += other.dropped
        self.verdicts += other.verdicts
        self.counts.update(other.counts)


def apply_filters(
    tasks: Iterable[Task],
    filters: Sequence[Filter],
    *,
    device: str = "",
    torch_version: str = "",
) -> StepResult:
    """Run each task through ``filters`` in order, stopping at its first drop."""
    result = StepResult()
    for task in tasks:
        verdicts: list[Verdict] = []
        for flt in filters:
            start = time.perf_counter()
            try:
                decision = flt.filter(task)
            except Exception as exc:  # a filter bug must not lose the task or the run
                decision = drop("filter_error", f"{type(exc).__name__}: {exc}")
            verdicts.append(
                Verdict(
                    task_id=task.id,
                    stage=flt.name,
                    passed=decision.keep,
                    reason=decision.reason,
                    detail=decision.detail,
                    measures=decision.measures,
                    device=device,
                    torch_version=torch_version,
                    elapsed_s=round(time.perf_counter() - start, 6),
                )
            )
            if not decision.keep:
                break
        result.add(task, verdicts)
    return result
