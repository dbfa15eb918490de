"""The runtime window decided in verify (``filters.timing_in_verify``): the candidate's own
forward times, accepted only within the worker's clock for the same request, against a
scripted peer whose every request takes a set time by the worker's clock."""

from __future__ import annotations

from typing import Any

import pytest

from opsynth.filters import judge as j
from opsynth.filters import verify


class TimedPeer:
    """Answers like a candidate's process: each ``run`` takes ``wall_ms`` of the worker's
    clock and claims ``claim_ms`` (``None``: the reply carries ``ms = claim``, whatever it
    is); each ``sample`` takes ``sample_ms``. Records the requests."""

    def __init__(
        self, wall_ms: float, claim: Any, *, sample_ms: float = 0.1, compiled_share: float = 0.5
    ) -> None:
        self.wall_ms, self.claim, self.sample_ms = wall_ms, claim, sample_ms
        self.compiled_share = compiled_share
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def request(self, op: str, **fields: Any) -> tuple[dict[str, Any], float]:
        self.seen.append((op, fields))
        if op == "run":
            share = self.compiled_share if fields["which"] == "compiled" else 1.0
            if not fields.get("time"):
                return {"re": op}, self.wall_ms * share / 1e3
            claim = self.claim * share if isinstance(self.claim, float) else self.claim
            return {"re": op, "ms": claim}, self.wall_ms * share / 1e3
        if op == "sample":
            return {"re": op}, self.sample_ms / 1e3
        return {"re": op}, 1e-5

    def timed(self, which: str) -> int:
        timed = [f for op, f in self.seen if op == "run" and f.get("time")]
        return sum(f["which"] == which for f in timed)


SETTINGS = {"window_ms": [1.0, 100.0], "timed_runs": 10, "warmup_runs": 2, "speed_factor": 1.0}
OVERHEAD_S = 2e-5


def window(peer: TimedPeer, **settings: Any) -> tuple[str, str, dict[str, Any]]:
    return verify._timed_window(peer, {**SETTINGS, **settings}, OVERHEAD_S, {})  # type: ignore[arg-type]


def test_an_honest_task_is_timed_by_its_own_events_eager_then_compiled() -> None:
    peer = TimedPeer(wall_ms=5.1, claim=5.0)
    reason, _, measures = window(peer)
    assert reason == "ok"
    assert measures["eager_ms_median"] == measures["scaled_ms"] == 5.0
    assert measures["compiled_ms_median"] == 2.5 and measures["speedup"] == 2.0
    assert (peer.timed("eager"), peer.timed("compiled")) == (10, 10)
    assert measures["judged_ms"] == pytest.approx(5.1 - OVERHEAD_S * 1e3)
    # warm-up first, outside the lock; every timed run inside it, each after a flush
    ops = [op for op, _ in peer.seen]
    lock, unlock = ops.index("lock"), ops.index("unlock")
    assert not any(f.get("time") for op, f in peer.seen[:lock])
    assert ops[lock + 1 : lock + 3] == ["flush", "run"] and ops[-1] == "unlock"
    assert sum(op == "flush" for op in ops[lock:unlock]) == 20


def test_the_window_is_the_configured_one_with_no_tolerance_at_the_lower_edge() -> None:
    """0.95 ms by its own events is too fast for a 1 ms floor, though the worker's clock, with
    the request's round trip, reads within the tolerance ``_window`` allows."""
    reason, detail, measures = window(TimedPeer(wall_ms=1.0, claim=0.95))
    assert reason == "too_fast" and "0.95" in detail
    assert "compiled_ms_median" not in measures  # no compiled timing for a rejected task


def test_the_speed_factor_scales_the_claim() -> None:
    reason, _, measures = window(TimedPeer(wall_ms=0.6, claim=0.5), speed_factor=3.0)
    assert reason == "ok" and measures["scaled_ms"] == 1.5 and measures["eager_ms_median"] == 0.5


def test_a_claim_beyond_the_workers_clock_is_a_protocol_violation() -> None:
    """A process that claims more time than its request took, to look slow enough."""
    with pytest.raises(j.PeerFailure) as failure:
        window(TimedPeer(wall_ms=0.3, claim=2.0))
    assert failure.value.reason == "protocol_violation"
    assert "claims 2 ms of a 0.3 ms request" in failure.value.detail


@pytest.mark.parametrize("claim", ["5", -1.0, float("nan"), float("inf"), True, None])
def test_a_malformed_claim_is_a_protocol_violation(claim: Any) -> None:
    with pytest.raises(j.PeerFailure) as failure:
        window(TimedPeer(wall_ms=5.0, claim=claim))
    assert failure.value.reason == "protocol_violation"


def test_an_understated_claim_is_too_slow_by_the_workers_clock() -> None:
    """Claims 10 ms, replies at once and does its 200 ms of work when sampled: the upper edge
    counts the sample, and the timed runs stop once the median cannot come inside."""
    peer = TimedPeer(wall_ms=10.5, claim=10.0, sample_ms=200.0)
    reason, detail, measures = window(peer)
    assert reason == "too_slow" and "worker's clock" in detail
    assert measures["judged_upper_ms"] > 110.0 and measures["scaled_ms"] == 10.0
    assert peer.timed("eager") == 6 and peer.timed("compiled") == 0


def test_a_slow_task_is_too_slow_by_its_own_time() -> None:
    reason, detail, _ = window(TimedPeer(wall_ms=105.0, claim=104.0))
    assert reason == "too_slow" and "104" in detail


def test_the_lock_is_released_when_a_claim_breaks_the_protocol() -> None:
    peer = TimedPeer(wall_ms=0.3, claim=2.0)
    with pytest.raises(j.PeerFailure):
        window(peer)
    assert peer.seen[-1][0] == "unlock"


class ManyOutputsPeer(TimedPeer):
    """A forward returning 64 tensors, whose sample costs its process time in proportion to
    the positions asked of each output (the JSON it writes)."""

    def request(self, op: str, **fields: Any) -> tuple[dict[str, Any], float]:
        reply, seconds = super().request(op, **fields)
        if op == "sample":
            seconds = 64 * fields.get("positions", j.SAMPLE_POSITIONS) * 0.9e-6 + 1e-4
        return reply, seconds


@pytest.mark.parametrize("timing_in_verify", [True, False])
def test_the_sample_after_a_timed_run_carries_few_positions(timing_in_verify: bool) -> None:
    """A 3 ms forward is inside the window however many tensors it returns: the sample that
    follows each timed run asks for ``timed_sample_positions`` of each. At the judge's full
    count (the setting runs made before it pin) the request is the one they sent, and its
    JSON takes the same forward past the upper edge."""

    def judged(positions: int) -> tuple[str, set[Any]]:
        peer = ManyOutputsPeer(wall_ms=3.0, claim=2.9)
        settings = {**SETTINGS, verify.TIMED_SAMPLE_POSITIONS: positions}
        decide = verify._timed_window if timing_in_verify else verify._window
        reason = decide(peer, settings, OVERHEAD_S, {})[0]  # type: ignore[arg-type]
        return reason, {f.get("positions") for op, f in peer.seen if op == "sample"}

    assert judged(16) == ("ok", {16})
    assert judged(j.SAMPLE_POSITIONS) == ("too_slow", {None})
