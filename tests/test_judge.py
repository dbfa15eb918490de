"""The judge: verdicts and rewards decided outside the candidate's or solution's process.

Pure parts first (samples, comparisons, the request channel against a scripted peer), then
one sandboxed pool for solutions and a task that patch everything in their own process and
still score -1 or get rejected, with honest controls beside them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import threading
from typing import Any

import pytest
import torch
from evaluator_cases import TASK, model_new, task

from opsynth.config import EvalConfig
from opsynth.evaluator.score import Job, harness_settings, score_of
from opsynth.evaluator.solution import Solution
from opsynth.filters import fused_sums
from opsynth.filters import judge as j
from opsynth.filters.harness import FILTERS
from opsynth.filters.samples import task_source
from opsynth.filters.serve import (
    CHUNK,
    Refusal,
    Runner,
    fused_sums_of,
    proof_sum,
    sample_tensor,
    torch_sums,
)
from opsynth.filters.verify import TIMING_IN_VERIFY
from opsynth.record import Task


def sample(t: torch.Tensor, seed: int = 7, k: int = j.SAMPLE_POSITIONS) -> list[j.Output]:
    return j.parse_sample({"outputs": [sample_tensor(t, seed, k)]}, k)


# ------------------------------------------------------------------------------ samples


def test_an_output_computed_only_where_sampled_fails_the_checksums() -> None:
    torch.manual_seed(0)
    right = torch.randn(1 << 16)
    honest = sample(right, k=64)
    lazy = [dataclasses.replace(honest[0], checksums=(0.0,) * j.CHECKSUMS)]
    assert "checksum" in j.mismatch(honest, lazy, 1e-2, 1e-2)[0]
    half = right.clone()
    half[: 1 << 15] = 0.0  # half the work skipped
    assert j.mismatch(honest, sample(half, k=64), 1e-2, 1e-2)[0]


def test_noise_within_tolerance_everywhere_passes() -> None:
    torch.manual_seed(0)
    right = torch.randn(1 << 16)
    noisy = right + (torch.rand_like(right) - 0.5) * 2e-2  # |diff| <= 1e-2 = atol
    assert torch.allclose(noisy, right, atol=1e-2, rtol=1e-2)
    assert j.mismatch(sample(right), sample(noisy), 1e-2, 1e-2)[0] == ""


def test_a_replayed_output_fails_for_fresh_inputs() -> None:
    torch.manual_seed(0)
    first, second = torch.randn(256, 256), torch.randn(256, 256)
    assert j.mismatch(sample(second), sample(first), 1e-2, 1e-2)[0]


def test_a_forward_proves_its_output_whole_within_the_tolerance() -> None:
    torch.manual_seed(0)
    right = torch.randn(1 << 16)
    expected = sample(right)
    want = proof_sum(right, 11)
    noisy = right + (torch.rand_like(right) - 0.5) * 2e-2  # allclose at 1e-2 everywhere
    assert j.proof_mismatch(expected, [proof_sum(noisy, 11)], [want], 1e-2, 1e-2) == ""
    for lazy in (torch.zeros_like(right), torch.cat([right[: 1 << 15], right[: 1 << 15] * 0])):
        assert "proof" in j.proof_mismatch(expected, [proof_sum(lazy, 11)], [want], 1e-2, 1e-2)
    assert "2 proofs" in j.proof_mismatch(expected, [want, want], [want], 1e-2, 1e-2)
    assert proof_sum(right, 11) == want and proof_sum(right, 12) != want


@pytest.mark.parametrize("proof", [None, [], ["1.0"], [1.0] * (j.MAX_OUTPUTS + 1), "1.0"])
def test_a_malformed_proof_is_a_protocol_violation(proof: Any) -> None:
    with pytest.raises(j.PeerFailure) as failed:
        j.parse_proof({"proof": proof})
    assert failed.value.reason == "protocol_violation"


def test_small_outputs_are_compared_whole_and_structure_first() -> None:
    small = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    [out] = sample(small)
    assert out.values == (0.0, 1.0, 2.0, 3.0, 4.0, 5.0)
    assert "expected float32[2, 3]" in j.mismatch(sample(small), sample(small.T), 0, 0)[0]
    assert j.constant(sample(torch.zeros(4, 4)), 1e-3)[0] == 0
    assert j.nonfinite(sample(torch.tensor([1.0, float("nan")]))) == 0


def test_a_sparse_output_is_not_constant_though_its_sample_is() -> None:
    """A mask with a hundred True among four million samples as all False; the whole
    tensor's magnitudes say it varies, as the candidate's full check (min < max) does."""
    mask = torch.zeros(512, 32, 256, dtype=torch.bool)
    mask.view(-1)[
        torch.randperm(mask.numel(), generator=torch.Generator().manual_seed(1))[:100]
    ] = True
    [out] = sample(mask)
    assert not any(out.values)  # what the sample alone shows
    assert j.constant([out], 1e-3)[0] == -1
    assert j.constant(sample(torch.full((512, 4096), 3.0)), 1e-3)[0] == 0
    assert j.constant(sample(torch.zeros(512, 4096)), 1e-3)[0] == 0
    spread = 3.0 + 1e-4 * torch.rand(512, 4096, generator=torch.Generator().manual_seed(2))
    assert j.constant(sample(spread), 1e-3)[0] == 0  # within rtol of each other: constant


def test_the_output_that_moved_least_is_found_where_its_sample_shows_no_change() -> None:
    """``least_moved`` names a constant scalar beside an output that moves, and counts a
    change a sparse output's sampled positions miss (its checksums move): an output is
    indistinguishable only where neither its sample nor its sums moved."""
    generator = torch.Generator().manual_seed(3)
    x, y = (torch.randn(256, 256, generator=generator) for _ in range(2))
    scalar = torch.tensor([3.5])
    assert j.least_moved(sample(x) + sample(scalar), sample(y) + sample(scalar)) == (1, 0.0)
    assert j.least_moved(sample(x) + sample(scalar), sample(y) + sample(scalar * 2))[1] > 0.1
    sparse = torch.zeros(512, 32, 256)
    moved = sparse.clone()
    moved.view(-1)[
        torch.randperm(moved.numel(), generator=torch.Generator().manual_seed(1))[:100]
    ] = 1.0
    [a], [b] = sample(sparse), sample(moved)
    assert a.values == b.values  # the sample alone shows no change
    assert j.least_moved([a], [b])[1] > 1e-3
    assert j.least_moved([a], sample(torch.zeros(4)))[1] == math.inf  # another shape


def test_the_mean_answers_an_output_only_where_allclose_holds_everywhere() -> None:
    """``mean_answer`` agrees with the candidate's own ``trivial_answer`` (the output's mean
    passes allclose): on a near-constant output, not on a varying one, and not on one whose
    few outliers (a fixed 0.02% of elements, which a 2,048-position sample mostly misses) are
    beyond the tolerance, which the magnitudes over every element show."""
    gen = torch.Generator().manual_seed(3)
    near = 5.0 + 1e-3 * torch.randn(1 << 20, generator=gen)
    assert j.mean_answer(sample(near)[0], 1e-2, 1e-2) == pytest.approx(5.0, abs=1e-3)
    assert j.mean_answer(sample(-near)[0], 1e-2, 1e-2) == pytest.approx(-5.0, abs=1e-3)
    assert j.mean_answer(sample(torch.randn(1 << 20, generator=gen))[0], 1e-2, 1e-2) is None
    spiked = near.clone()
    spiked[torch.randperm(spiked.numel(), generator=gen)[:200]] = 50.0
    missed = next(o for k in range(50) for o in sample(spiked, seed=k) if max(o.values) < 6.0)
    assert j.mean_answer(missed, 1e-2, 1e-2) is None
    assert j.mean_answer(sample(torch.tensor([5.0]))[0], 1e-2, 1e-2) is None  # one element


@pytest.mark.parametrize(
    "change",
    [
        lambda o: {**o, "values": o["values"][:-1]},
        lambda o: {**o, "values": [True] * len(o["values"])},
        lambda o: {**o, "dtype": "object"},
        lambda o: {**o, "shape": [-1, 4]},
        lambda o: {**o, "checksums": ["0"] * j.CHECKSUMS},
        lambda o: [o],
        lambda o: {**o, "abs_sum": 10**400},
        lambda o: {**o, "values": [10**400] * len(o["values"])},
    ],
    ids=["short", "bools", "dtype", "shape", "checksum_text", "nested", "huge_sum", "huge_values"],
)
def test_a_malformed_sample_is_a_protocol_violation(change: Any) -> None:
    raw = sample_tensor(torch.randn(4, 4), 1)
    with pytest.raises(j.PeerFailure) as failure:
        j.parse_sample({"outputs": [change(raw)]})
    assert failure.value.reason == "protocol_violation"


def test_numbers_no_float_holds_are_violations_not_errors() -> None:
    """A forged claim is the child's ``protocol_violation``; an exception here would be the
    judge's own ``filter_error``."""
    for ms in (10**400, -1, math.nan, "1.0", True):
        with pytest.raises(j.PeerFailure) as failure:
            j.parse_ms({"ms": ms})
        assert failure.value.reason == "protocol_violation"
    with pytest.raises(j.PeerFailure):
        j.parse_proof({"proof": [10**400]})
    raw = sample_tensor(torch.ones(64), 1)
    tiny = j.parse_sample({"outputs": [{**raw, "abs_sum": 1e-200, "square_sum": 64.0}]})
    assert j.constant(tiny, 1e-3)[0] == 0  # its square underflows: no division by zero


