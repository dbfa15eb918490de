"""The filters' judge: re-derive a candidate's decisive facts outside its process.

Runs in the worker (``filters.harness.FILTERS.judge``) after the candidate's own stages
passed, against the same process, which now only answers requests (``filters.serve``). The
candidate's rows are its own account; this stage (``verify``) is the verdict that does not
depend on it: with seeds drawn here and outputs handed over as samples (``filters.judge``),
it rejects outputs that are empty or not finite, inputs changed in place by the forward
(``input_mutated``), outputs that are constant, zeros (``trivial_answer``), different on a
repeat (``nondeterministic``) or under another RNG state (``random``), the same for another
input draw, together or (``filters.every_output_distinct``) any one of them
(``indistinguishable``), input draws of another structure (``filters.stable_inputs``:
``unstable_inputs``), compiled outputs off eager (``compile_mismatch``), and an eager
forward outside the runtime window by this process's clock (``too_fast``/``too_slow``).

What it cannot see: the values a candidate hands over are what its process computed under
this harness. Its timed forwards have no reference to prove them against (the evaluator's
have: ``filters.serve.proof_sum``), so the upper edge of the window is checked on the forward
plus the sample that follows it, which cannot answer before the output is whole: a candidate
that replies to the forward early still pays for the work in the sample. The lower edge is
checked on the forward alone: replying early can only make a candidate look too fast, and time
spent to look slower is real time under the harness. Standard library only.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from opsynth.filters import judge as j
from opsynth.filters.reasons import VERIFY

TIMED_RUNS = 5
PINGS = 7
# The worker's clock measures a forward plus a request's round trip. The fastest ping is taken
# off: every request pays at least that, so a busy host that stalls some pings cannot make an
# honest forward look faster than it ran (a median of stalled pings once did), and a candidate
# that slows its pings gains nothing. A candidate within this share of a window edge passes.
EDGE_TOLERANCE = 0.1
# The job setting that asks verify for the degenerate facts it otherwise takes from the
# candidate's own stage (each input's influence, the output's mean as an answer):
# ``filters.judge_every_degenerate_fact``.
VERIFY_EVERY_DEGENERATE_CHECK = "verify_every_degenerate_check"
# The job setting that moves the runtime window into verify (``filters.timing_in_verify``):
# the eager and compiled forwards are timed here, by the candidate's device events bounded by
# this process's clock (``_timed_window``).
TIMING_IN_VERIFY = "timing_in_verify"
# A forward's own time may exceed the worker's time for its request by no more than this
# (clock granularity): beyond it, the process claims time the forward did not take.
CLAIM_SLACK_MS, CLAIM_SLACK_SHARE = 0.05, 0.01
# The job setting that sets how many positions of each output the sample after a timed run
# carries (``filters.timed_sample_positions``): the sample counts for its time only.
TIMED_SAMPLE_POSITIONS = "timed_sample_positions"
# The job setting that makes an output equal to an input tensor a trivial answer
# (``filters.input_as_answer``).
INPUT_AS_ANSWER = "input_as_answer"
# The job setting that asks every output, not only the outputs together, to move for another
# input draw (``filters.every_output_distinct``); the candidate's own check reads the same key.
EVERY_OUTPUT_DISTINCT = "every_output_distinct"
# The job setting that asks every input draw for the same tensor structure
# (``filters.stable_inputs``); the candidate's own check reads the same key.
STABLE_INPUTS = "stable_inputs"
# Forward RNG states: the candidate's own checks use the same two.
RNG, OTHER_RNG = 2000, 2001


def judge(ctx: j.JudgeContext) -> None:
    ctx.stage(VERIFY)
    try:
        reason, detail, measures = verify(ctx.peer, ctx.settings)
    except j.Refused as refused:
        reason, detail, measures = refused.reason, refused.detail, {}
    ctx.verdict(VERIFY, reason, detail, measures)


def verify(peer: j.Peer, s: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """(reason, detail, measures) of the re-check; reason "ok" when every fact holds."""
    started = time.perf_counter()
    overhead = min(peer.request("ping")[1] for _ in range(PINGS))
    first, second, positions = j.seed(), j.seed(), j.seed()

    def inputs(seed: int) -> list[j.Output]:
        """The drawn inputs' sample (a task without a tensor input is refused here)."""
        return j.parse_sample(peer.request("sample", seed=seed, of="inputs")[0])

    def outputs(which: str = "eager", rng: int = RNG) -> list[j.Output]:
        peer.request("run", which=which, rng=rng)
        return j.parse_sample(peer.request("sample", seed=positions)[0])

    peer.request("draw", seed=first)
    given = inputs(positions)
    base = outputs()
    measures: dict[str, Any] = {"sampled_outputs": len(base), "overhead_ms": overhead * 1e3}
    empty = next((i for i, out in enumerate(base) if out.numel == 0), -1)
    if empty >= 0:
        return "bad_output", f"output {empty} is empty (shape {base[empty].shape})", measures
    bad = j.nonfinite(base)
    if bad >= 0:
        return "nonfinite_output", f"output {bad} holds NaN or Inf", measures
    if j.mismatch(given, inputs(positions), 0.0, 0.0)[0]:
        return "input_mutated", "the forward changed its inputs in place", measures
    distinct = float(s.get("distinct_rtol", 1e-3))
    index, spread, scale = j.constant(base, distinct)
    if index >= 0:
        return (
            "constant_output",
            f"output {index}'s sample spreads {spread:.3g} of {scale:.3g}",
            {
                **measures,
                "output": index,
            },
        )
    atol, rtol = float(s.get("compile_atol", 1e-2)), float(s.get("compile_rtol", 1e-2))
    every_check = bool(s.get(VERIFY_EVERY_DEGENERATE_CHECK))
    for index, out in enumerate(base):
        if not j.mismatch([out], [out.nothing()], atol, rtol)[0]:
            return "trivial_answer", f"zeros pass allclose against output {index}", measures
        mean = j.mean_answer(out, atol, rtol) if every_check else None
        if mean is not None:
            detail = f"the constant {mean:.4g} (its mean) passes allclose against output {index}"
            return "trivial_answer", detail, measures
    if s.get(INPUT_AS_ANSWER):
        handed_back = _input_answer(base, given, inputs, positions, atol, rtol)
        if handed_back is not None:
            detail = "input tensor {1} itself passes allclose against output {0}"
            return "trivial_answer", detail.format(*handed_back), measures
    d_atol = float(s.get("determinism_atol", 1e-6))
    d_rtol = float(s.get("determinism_rtol", 1e-5))
    why, _ = j.mismatch(base, outputs(), d_atol, d_rtol)
    if why:
        return "nondeterministic", f"a repeat with the same RNG state: {why}", measures
    why, _ = j.mismatch(base, outputs(rng=OTHER_RNG), d_atol, d_rtol)
    if why:
        return "random", f"another RNG state: {why}", measures
    peer.request("draw", seed=second)
    others = inputs(positions) if every_check or s.get(STABLE_INPUTS) else []
    if s.get(STABLE_INPUTS):
        why = j.structure_mismatch(given, others, what="input tensor")
        if why:
            return "unstable_inputs", f"another input draw: {why}", measures
    other = outputs()
    moved = j.rel_diff(base, other)
    measures["rel_diff"] = j.finite(moved)
    if moved <= distinct:
        detail = f"another input draw changes the output by {moved:.3g}"
        return "indistinguishable", detail, measures
    if s.get(EVERY_OUTPUT_DISTINCT) and len(base) > 1:
        index, least = j.least_moved(base, other)
        if least <= distinct:
            measures["rel_diff"] = j.finite(least)
            detail = f"another input draw changes output {index} by only {least:.3g}"
            return "indistinguishable", detail, {**measures, "output": index}
    if every_check:
        ignored = _ignored_input(peer, base, given, others, (first, second), outputs, distinct)
        if ignored is not None:
            k, d = ignored
            measures["rel_diff"] = j.finite(d)
            detail = f"changing input tensor {k} changes the output by only {d:.3g} (relative)"
            return "input_ignored", detail, measures
    peer.request("draw", seed=first)
    why, worst = j.mismatch(base, outputs("compiled"), atol, rtol)
    if why:
        measures["diff"] = j.finite(worst)
        return "compile_mismatch", f"compiled against eager: {why}", measures
    # where a candidate's verify time goes, by this process's clock: the checks before the
    # timed runs, the wait for the GPU to itself (other workers' timers), the timed runs
    measures["checks_s"] = round(time.perf_counter() - started, 4)
    measures["requests_s"] = {op: round(spent, 4) for op, spent in sorted(peer.spent.items())}
    if s.get(TIMING_IN_VERIFY):
        return _timed_window(peer, s, overhead, measures)
    return _window(peer, s, overhead, measures)


