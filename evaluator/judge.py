"""The evaluator's judge: correctness, timing and the numbers behind the reward, decided in the
worker, outside every process that runs task or solution code.

Per (task, solution) pair (``evaluator.runner`` serves the other side):

1. The **reference** process (the task only) is given every seed up front: for each
   correctness trial and each timed call, the inputs drawn from its seed, eager's output
   sample at positions from a second seed, and the eager and ``torch.compile`` timings.
   It is told to end before the solution's process starts.
2. The **solution** process gets one seed at a time, each only when its call comes. Every
   correctness trial and every timed call is checked: its sample must pass allclose at
   ``atol``/``rtol`` at the sampled positions and in the checksum (``filters.judge.mismatch``),
   so a call whose work was skipped, replayed or memoised fails unless its output happens to
   lie within tolerance of the right one everywhere the sample looks. Inputs must come back
   untouched, and a repeat on the same inputs must agree.
   On the GPU one more forward runs under the profiler, in the solution's process, and the
   names of the kernels it launched come back (``evaluator.kernels``): in strict mode a
   kernel of ATen's own compute (reached through ``at::`` calls in the extension, which the
   Python-level guard cannot see) refuses the solution (``aten_compute``). The trace is the
   solution process's report, so a solution that forges it is not caught here: it catches
   the fallbacks that do not hide.
3. **Timing** is by this process's clock: each timed call is four requests (draw, L2 flush,
   forward, sample), and its time is the forward's request. That request's reply carries a
   weighted sum of every output element with weights from a seed sent with it
   (``filters.serve.proof_sum``), checked against the reference's for the same inputs and
   seed (``unfinished_forward``), so the reply cannot come before the output is whole and
   work deferred into the sample is caught. Work moved ahead into the draw or the flush is
   counted: whatever those two took beyond the reference's median of them is added. The
   sample request is not timed: its cost (serialising thousands of values) is large and
   varies between processes far more than a forward does. A patched timer in the child
   measures nothing that counts. The residual: the forward's request carries a pipe round
   trip and the proof's weighted sum, the same for all three timings, which slightly
   compresses the speedups of sub-millisecond calls.

Standard library only (``filters.judge``): this runs in the worker.
"""

from __future__ import annotations

import statistics
from typing import Any, NamedTuple

from opsynth.evaluator.kernels import parse_kernels, torch_compute
from opsynth.filters import judge as j

BUILD, CORRECTNESS, TIMING = "build", "correctness", "timing"


class Call(NamedTuple):
    """One timed call's requests, each timed by the worker's clock (seconds)."""

    draw: float
    flush: float
    run: float
    sample: float

    @property
    def preparation(self) -> float:
        return self.draw + self.flush


REPEAT_TOLERANCE = 1e-5


def judge(ctx: j.JudgeContext) -> None:
    s = ctx.settings
    timed = s.get("device", "cpu") == "cuda" or bool(s.get("time_on_cpu", False))
    trials = [(j.seed(), j.seed()) for _ in range(int(s.get("trials", 5)))]
    runs = int(s.get("timed_runs", 50)) if timed else 0
    calls = [(j.seed(), j.seed(), j.seed()) for _ in range(runs)]
    warmup = [j.seed() for _ in range(int(s.get("warmup_runs", 5)))] if timed else []
    try:
        reference = _reference(ctx.peer, trials, calls, warmup)
    except (j.Refused, j.PeerFailure) as failed:
        ctx.stage(BUILD)
        ctx.verdict(BUILD, "filter_error", f"the task's reference failed: {failed.detail}")
        return
    ctx.end(ctx.peer)
    solution = ctx.spawn(role="solution")
    atol, rtol = float(s.get("atol", 1e-2)), float(s.get("rtol", 1e-2))
    strict = bool(s.get("strict", True))
    for stage, check in (
        (BUILD, lambda: solution.request("load")[0]),
        (CORRECTNESS, lambda: _correctness(solution, reference, trials, atol, rtol, strict)),
        (TIMING, lambda: _timing(solution, reference, calls, warmup, atol, rtol, timed)),
    ):
        ctx.stage(stage)
        try:
            measures = check()
        except j.Refused as refused:
            ctx.verdict(stage, refused.reason, refused.detail)
            return
        except Failed as failed:
            ctx.verdict(stage, failed.reason, failed.detail, failed.measures)
            return
        if not ctx.verdict(stage, "ok", "", measures):
            return


class Failed(Exception):
    def __init__(self, reason: str, detail: str, **measures: Any) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail, self.measures = reason, detail, measures


class Reference:
    """What the reference handed over: per trial its inputs' and eager output's samples, per
    timed call eager's sample and proofs, and eager's and compile's request times."""

    def __init__(self) -> None:
        self.inputs: list[list[j.Output]] = []
        self.trials: list[list[j.Output]] = []
        self.calls: list[list[j.Output]] = []
        self.proofs: list[list[float]] = []
        self.eager: list[Call] = []
        self.compiled: list[Call] = []
        self.preparation = 0.0
        self.compile_s = 0.0


def _reference(
    peer: j.Peer,
    trials: list[tuple[int, int]],
    calls: list[tuple[int, int, int]],
    warmup: list[int],
) -> Reference:
    ref = Reference()
    peer.request("load")
    for draw, positions in trials:
        peer.request("draw", seed=draw)
        ref.inputs.append(j.parse_sample(peer.request("sample", seed=positions, of="inputs")[0]))
        peer.request("run", which="eager")
        ref.trials.append(j.parse_sample(peer.request("sample", seed=positions)[0]))
    if not calls:
        return ref
    _warm(peer, "eager", warmup)
    ref.eager, ref.calls, ref.proofs = _cycles(peer, "eager", calls)
    ref.preparation = statistics.median(call.preparation for call in ref.eager)
    peer.request("draw", seed=calls[0][0])
    ref.compile_s = float(peer.request("compile")[0].get("compile_s", 0.0))
    _warm(peer, "compiled", warmup)
    ref.compiled = _cycles(peer, "compiled", calls)[0]
    return ref