# ------------------------------------------------------------------------------ the channel


class Scripted:
    """A peer that answers each request with the next scripted bytes (or closes)."""

    def __init__(self, answers: list[bytes | None]) -> None:
        self.requests_r, self.requests_w = os.pipe()
        self.replies_r, self.replies_w = os.pipe()
        self.seen: list[dict[str, Any]] = []
        self.reader = os.fdopen(self.requests_r, "rb")  # open while the test runs
        self.thread = threading.Thread(target=self.serve, args=(answers,), daemon=True)
        self.thread.start()

    def serve(self, answers: list[bytes | None]) -> None:
        for answer in answers:
            self.seen.append(json.loads(self.reader.readline()))
            if answer is None:
                os.close(self.replies_w)
                return
            os.write(self.replies_w, answer)

    def peer(self, tick: Any = lambda: None) -> j.Peer:
        import time

        return j.Peer(self.requests_w, self.replies_r, deadline=time.monotonic() + 5, tick=tick)


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (b"not json\n", "protocol_violation"),
        (b'{"re": "draw"}\n', "protocol_violation"),
        (b'["ping"]\n', "protocol_violation"),
        (b'{"re": "ping", "error": 3}\n', "protocol_violation"),
        (b'{"re": "ping", "error": "ok", "detail": ""}\n', "protocol_violation"),
        (b'{"re": "ping", "error": "worker_lost", "detail": ""}\n', "protocol_violation"),
        (b"x" * (j.MAX_REPLY_BYTES + 10), "protocol_violation"),
        (None, "exited"),
    ],
    ids=[
        "not_json",
        "other_request",
        "not_object",
        "bad_error",
        "ok_error",
        "runner_code_error",
        "oversized",
        "closed",
    ],
)
def test_a_bad_reply_ends_the_conversation_with_a_reason(answer: Any, reason: str) -> None:
    script = Scripted([answer])
    with pytest.raises(j.PeerFailure) as failure:
        script.peer().request("ping")
    assert failure.value.reason == reason