def _input_answer(
    base: list[j.Output],
    given: list[j.Output],
    inputs: Callable[[int], list[j.Output]],
    positions: int,
    atol: float,
    rtol: float,
) -> tuple[int, int] | None:
    """(k, i) of the first output ``k`` that input tensor ``i`` of its dtype and shape passes
    allclose against, else None. A sample of output ``k`` is drawn from seed ``positions + k``
    and one of input ``i`` from ``positions + i`` (``filters.serve``): the inputs are sampled
    again from ``positions + k - i``, so both sample the same positions with the same
    weights. That sample is asked for only where the two tensors' norms allow a match
    (``judge.norms_apart``): inputs are the largest tensors a task has, and most outputs of
    an input's shape are far from it."""
    for k, out in enumerate(base):
        for i, x in enumerate(given):
            if not j.norms_apart(out, x, atol, rtol):
                aligned = inputs(positions + k - i)[i]
                if not j.mismatch([out], [aligned], atol, rtol)[0]:
                    return k, i
    return None


def _ignored_input(
    peer: j.Peer,
    base: list[j.Output],
    given: list[j.Output],
    others: list[j.Output],
    draws: tuple[int, int],
    outputs: Callable[[], list[j.Output]],
    distinct: float,
) -> tuple[int, float] | None:
    """(k, relative change) of the first input tensor whose replacement by its value in the
    second of ``draws`` leaves the first draw's output (``base``, its inputs' sample
    ``given``; ``others``, the second's) within ``distinct``, else None. Inputs
    both draws give alike (a fixed index tensor, a shape change) cannot be varied without
    knowing their meaning, and are left alone, as the candidate's own check leaves them."""
    first, second = draws
    for k, (mine, theirs) in enumerate(zip(given, others, strict=False)):
        if j.structure_mismatch([mine], [theirs]) or not j.mismatch([mine], [theirs], 0.0, 0.0)[0]:
            continue
        peer.request("draw", seed=first, replace={"seed": second, "input": k})
        d = j.rel_diff(base, outputs())
        if d <= distinct:
            return k, d
    return None


