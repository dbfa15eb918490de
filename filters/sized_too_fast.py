"""The ``sizing`` filter: a sized candidate whose probe at the chosen size read well below the
runtime window is ``too_fast`` before any of its filters run (``sizing.too_fast_share``).

Sizing grows a fast task toward the window's log-middle; when the memory cap, ``max_value``
or the search's steps stop it short, the filters would spend a whole process on it (eager,
the checks, compile, ``verify``) only to time it below the window's edge again. The rule
reads the task's sizing record, or an inline job's claim: a probe the candidate's own
process reported, so a candidate can only reject itself with it, never pass. Every path that
sizes (lockstep, pipelined, inline) applies it to the task as sized, so they decide alike; an
inline job's process applies the same rule (``filters.sizing.chosen_too_fast``) and stops
before its stages. Tasks without a sizing record (sizing off, or a candidate sent back to
its composed size) pass.
"""

from __future__ import annotations

from opsynth.filters.sizing import chosen_too_fast, too_fast_below_ms
from opsynth.record import Task
from opsynth.stage import KEEP, Decision, drop

STAGE = "sizing"


class SizedTooFast:
    """Filter ``sizing`` (``opsynth.stage.Filter``): ``too_fast`` when the probe of the chosen
    size read below ``below_ms`` (``sizing.too_fast_share`` times the window's lower edge)."""

    name = STAGE

    def __init__(self, below_ms: float) -> None:
        self.below_ms = below_ms

    def filter(self, task: Task) -> Decision:
        record = task.meta.get("sizing")
        detail = chosen_too_fast(record, self.below_ms) if isinstance(record, dict) else ""
        return drop("too_fast", detail, below_ms=self.below_ms) if detail else KEEP


def sized_checks(share: float, window: tuple[float, float]) -> list[SizedTooFast]:
    """The checks a sized task meets before the sandbox: none while the rule is off, or while
    the window has no lower edge to fall below."""
    below_ms = too_fast_below_ms(share, window)
    return [SizedTooFast(below_ms)] if below_ms > 0 else []