def test_replies_are_matched_to_requests_and_timed_here() -> None:
    script = Scripted([b'{"re": "ping"}\n', b'{"re": "run", "error": "oom", "detail": "x"}\n'])
    peer = script.peer()
    reply, seconds = peer.request("ping")
    assert reply == {"re": "ping"} and 0 <= seconds < 5
    with pytest.raises(j.Refused) as refused:
        peer.request("run", which="eager")
    assert (refused.value.reason, script.seen[1]) == ("oom", {"op": "run", "which": "eager"})


# Refusal codes: the ones a child's own classification gives, then ones it cannot give.
CODES = (
    "forward_error",
    "oom",
    "resource_limit",
    "cuda_error",
    "exited",
    "timeout",
    "filter_error",
    "no_such_code",
)


def test_a_refusal_carries_only_a_code_the_child_can_observe_of_its_harness() -> None:
    """The failures a child's own classification gives (``filters.failures.classify``) are
    refusals; the runner's own codes and codes outside the harness's rows are violations."""
    import time

    from opsynth.filters import reasons
    from opsynth.filters.harness import FILTERS

    assert set(reasons.INFRA) >= j.RUNNER_ONLY
    answers = [b'{"re": "run", "error": "%s", "detail": ""}\n' % c.encode() for c in CODES]
    script = Scripted(answers)
    peer = j.Peer(
        script.requests_w,
        script.replies_r,
        deadline=time.monotonic() + 5,
        tick=lambda: None,
        known=FILTERS.known,
    )
    outcomes = {}
    for code in CODES:
        try:
            peer.request("run")
        except j.Refused as refused:
            outcomes[code] = refused.reason
        except j.PeerFailure as failure:
            outcomes[code] = failure.reason
    assert outcomes == {
        "forward_error": "forward_error",
        "oom": "oom",
        "resource_limit": "resource_limit",
        "cuda_error": "cuda_error",
        "exited": "exited",
        "timeout": "protocol_violation",
        "filter_error": "protocol_violation",
        "no_such_code": "protocol_violation",
    }