def _timed_sample(peer: j.Peer, s: dict[str, Any]) -> float:
    """The seconds of the sample that follows a timed run, which cannot answer before the
    output is whole (its checksums read every element). Its values are compared with nothing,
    so it carries ``timed_sample_positions`` of each output: at the judge's full count, a
    forward returning many tensors was charged their samples' JSON, enough to pass the upper
    edge."""
    positions = int(s.get(TIMED_SAMPLE_POSITIONS, j.SAMPLE_POSITIONS))
    extra = {"positions": positions} if positions < j.SAMPLE_POSITIONS else {}
    return peer.request("sample", seed=j.seed(), **extra)[1]


def _window(
    peer: j.Peer, s: dict[str, Any], overhead: float, measures: dict[str, Any]
) -> tuple[str, str, dict[str, Any]]:
    lo, hi = (float(x) for x in s.get("window_ms", (0.0, float("inf"))))
    factor = float(s.get("speed_factor", 1.0))
    peer.request("run", which="eager")  # warm after the compiled run
    runs, cycles = [], []
    measures["lock_wait_s"] = round(peer.request("lock")[1], 4)
    timed_from = time.perf_counter()
    try:
        for _ in range(TIMED_RUNS):
            peer.request("flush")
            ran = peer.request("run", which="eager")[1]
            sampled = _timed_sample(peer, s)
            runs.append(ran)
            cycles.append(ran + sampled)
    finally:
        peer.request("unlock")
    measures["timed_s"] = round(time.perf_counter() - timed_from, 4)
    # The forward's request alone for the lower edge; with the sample that follows it (which
    # cannot answer before the output is whole) for the upper one, so work deferred past the
    # forward's reply still counts against too_slow.
    ms = _by_clock(runs, overhead, factor)
    upper = _by_clock(cycles, overhead, factor)
    measures.update(judged_ms=round(ms, 6), judged_upper_ms=round(upper, 6), judged_runs=len(runs))
    if ms < lo * (1 - EDGE_TOLERANCE):
        return "too_fast", f"{ms:.4g} ms by the worker's clock < {lo} ms", measures
    return (*_upper_edge(upper, hi), measures)


def _by_clock(seconds: list[float], overhead: float, factor: float) -> float:
    """The median of requests timed by this process's clock, less the fastest ping, in
    scaled milliseconds."""
    return max(0.0, statistics.median(seconds) - overhead) * 1e3 * factor


