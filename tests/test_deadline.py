"""The time limit's rules: a chunk starts only if the longest computed one would still fit;
a pipelined job only if a job's usual latency would still end by the limit, and one still
running well past it is abandoned."""

from __future__ import annotations

from opsynth.deadline import OVERRUN_S, ChunkClock, JobLatency


def test_no_limit_always_allows() -> None:
    clock = ChunkClock()
    clock.record(1e6, computed=True)
    assert clock.allows_next(1e12) and not clock.stopped


def test_first_chunk_starts_while_time_is_left() -> None:
    clock = ChunkClock(stop_at=100.0)
    assert clock.allows_next(99.0)
    assert not ChunkClock(stop_at=100.0).allows_next(100.0)


def test_longest_computed_chunk_is_the_estimate() -> None:
    clock = ChunkClock(stop_at=100.0)
    clock.record(30.0, computed=True)
    clock.record(10.0, computed=True)
    assert clock.allows_next(69.0)
    assert not clock.allows_next(71.0)  # 71 + 30 would end past the limit
    assert clock.stopped


def test_reused_chunks_say_nothing_about_the_next() -> None:
    clock = ChunkClock(stop_at=100.0)
    clock.record(95.0, computed=False)  # read from disk, however slow the disk was
    assert clock.computed_s == [] and clock.allows_next(50.0)


def test_once_stopped_stays_stopped() -> None:
    """A later, faster estimate never restarts a run that has begun writing its results."""
    clock = ChunkClock(stop_at=100.0)
    clock.record(50.0, computed=True)
    assert not clock.allows_next(60.0)
    clock.computed_s.clear()
    assert not clock.allows_next(0.0)


def test_a_chunk_that_stops_itself_starts_while_time_is_left() -> None:
    """The pipelined path starts no candidate past the limit, so no estimate holds it back."""
    clock = ChunkClock(stop_at=100.0)
    clock.record(80.0, computed=True)
    assert clock.allows_next(90.0, stops_mid_chunk=True)
    assert not clock.allows_next(90.0)
    assert not clock.allows_next(0.0, stops_mid_chunk=True)  # stopped stays stopped


def test_before_any_job_came_back_the_cutoff_is_the_limit() -> None:
    assert JobLatency().cutoff(100.0) == 100.0
    assert JobLatency([5.0]).cutoff(None) is None


def test_the_last_job_starts_a_usual_latency_before_the_limit() -> None:
    """Ten jobs took 1..10 s: the 90th percentile (10 s) is reserved; one slower outlier
    among many moves the cutoff only by its share."""
    latency = JobLatency()
    for seconds in range(1, 11):
        latency.record(float(seconds))
    assert latency.cutoff(100.0) == 90.0
    many = JobLatency([2.0] * 99 + [60.0])
    assert many.cutoff(100.0) == 98.0


def test_jobs_still_running_well_past_the_limit_are_abandoned() -> None:
    """At the limit plus the longer of the overrun allowance and a usual job's latency: a
    job that would end by its own timeout minutes later does not hold the invocation."""
    assert JobLatency().abandon_at(None) is None
    assert JobLatency().abandon_at(100.0) == 100.0 + OVERRUN_S  # nothing came back yet
    assert JobLatency([2.0] * 10, overrun_s=5.0).abandon_at(100.0) == 105.0
    assert JobLatency([2.0] + [40.0] * 9, overrun_s=5.0).abandon_at(100.0) == 140.0
