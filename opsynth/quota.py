"""A run's target split over its data sources, so the accepted set has the configured mix.

The filters accept some sources more often than others (long chains and whole transformers
blocks fail more checks than a pair of operators), so a set composed in the configured mix
and cut at the target drifts from it. Instead each source gets a quota (``apportion``), later
rounds compose only the sources still short of theirs, as many as their own acceptance rate so
far says are needed (``round_plan``), and the exported rows fill each quota in acceptance order
(``in_quota_order``); what a source cannot fill is left to the others' extra rows, so a run
still reaches its target. Plain functions over ``Task`` rows: no I/O, no Prefect.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

from opsynth.record import Task


def apportion(total: int, weights: dict[str, float]) -> dict[str, int]:
    """``total`` split over the keys in proportion to their (non-negative) weights, rounded by
    largest remainder (ties to the earlier key), so the parts sum to ``total``."""
    mass = sum(weights.values())
    if mass <= 0:
        raise ValueError("apportion needs a positive weight")
    exact = {k: total * w / mass for k, w in weights.items()}
    parts = {k: math.floor(v) for k, v in exact.items()}
    order = sorted(exact, key=lambda k: (-(exact[k] - parts[k]), list(weights).index(k)))
    for k in order[: total - sum(parts.values())]:
        parts[k] += 1
    return parts


def by_source(tasks: Iterable[Task]) -> Counter[str]:
    return Counter(t.data_source for t in tasks)


def filled(accepted: Sequence[Task], quota: dict[str, int]) -> int:
    """Accepted rows that count towards the target: each source's up to its quota."""
    got = by_source(accepted)
    return sum(min(got[s], q) for s, q in quota.items())


def shortfall(accepted: Sequence[Task], quota: dict[str, int]) -> dict[str, int]:
    """Rows each source still lacks (sources at or over their quota left out)."""
    got = by_source(accepted)
    return {s: q - got[s] for s, q in quota.items() if got[s] < q}


def round_plan(
    short: dict[str, int],
    screened: Sequence[Task],
    accepted: Sequence[Task],
    oversample: float,
    available: dict[str, int] | None = None,
) -> dict[str, int]:
    """Candidates to compose per short source: its shortfall over the share of its screened
    candidates the run accepted so far (``1 / oversample`` when it has none yet, or accepted
    none), at least ``oversample`` times the shortfall; at most ``available[source]`` where
    given (a source with no seeds left drops out)."""
    tried, got = by_source(screened), by_source(accepted)
    plan: dict[str, int] = {}
    for source, lacking in short.items():
        rate = got[source] / tried[source] if tried[source] and got[source] else 1 / oversample
        wanted = math.ceil(lacking * max(oversample, 1 / rate))
        if available is not None and source in available:
            wanted = min(wanted, available[source])
        if wanted > 0:
            plan[source] = wanted
    return plan


def in_quota_order(accepted: Sequence[Task], quota: dict[str, int]) -> list[Task]:
    """The accepted rows reordered so the first ``sum(quota)`` fill each source's quota in
    acceptance order, then the rest in acceptance order: a source short of its quota leaves its
    places to the earliest extra rows of the others. Rows of sources without a quota count as
    extra."""
    taken: Counter[str] = Counter()
    within, extra = [], []
    for task in accepted:
        if taken[task.data_source] < quota.get(task.data_source, 0):
            taken[task.data_source] += 1
            within.append(task)
        else:
            extra.append(task)
    return within + extra