def test_the_watchdog_ends_a_silent_peer() -> None:
    script = Scripted([])
    peer = script.peer(tick=lambda: ("resource_limit", "too much memory"))
    with pytest.raises(j.PeerFailure) as failure:
        peer.request("ping")
    assert not script.seen
    assert failure.value.reason == "resource_limit"


def test_the_largest_honest_sample_fits_the_reply_bound_and_more_outputs_are_refused() -> None:
    """``MAX_OUTPUTS`` outputs, every sampled value as long as JSON writes a float, reach the
    worker whole; one output more is the task's ``too_many_outputs``, not a reply the worker
    cuts off as a protocol violation."""
    worst = torch.full((2 * j.SAMPLE_POSITIONS,), -2.2250738585072014e-308, dtype=torch.float64)
    runner = Runner(torch.device("cpu"), lambda seed: [], {})
    runner.outputs = [worst] * j.MAX_OUTPUTS
    line = (json.dumps({"re": "sample", **runner.sample({"seed": 1})}) + "\n").encode()
    assert len(line) <= j.MAX_REPLY_BYTES
    reply, _ = Scripted([line]).peer().request("sample", seed=1)
    assert len(j.parse_sample(reply)) == j.MAX_OUTPUTS
    runner.outputs = [worst] * (j.MAX_OUTPUTS + 1)
    with pytest.raises(Refusal) as refused:
        runner.sample({"seed": 1})
    assert refused.value.reason == "too_many_outputs"


def test_a_sample_carries_as_many_positions_as_the_worker_asks_for() -> None:
    runner = Runner(torch.device("cpu"), lambda seed: [], {})
    runner.outputs = [torch.randn(10_000), torch.randn(3)]
    few = j.parse_sample(runner.sample({"seed": 5, "positions": 16}), 16)
    assert [len(out.values) for out in few] == [16, 3]
    full = j.parse_sample(runner.sample({"seed": 5}))
    assert [len(out.values) for out in full] == [j.SAMPLE_POSITIONS, 3]
    beyond = j.parse_sample(runner.sample({"seed": 5, "positions": 10**6}))
    assert len(beyond[0].values) == j.SAMPLE_POSITIONS  # never more than the judge parses


def test_seeds_are_unpredictable() -> None:
    assert len({j.seed() for _ in range(1000)}) == 1000


# ------------------------------------------------------------------------------ sandboxed

