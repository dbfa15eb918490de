"""When a time-limited invocation (``opsynth run --time-limit``) stops starting chunks.

A GPU host is often lent for a fixed time (a batch job's wall-clock limit, a lease). A run
killed at the host's limit loses its jobs in flight (a chunk's settled jobs are kept in its
journal, ``flows.size_screen.Journal``) and leaves the dataset files as an earlier invocation
wrote them, so the run stops by itself instead. A pipelined chunk starts no candidate after
the limit less the time a job takes to come back (``JobLatency``), then ends once those in
flight are done (``flows.size_screen``): they end about at the limit, not a job's length after
it. A job still running well past the limit (``JobLatency.abandon_at``: one stuck, or slowed
by a device its neighbours fill) is abandoned and runs again in a later invocation, so that
the limit holds without waiting out its own timeout. On the other paths the next chunk starts
only if the longest chunk this invocation has computed would still end before the limit.
Either way the run writes what it has, and a later invocation on any host resumes from the
work on disk. Plain functions and dataclasses: no clock of its own, testable alone.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


@dataclass
class ChunkClock:
    """``stop_at``: the wall-clock time (seconds since the epoch) by which the invocation
    should be done; None for no limit. ``computed_s``: how long each chunk computed in this
    invocation took (chunks reused from disk take no time and say nothing about the next)."""

    stop_at: float | None = None
    computed_s: list[float] = field(default_factory=list)
    stopped: bool = False
    # what a chunk stopped mid-way leaves to a later invocation, by kind (counts)
    left: dict[str, int] = field(default_factory=dict)

    def allows_next(self, now: float, *, stops_mid_chunk: bool = False) -> bool:
        """Whether a chunk started at ``now`` is expected to end by ``stop_at``. Before the
        first computed chunk there is no estimate: it starts while there is time left at all,
        as every chunk does when it can itself stop at the limit (``stops_mid_chunk``: the
        pipelined path, which starts no candidate after it and keeps the finished ones in its
        journal). Once it says no, it stays stopped."""
        if self.stop_at is None:
            return True
        expected = 0.0 if stops_mid_chunk else max(self.computed_s, default=0.0)
        if self.stopped or now + expected >= self.stop_at:
            self.stopped = True
        return not self.stopped

    def record(self, seconds: float, *, computed: bool) -> None:
        if computed:
            self.computed_s.append(seconds)


# Which of the invocation's job latencies the cutoff reserves: most jobs started before it end
# by the limit, and one slow outlier does not stop the run early.
LATENCY_QUANTILE = 0.9

# The least time past the limit a job begun before it may take before it is abandoned: a job
# started at the cutoff ends about at the limit, and one that ends a little later is not lost.
OVERRUN_S = 30.0


@dataclass
class JobLatency:
    """How long this invocation's pipelined jobs took from submission to their verdicts
    (queueing included: a job submitted now waits behind those the pool holds), kept across
    chunks, so that the last jobs are started early enough to end by the limit."""

    seconds: list[float] = field(default_factory=list)  # kept sorted
    overrun_s: float = OVERRUN_S

    def __post_init__(self) -> None:
        self.seconds.sort()

    def record(self, seconds: float) -> None:
        # sorted as they come: the cutoff is asked after every job, and a run has thousands
        bisect.insort(self.seconds, seconds)

    def cutoff(self, stop_at: float | None) -> float | None:
        """When the last job may start: ``stop_at`` less the ``LATENCY_QUANTILE`` of the
        latencies seen; ``stop_at`` itself before any job came back."""
        if stop_at is None or not self.seconds:
            return stop_at
        return stop_at - self._usual()

    def abandon_at(self, stop_at: float | None) -> float | None:
        """When jobs still running are given up: ``stop_at`` plus ``overrun_s`` or a usual
        job's latency, whichever is longer. Jobs begun by the cutoff normally end by the
        limit; one running that far past it is stuck or slowed, and its own timeout
        (``filters.task_timeout_s``, minutes) would overrun a lease that ends at the limit."""
        if stop_at is None:
            return None
        return stop_at + max(self.overrun_s, self._usual() if self.seconds else 0.0)

    def _usual(self) -> float:
        index = min(len(self.seconds) - 1, int(LATENCY_QUANTILE * len(self.seconds)))
        return self.seconds[index]