def _upper_edge(upper: float, hi: float) -> tuple[str, str]:
    """(``too_slow``, why) when the worker's reading with the sample (``upper``, scaled ms) is
    beyond the window's upper edge and ``EDGE_TOLERANCE``, else (``ok``, "")."""
    if upper > hi * (1 + EDGE_TOLERANCE):
        return (
            "too_slow",
            f"{upper:.4g} ms by the worker's clock (with its output's sample) > {hi} ms",
        )
    return "ok", ""


def _timed_window(
    peer: j.Peer, s: dict[str, Any], overhead: float, measures: dict[str, Any]
) -> tuple[str, str, dict[str, Any]]:
    """The runtime window, decided here (``filters.timing_in_verify``): warm-up runs, then in
    one section holding the GPU alone the eager forward's ``timed_runs`` (each after an L2
    flush and followed by a sample, as in ``_window``) and, when eager is inside the window,
    the compiled forward's, for the speedup measure.

    The window applies to the forward's own time, by the candidate process's CUDA events (its
    wall clock on CPU), accepted only up to this process's time for the same request: a larger
    claim is a ``protocol_violation``. So a candidate can look slower than it is by at most its
    request's round trip (the residual trust at the lower edge), and a claim smaller than the
    truth is bounded by this process's clock, with the sample that follows each forward
    (``judged_upper_ms``) and ``EDGE_TOLERANCE``, as in ``_window``."""
    lo, hi = (float(x) for x in s.get("window_ms", (0.0, float("inf"))))
    factor = float(s.get("speed_factor", 1.0))
    planned = max(1, int(s.get("timed_runs", 10)))
    warmup = max(0, int(s.get("warmup_runs", 3)))
    slow_s = hi * (1 + EDGE_TOLERANCE) / factor / 1e3 + overhead
    for which in ("compiled", "eager"):  # eager last: it is timed first
        for _ in range(max(1, warmup)):
            peer.request("run", which=which)
    runs: list[float] = []
    cycles: list[float] = []
    claims: dict[str, list[float]] = {"eager": [], "compiled": []}
    measures["lock_wait_s"] = round(peer.request("lock")[1], 4)
    timed_from = time.perf_counter()
    try:
        for _ in range(planned):
            ran, claimed = _timed_run(peer, "eager")
            cycles.append(ran + _timed_sample(peer, s))
            runs.append(ran)
            claims["eager"].append(claimed)
            if sum(c > slow_s for c in cycles) > planned // 2:
                break  # the median can no longer come inside the window
        eager_ms = statistics.median(claims["eager"]) * factor
        judged_upper = _by_clock(cycles, overhead, factor)
        inside = lo <= eager_ms <= hi and _upper_edge(judged_upper, hi)[0] == "ok"
        for _ in range(planned if inside else 0):
            claims["compiled"].append(_timed_run(peer, "compiled")[1])
    finally:
        peer.request("unlock")
    measures["timed_s"] = round(time.perf_counter() - timed_from, 4)
    ms = _by_clock(runs, overhead, factor)
    eager = claims["eager"]
    measures.update(
        judged_ms=round(ms, 6),
        judged_upper_ms=round(judged_upper, 6),
        judged_runs=len(runs),
        eager_ms_median=round(statistics.median(eager), 6),
        eager_ms_min=round(min(eager), 6),
        timed_runs=len(eager),
        speed_factor=factor,
        scaled_ms=round(eager_ms, 6),
        window_ms=[lo, hi],
    )
    compiled = claims["compiled"]
    if compiled:
        median = statistics.median(compiled)
        measures.update(
            compiled_ms_median=round(median, 6),
            compiled_ms_min=round(min(compiled), 6),
            speedup=round(statistics.median(eager) / median, 4) if median > 0 else None,
        )
    if eager_ms < lo:
        return "too_fast", f"eager median {eager_ms:.4g} ms < {lo} ms", measures
    if eager_ms > hi:
        return "too_slow", f"eager median {eager_ms:.4g} ms > {hi} ms", measures
    return (*_upper_edge(judged_upper, hi), measures)


def _timed_run(peer: j.Peer, which: str) -> tuple[float, float]:
    """One timed forward after an L2 flush: (seconds by this process's clock, the forward's
    milliseconds by the candidate's), the claim checked against the clock."""
    peer.request("flush")
    reply, ran = peer.request("run", which=which, time=True)
    claimed = j.parse_ms(reply)
    if claimed > ran * 1e3 * (1 + CLAIM_SLACK_SHARE) + CLAIM_SLACK_MS:
        raise j.PeerFailure(
            "protocol_violation",
            f"run: a {which} forward claims {claimed:.4g} ms of a {ran * 1e3:.4g} ms request",
        )
    return ran, claimed