PATCH_EVERYTHING = """
import sys
from opsynth.filters import judge as _judge
from opsynth.evaluator import harness as _harness
torch.allclose = lambda *a, **k: True
torch.equal = lambda *a, **k: True
_harness._compare = lambda *a, **k: 0.0
_judge.mismatch = lambda *a, **k: ('', 0.0)
"""
FORGE = """
import json, os
rows = [{'stage': s, 'passed': True, 'reason': 'ok', 'detail': '', 'measures': m}
        for s, m in (('build', {}), ('correctness', {}),
                     ('timing', {'timed': True, 'eager_ms': 9.0, 'compile_ms': 9.0,
                                 'solution_ms': 0.001}))]
lines = [{'event': 'verdict', 'verdict': row} for row in rows] + [{'event': 'done'}]
for fd in range(3, 256):
    try:
        os.write(fd, ''.join(json.dumps(x) + '\\n' for x in lines).encode())
    except OSError:
        pass
"""
# Replies to each timed forward at once with a made-up proof and runs the forward when the
# sample comes: the forward's request looks instant, the sample pays for it.
DEFER = """
import gc
def _defer():
    for obj in gc.get_objects():
        owner = getattr(obj.get('run'), '__self__', None) if isinstance(obj, dict) else None
        if type(owner).__name__ == 'Runner' and {'sample', 'ping', 'lock'} <= set(obj):
            real_run, real_sample, pending = obj['run'], obj['sample'], []
            def run(request):
                if request.get('proof') is None:
                    return real_run(request)
                pending.append(dict(request, proof=None))
                return {'proof': [0.0]}
            def sample(request):
                while pending:
                    real_run(pending.pop())
                return real_sample(request)
            obj['run'], obj['sample'] = run, sample
            return
_defer()
"""
# Answers the judge's ``kernels`` request (the profiler's trace of one forward) itself.
TRACE = """
import gc
def _trace(names):
    for obj in gc.get_objects():
        if isinstance(obj, dict) and {{'kernels', 'sample', 'ping'}} <= set(obj):
            obj['kernels'] = lambda request: {{'kernels': names}}
_trace({names!r})
"""
ATEN_ADD = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int)"
)
FROZEN_CLOCK = "\nimport time\ntime.perf_counter = lambda: 1.0\ntime.monotonic = lambda: 1.0\n"
COMPUTE = "torch.relu(x) * self.scale + x"
# name -> (ModelNew source, reward, reason); reward 1 = correct (CPU timing noise may make a
# correct solution 1, 2 or 3 against its own reference)
SOLUTIONS: dict[str, tuple[str, int, str]] = {
    "honest_torch": (model_new(f"return {COMPUTE}"), 1, "ok"),
    "zeros_patching_everything": (
        model_new("return torch.zeros_like(x)", header=PATCH_EVERYTHING),
        -1,
        "incorrect",
    ),
    "noop_forging_its_rows": (model_new("return x", header=FORGE), -1, "protocol_violation"),
    "computes_only_while_checked": (
        model_new(
            f"self.calls += 1\n"
            f"        if self.calls <= 11 or self.last is None:\n"
            f"            self.last = {COMPUTE}\n"
            f"        return self.last",
            init="self.scale = scale\n        self.calls = 0\n        self.last = None",
        ),
        -1,
        "replayed_output",
    ),
    "memoised_by_input": (
        model_new(
            f"key = float(x.sum())\n"
            f"        if key not in self.seen:\n"
            f"            self.seen[key] = {COMPUTE}\n"
            f"        return self.seen[key]",
            init="self.scale = scale\n        self.seen = {}",
        ),
        1,
        "ok",
    ),
    "fake_sample": (
        model_new(
            f"return {COMPUTE}",
            header="from opsynth.filters import serve\n"
            "serve.sample_tensor = lambda t, seed, k=0, **kw: "
            "{'dtype': 'float32', 'shape': [64, 256], 'values': [0.0], 'checksums': [0.0] * 4, "
            "'abs_sum': 1.0, 'square_sum': 0.0}\n",
        ),
        -1,
        "protocol_violation",
    ),
    "frozen_clock": (model_new(f"return {COMPUTE}", header=FROZEN_CLOCK), 1, "ok"),
    "forges_a_malformed_trace": (
        model_new(f"return {COMPUTE}", header=TRACE.format(names=["k"] * 300)),
        -1,
        "protocol_violation",
    ),
    "traces_aten_compute": (
        model_new(f"return {COMPUTE}", header=TRACE.format(names=[ATEN_ADD])),
        1,
        "ok",
    ),
    "replies_before_its_forward": (
        model_new(f"return {COMPUTE}", header=DEFER),
        -1,
        "unfinished_forward",
    ),
    "exits_mid_check": (model_new("os._exit(3)", header="import os\n"), -1, "exited"),
    "looks_for_the_expected_output": (
        model_new(
            "for obj in gc.get_objects():\n"
            "            if isinstance(obj, torch.Tensor) and obj.shape == x.shape:\n"
            "                if obj is not x:\n"
            "                    return obj\n"
            "        for frame in inspect.stack():\n"
            "            for value in frame.frame.f_locals.values():\n"
            "                if isinstance(value, torch.Tensor) and value.shape == x.shape:\n"
            "                    if value is not x:\n"
            "                        return value\n"
            "        return x",
            header="import gc, inspect\n",
        ),
        -1,
        "incorrect",
    ),
    "kills_the_judge": (
        model_new("os.kill(os.getppid(), signal.SIGKILL)", header="import os, signal\n"),
        -1,
        "worker_lost",
    ),
}
TOO_FAST = task_source(
    "return x * 2.0",
    header="import itertools, time\n_ticks, _base = itertools.count(), time.perf_counter()\n"
    "time.perf_counter = lambda: _base + next(_ticks) * 0.01\n",
)


# 50 ms of work per forward, its own clock claiming 10, and its serving loop replying to each
# forward at once (claiming 0.01 ms where verify times it) and doing the work when the sample
# is asked for.
DEFERS_ITS_WORK = task_source(
    "time.sleep(0.05)\n        return x * 2.0",
    header="import itertools, time\nfrom opsynth.filters import serve as _serve\n"
    "_ticks, _base = itertools.count(), time.perf_counter()\n"
    "time.perf_counter = lambda: _base + next(_ticks) * 0.01\n"
    "_run, _sample = _serve.Runner.run, _serve.Runner.sample\n"
    "def _early(self, request):\n    self.pending = request\n    return {'ms': 0.01}\n"
    "def _late(self, request):\n"
    "    if getattr(self, 'pending', None) is not None:\n"
    "        _run(self, self.pending)\n        self.pending = None\n"
    "    return _sample(self, request)\n"
    "_serve.Runner.run, _serve.Runner.sample = _early, _late\n",
)


