"""The filter funnel, computed from verdict rows alone so any run or audit can be explained."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from opsynth.record import Verdict

# The order candidates meet the stages; cheapest rejections first.
STAGE_ORDER = [
    "compose",
    "static",
    "decontam",
    "sizing",  # a sized task's probe at its chosen size (filters.sized_too_fast)
    "eager",
    "randomness",
    "degenerate",
    "runtime",
    "compile",
    "verify",
    "dedup",
    "recheck",  # a release's re-check (opsynth.rechecked), after the run's own stages
    "export",
]


@dataclass
class StageCount:
    stage: str
    entered: int = 0
    passed: int = 0
    reasons: Counter[str] = field(default_factory=Counter)

    @property
    def rejected(self) -> int:
        return self.entered - self.passed

    def top_reasons(self, n: int = 3) -> list[tuple[str, int]]:
        return self.reasons.most_common(n)


def funnel(verdicts: Iterable[Verdict]) -> list[StageCount]:
    """Per stage: how many tasks reached it, passed it, and why the others were rejected.
    Stages not in STAGE_ORDER (e.g. a plugin's) are appended in first-seen order."""
    counts: dict[str, StageCount] = {}
    for v in verdicts:
        sc = counts.setdefault(v.stage, StageCount(v.stage))
        sc.entered += 1
        if v.passed:
            sc.passed += 1
        else:
            sc.reasons[v.reason] += 1
    ordered = [counts.pop(s) for s in STAGE_ORDER if s in counts]
    return ordered + list(counts.values())


def funnel_rows(verdicts: Iterable[Verdict]) -> list[dict]:
    """The funnel as plain dicts, the form ``run.json`` stores and the CLI prints."""
    return [
        {"stage": s.stage, "entered": s.entered, "passed": s.passed, "reasons": dict(s.reasons)}
        for s in funnel(verdicts)
    ]


def reason_counts(verdicts: Iterable[Verdict]) -> Counter[str]:
    """``dropped_<reason>`` counts, datatrove style."""
    return Counter(f"dropped_{v.reason}" for v in verdicts if not v.passed)