def _warm(peer: j.Peer, which: str, seeds: list[int]) -> None:
    for seed in seeds:
        peer.request("draw", seed=seed)
        peer.request("run", which=which)


def _cycles(
    peer: j.Peer, which: str, calls: list[tuple[int, int, int]]
) -> tuple[list[Call], list[list[j.Output]], list[list[float]]]:
    """The timed calls, the GPU held: per call its requests' times (draw, L2 flush, forward,
    sample), its output's sample and the proofs its forward's reply carried. Nothing is
    checked between calls, so the reference's calls and a solution's follow each other alike."""
    cycles: list[Call] = []
    samples: list[list[j.Output]] = []
    proofs: list[list[float]] = []
    peer.request("lock")
    try:
        for draw, positions, proof in calls:
            drawn = peer.request("draw", seed=draw)[1]
            flushed = peer.request("flush")[1]
            reply, ran = peer.request("run", which=which, proof=proof)
            sample, sampled = peer.request("sample", seed=positions)
            cycles.append(Call(drawn, flushed, ran, sampled))
            proofs.append(j.parse_proof(reply))
            samples.append(j.parse_sample(sample))
    finally:
        peer.request("unlock")
    return cycles, samples, proofs


def _correctness(
    peer: j.Peer,
    ref: Reference,
    trials: list[tuple[int, int]],
    atol: float,
    rtol: float,
    strict: bool,
) -> dict[str, Any]:
    worst = 0.0
    for n, (draw, positions) in enumerate(trials):
        peer.request("draw", seed=draw)
        peer.request("run", which="new")
        got = j.parse_sample(peer.request("sample", seed=positions)[0])
        why, diff = j.mismatch(ref.trials[n], got, atol, rtol)
        if why:
            raise Failed("incorrect", f"trial {n}: {why}", max_abs_diff=j.finite(diff))
        worst = max(worst, diff)
        after = j.parse_sample(peer.request("sample", seed=positions, of="inputs")[0])
        if j.mismatch(ref.inputs[n], after, 0.0, 0.0)[0]:
            raise Failed("input_mutated", f"trial {n}: ModelNew changed its inputs")
        peer.request("run", which="new")
        again = j.parse_sample(peer.request("sample", seed=positions)[0])
        why, _ = j.mismatch(got, again, REPEAT_TOLERANCE, REPEAT_TOLERANCE)
        if why:
            raise Failed("unstable_output", f"trial {n}, two runs on the same inputs: {why}")
    guard = peer.request("guard")[0]
    traced = parse_kernels(peer.request("kernels")[0])
    if traced is None:
        raise j.PeerFailure("protocol_violation", "kernels: not a short list of short names")
    aten = torch_compute(traced)
    if aten and strict:
        raise Failed("aten_compute", f"{len(aten)} ATen kernels, first {aten[0][:300]}")
    return {
        "trials": len(trials),
        "max_abs_diff": worst,
        "functional_calls": _count(guard.get("functional_calls")),
        "torch_compute_calls": _count(guard.get("torch_compute_calls")),
        "traced_kernels": len(traced),
        "aten_kernels": len(aten),
        "aten_kernel_names": [name[:300] for name in aten[:5]],
        "judged": True,
    }


def _timing(
    peer: j.Peer,
    ref: Reference,
    calls: list[tuple[int, int, int]],
    warmup: list[int],
    atol: float,
    rtol: float,
    timed: bool,
) -> dict[str, Any]:
    if not timed:
        return {"timed": False}
    _warm(peer, "new_timed", warmup)
    solution, samples, proofs = _cycles(peer, "new_timed", calls)
    for i, (expected, got) in enumerate(zip(ref.calls, samples, strict=True)):
        why, _ = j.mismatch(expected, got, atol, rtol)
        if why:
            raise Failed("replayed_output", f"timed call {i}: {why}", call=i)
        why = j.proof_mismatch(expected, proofs[i], ref.proofs[i], atol, rtol)
        if why:
            raise Failed("unfinished_forward", f"timed call {i}: {why}", call=i)
    return {
        "timed": True,
        "eager_ms": _ms(ref.eager, ref.preparation),
        "compile_ms": _ms(ref.compiled, ref.preparation),
        "solution_ms": _ms(solution, ref.preparation),
        "compile_s": ref.compile_s,
        "timed_runs": len(calls),
        "preparation_ms": round(ref.preparation * 1e3, 6),
        # medians of each request of a timed call: draw, L2 flush, forward, sample
        "eager_parts_ms": _parts(ref.eager),
        "solution_parts_ms": _parts(solution),
        "checked_calls": len(calls),
    }


def _ms(cycles: list[Call], preparation: float) -> float:
    """Median ms of the calls: each forward's request (its reply proves the output whole),
    plus whatever its draw and L2 flush took beyond ``preparation`` (the reference's median of
    them), so no work moved into them goes uncounted."""
    times = [call.run + max(0.0, call.preparation - preparation) for call in cycles]
    return round(max(statistics.median(times), 1e-6) * 1e3, 6)


def _parts(cycles: list[Call]) -> list[float]:
    return [round(statistics.median(part) * 1e3, 4) for part in zip(*cycles, strict=True)]


def _count(value: Any) -> int:
    return value if type(value) is int and value >= 0 else 0