# A job's settings as before ``filters.timing_in_verify``: the candidate's runtime stage and
# timed compiled runs, verify's re-check of the window by the worker's clock.
CANDIDATE_TIMES = {"stages": list(FILTERS.stages), "time_compiled": True, TIMING_IN_VERIFY: False}


HIDES_COMPUTE = model_new(
    f"with torch._C.DisableTorchFunction():\n            return {COMPUTE}",
    header=TRACE.format(names=[ATEN_ADD]),
)


@pytest.fixture(scope="module")
def judged(cpu_pool: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every solution above scored through the judge on the session's pool (strict guards off
    and the static guards bypassed, so the judge alone stands between them and a reward),
    and a task whose patched clock claims 10 ms per forward, filtered with a 5 ms floor."""
    cfg = EvalConfig(strict=False, time_on_cpu=True, timed_runs=6, warmup_runs=1, trials=5)
    pairs = {name: Solution(name, code) for name, (code, _, _) in SOLUTIONS.items()}
    jobs = [Job(name, TASK, pair.files()) for name, pair in pairs.items()]
    fast = Task(ops=["too_fast"], data_source="torch#1", code=TOO_FAST)
    slow = Task(ops=["defers_its_work"], data_source="torch#1", code=DEFERS_ITS_WORK)
    # strict: compute hidden from the Python-level guard, ATen's kernels in its trace
    hidden = Solution("hides_compute_from_the_guard", HIDES_COMPUTE)
    strict = EvalConfig(strict=True, time_on_cpu=True, timed_runs=6, warmup_runs=1, trials=2)
    rows = cpu_pool.run_harness(jobs, "evaluator", harness_settings(cfg))
    hidden_rows = cpu_pool.run_harness(
        [Job(hidden.name, TASK, hidden.files())], "evaluator", harness_settings(strict)
    )
    runs = {}
    for mode, timing in (("candidate", CANDIDATE_TIMES), ("verify", {})):
        filtered = cpu_pool.submit([fast], overrides={"window_ms": [5.0, 60000.0], **timing})
        deferred = cpu_pool.submit([slow], overrides={"window_ms": [0.0, 20.0], **timing})
        runs[mode] = cpu_pool.wait(filtered)[fast.id], cpu_pool.wait(deferred)[slow.id]
    scores = {name: score_of(task(), pairs[name], rows[name], cfg) for name in pairs}
    scores[hidden.name] = score_of(task(), hidden, hidden_rows[hidden.name], strict)
    return scores, runs


@pytest.mark.parametrize("name", list(SOLUTIONS))
def test_the_judge_scores_what_ran_not_what_was_claimed(name: str, judged: Any) -> None:
    score = judged[0][name]
    _, reward, reason = SOLUTIONS[name]
    assert (min(score.reward, 1), score.reason) == (reward, reason), score.detail


def test_atens_kernels_in_the_trace_flag_when_lenient_and_refuse_when_strict(judged) -> None:
    """On CPU there are no kernels to trace, so these solutions report ATen's add themselves;
    on a GPU the profiler sees it (``tests/test_evaluator_gpu.py``)."""
    lenient, strict = judged[0]["traces_aten_compute"], judged[0]["hides_compute_from_the_guard"]
    assert lenient.reward >= 1 and "aten_compute_in_forward" in lenient.flags, lenient
    assert (strict.reward, strict.reason) == (-1, "aten_compute"), strict
    assert "CUDAFunctor_add" in strict.detail


def test_a_frozen_clock_in_the_solution_changes_no_timing(judged: Any) -> None:
    scores = judged[0]
    frozen, honest = scores["frozen_clock"], scores["honest_torch"]
    for score in (frozen, honest):
        assert score.solution_ms and score.eager_ms and score.compile_ms
        # the same code as the reference: a frozen clock cannot make it look faster. (No lower
        # bound: a forward of microseconds on a busy 2-core host is mostly timing noise.)
        assert score.speedup_eager < 5, score


def test_a_task_whose_clock_lies_is_too_fast_by_the_workers_clock(judged: Any) -> None:
    rows = judged[1]["candidate"][0]
    runtime = next(v for v in rows if v.stage == "runtime")
    assert runtime.passed and runtime.measures["eager_ms_median"] >= 5.0  # its own claim
    assert (rows[-1].stage, rows[-1].reason) == ("verify", "too_fast"), rows[-1].detail
    assert rows[-1].measures["judged_ms"] < 4.5


def test_a_task_that_replies_before_its_work_is_too_slow_by_the_workers_clock(judged) -> None:
    """Its own clock claims 10 ms and its forward's reply comes at once; the work (50 ms) is
    done when the sample is asked for, and the upper edge counts that sample."""
    rows = judged[1]["candidate"][1]
    runtime = next(v for v in rows if v.stage == "runtime")
    assert runtime.passed and runtime.measures["eager_ms_median"] <= 20.0  # its own claim
    assert (rows[-1].stage, rows[-1].reason) == ("verify", "too_slow"), rows[-1].detail
    assert rows[-1].measures["judged_ms"] < 20.0 <= rows[-1].measures["judged_upper_ms"]
    # where the re-check's time went, by the worker's clock: five timed runs, each paying the
    # 50 ms of deferred work in its sample; the checks before them ran forwards too
    measures = rows[-1].measures
    assert measures["timed_s"] >= 5 * 0.05 and measures["checks_s"] >= 0.05
    assert 0 <= measures["lock_wait_s"] < measures["timed_s"]
    # and by kind of request before the timed runs: the deferred work lands in the samples
    spent = measures["requests_s"]
    assert {"ping", "draw", "run", "sample"} <= set(spent)
    assert spent["sample"] >= 0.05 and sum(spent.values()) <= measures["checks_s"]


def test_where_verify_times_a_clock_claiming_more_than_its_request_took_is_caught(judged):
    """Timed in verify, the same task's patched clock claims 10 ms for a forward whose request
    took microseconds by the worker's clock: a protocol violation, no runtime row of its own."""
    rows = judged[1]["verify"][0]
    assert [v.stage for v in rows] == ["eager", "randomness", "degenerate", "compile", "verify"]
    assert (rows[-1].reason, rows[0].passed) == ("protocol_violation", True), rows[-1].detail
    assert "claims" in rows[-1].detail


