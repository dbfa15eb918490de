"""CUDA Agent's discrete reward and the Table 1 metrics over a set of scored solutions.

r = -1 when the solution is incorrect (or a guard rejected it); 3 when it is more than
``margin`` faster than both the eager and the ``torch.compile`` reference; 2 when more than
``margin`` faster than eager only; 1 otherwise (correct, not faster, or not timed, as on CPU).
A speedup above ``review_speedup`` is flagged: that large a win is more often a hack the guards
missed than a kernel.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Score:
    task_id: str
    solution: str
    reward: int
    correct: bool
    reason: str
    detail: str = ""
    eager_ms: float | None = None
    compile_ms: float | None = None
    solution_ms: float | None = None
    flags: list[str] = field(default_factory=list)
    group: str = ""

    @property
    def speedup_eager(self) -> float | None:
        return _ratio(self.eager_ms, self.solution_ms)

    @property
    def speedup_compile(self) -> float | None:
        return _ratio(self.compile_ms, self.solution_ms)

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "speedup_eager": self.speedup_eager,
            "speedup_compile": self.speedup_compile,
        }


def reward(
    correct: bool, speedup_eager: float | None, speedup_compile: float | None, margin: float
) -> int:
    if not correct:
        return -1
    faster_eager = speedup_eager is not None and speedup_eager > 1 + margin
    faster_compile = speedup_compile is not None and speedup_compile > 1 + margin
    if faster_eager and faster_compile:
        return 3
    return 2 if faster_eager else 1


def flags_for(
    speedup_eager: float | None,
    speedup_compile: float | None,
    review: float,
    torch_compute_calls: int,
    functional_calls: int,
    aten_kernels: int = 0,
) -> list[str]:
    flags = []
    if max(speedup_eager or 0, speedup_compile or 0) > review:
        flags.append(f"speedup_over_{review:g}x")
    if torch_compute_calls:
        flags.append("torch_compute_in_forward")
    if functional_calls:
        flags.append("functional_in_forward")
    if aten_kernels:
        flags.append("aten_compute_in_forward")
    return flags


# What each flag means and what to do about it; a flag never changes the reward.
FLAG_MEANINGS = {
    "speedup_over_": "a win that large is more often a hack the guards missed than a kernel: "
    "read the solution before trusting its reward",
    "torch_compute_in_forward": "ModelNew.forward ran torch compute ops from Python "
    "(a fallback, not a kernel; refused in strict mode)",
    "functional_in_forward": "ModelNew.forward called torch.nn.functional (refused in strict mode)",
    "aten_compute_in_forward": "ModelNew's forward launched ATen compute kernels, seen by the "
    "profiler (PyTorch doing the work, not the solution's kernels; refused in strict mode)",
}


def explain_flags(scores: Iterable[Score]) -> list[str]:
    """One line per flag that scored solutions carry: how many carry it, and what it means."""
    counts: dict[str, int] = defaultdict(int)
    for score in scores:
        for flag in score.flags:
            counts[flag] += 1
    lines = []
    for flag, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        meaning = next((m for key, m in FLAG_MEANINGS.items() if flag.startswith(key)), "")
        lines.append(f"{flag}: {count} solution(s); {meaning or 'see evaluator/reward.py'}")
    return lines


def metrics(scores: Iterable[Score]) -> dict[str, dict[str, Any]]:
    """Table 1 per group (KernelBench level, or "all"): pass rate, faster-than-eager and
    faster-than-compile rates (over all tasks), geometric-mean speedups over the correct,
    timed ones, and the mean reward."""
    groups: dict[str, list[Score]] = defaultdict(list)
    for s in scores:
        groups["all"].append(s)
        if s.group:
            groups[s.group].append(s)
    out = {}
    for name, rows in sorted(groups.items()):
        n = len(rows)
        timed = [s for s in rows if s.correct and s.speedup_eager is not None]
        out[name] = {
            "tasks": n,
            "pass_rate": _share(s.correct for s in rows),
            "faster_than_eager": _share(s.reward >= 2 for s in rows),
            "faster_than_compile": _share(s.reward == 3 for s in rows),
            "geomean_speedup_eager": _geomean(s.speedup_eager for s in timed),
            "geomean_speedup_compile": _geomean(s.speedup_compile for s in timed),
            "mean_reward": round(sum(s.reward for s in rows) / n, 4) if n else None,
            "flagged": sum(bool(s.flags) for s in rows),
        }
    return out


def _ratio(reference: float | None, solution: float | None) -> float | None:
    if reference is None or solution is None or solution <= 0:
        return None
    return reference / solution


def _share(values: Iterable[bool]) -> float | None:
    values = list(values)
    return round(sum(values) / len(values), 4) if values else None


def _geomean(values: Iterable[float | None]) -> float | None:
    logs = [math.log(v) for v in values if v]
    return round(math.exp(sum(logs) / len(logs)), 4) if logs else None