def test_where_verify_times_an_understated_claim_is_too_slow_by_the_workers_clock(judged):
    rows = judged[1]["verify"][1]
    verdict = rows[-1]
    assert (verdict.stage, verdict.reason) == ("verify", "too_slow"), verdict.detail
    assert verdict.measures["scaled_ms"] <= 0.01 < 20.0 <= verdict.measures["judged_upper_ms"]
    assert "compiled_ms_median" not in verdict.measures
    compile_row = next(v for v in rows if v.stage == "compile")
    assert "compiled_ms_median" not in compile_row.measures  # compile no longer times


def test_nested_input_tensors_are_numbered_depth_first_and_replaced_in_their_container() -> None:
    from opsynth.filters.candidate_load import input_tensors, with_input_tensor

    a, b, c, new = (torch.full((2,), float(v)) for v in range(4))
    inputs = [a, 3, [b, (c,)]]
    assert [id(t) for t in input_tensors(inputs, False)] == [id(a)]
    assert [id(t) for t in input_tensors(inputs, True)] == [id(a), id(b), id(c)]
    replaced = with_input_tensor(inputs, 2, new, True)
    assert replaced[0] is a and replaced[1] == 3 and replaced[2][0] is b
    assert isinstance(replaced[2][1], tuple) and replaced[2][1][0] is new
    flat = with_input_tensor(inputs, 0, new, False)
    assert flat[0] is new and flat[2][0] is b and flat[2][1][0] is c  # not nested: left alone
    with pytest.raises(IndexError):
        with_input_tensor(inputs, 3, new, True)


# ------------------------------------------------------------------------------ verify's requests


def test_norms_rule_out_a_match_only_where_allclose_fails() -> None:
    torch.manual_seed(0)
    x = torch.randn(1 << 14)
    (e,) = sample(x)
    for close in (x, x + 1e-3, x * 1.009):
        assert torch.allclose(close, x, atol=1e-2, rtol=1e-2)
        assert not j.norms_apart(e, *sample(close), 1e-2, 1e-2)
    for same_norm in (x.flip(0), -x):  # not allclose, but the sums cannot tell
        assert not j.norms_apart(e, *sample(same_norm), 1e-2, 1e-2)
    for far in (x * 2.0, x + 1.0, torch.tanh(x) * 2.0 + 1.0):
        assert j.norms_apart(e, *sample(far), 1e-2, 1e-2)
    assert j.norms_apart(e, *sample(x.reshape(128, 128)), 1e-2, 1e-2)  # another shape


class InProcess:
    """verify's peer answered by ``filters.serve.Runner`` in this process, every request
    recorded."""

    def __init__(self, forward: Any) -> None:
        def draw(seed: int) -> list[Any]:
            return [torch.randn(64, 64, generator=torch.Generator().manual_seed(seed))]

        forwards = {name: lambda inputs, rng: [forward(*inputs)] for name in ("eager", "compiled")}
        self.handlers = Runner(torch.device("cpu"), draw, forwards).handlers()
        self.made: list[dict[str, Any]] = []
        self.spent: dict[str, float] = {}

    def request(self, op: str, **fields: Any) -> tuple[dict[str, Any], float]:
        self.made.append({"op": op, **fields})
        return json.loads(json.dumps({"re": op, **self.handlers[op]({"op": op, **fields})})), 0.0


def test_verify_samples_inputs_again_only_for_an_output_their_norms_allow() -> None:
    """An input is sampled for the forward's check (before and after it) and, for an output
    of its shape, again only where the norms allow the output to be that input."""
    from opsynth.filters.verify import INPUT_AS_ANSWER, verify

    def input_samples(forward: Any) -> tuple[str, int]:
        peer = InProcess(forward)
        reason = verify(peer, {INPUT_AS_ANSWER: True})[0]  # type: ignore[arg-type]
        return reason, sum(r["op"] == "sample" and r.get("of") == "inputs" for r in peer.made)

    assert input_samples(lambda x: x.clone()) == ("trivial_answer", 3)
    reason, count = input_samples(lambda x: torch.tanh(x) * 2.0 + 1.0)
    assert reason != "trivial_answer" and count == 2


# ------------------------------------------------------------------------------ fused sums


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_sums_are_the_torch_paths_sums_in_one_pass() -> None:
    """On a CUDA device a sample's sums come from one kernel (``filters.fused_sums``): its
    magnitudes are the torch path's, its weighted sums are ``sum(w * v)`` for independent
    standard normal weights (mean 0, variance ``|v|^2`` over seeds), fixed by the seed, over
    every chunk and a ragged end, for every dtype and strided views."""
    device = torch.device("cuda")
    assert fused_sums.available(device)
    generator = torch.Generator(device=device).manual_seed(0)
    y = torch.randn(2 * CHUNK + 5, device=device, generator=generator)
    fused = fused_sums_of(y, 9, j.CHECKSUMS, magnitudes=True)
    plain = torch_sums(y, generator, j.CHECKSUMS, magnitudes=True)
    assert torch.allclose(fused[j.CHECKSUMS :], plain[j.CHECKSUMS :], rtol=1e-9, atol=0.0)
    assert torch.equal(fused_sums_of(y, 9, j.CHECKSUMS, magnitudes=True), fused)
    assert not torch.equal(fused_sums_of(y, 10, j.CHECKSUMS, magnitudes=True), fused)
    assert fused_sums_of(y, 9, 1, magnitudes=False).tolist() == fused[:1].tolist()

    v = torch.randn(4096, device=device, generator=generator)
    draws = torch.stack([fused_sums_of(v, s, j.CHECKSUMS, magnitudes=False) for s in range(500)])
    z = draws / v.double().square().sum().sqrt()
    assert abs(float(z.mean())) < 0.1 and 0.85 < float(z.var()) < 1.15
    correlation = torch.corrcoef(z.T)  # the four weight streams are independent
    assert float((correlation - torch.eye(j.CHECKSUMS, device=device)).abs().max()) < 0.2

    x = y[: 3 * fused_sums.BLOCK + 7] * 4
    for dtype in (torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.bool):
        t = x.to(dtype)
        got = fused_sums_of(t, 3, j.CHECKSUMS, magnitudes=True)
        want = t.float().abs().sum(dtype=torch.float64), t.float().square().sum(dtype=torch.float64)
        assert torch.allclose(got[j.CHECKSUMS :], torch.stack(want), rtol=1e-9), dtype
        assert torch.equal(got, fused_sums_of(t.float(), 3, j.CHECKSUMS, magnitudes=True))
    strided = y[::3]
    assert torch.equal(
        fused_sums_of(strided, 5, j.CHECKSUMS, magnitudes=True),
        fused_sums_of(strided.contiguous(), 5, j.CHECKSUMS, magnitudes=True),
    )
    del y, x, strided
    torch.cuda.empty_cache()
