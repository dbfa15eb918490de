"""The execution checks, run inside one sandboxed candidate process, cheapest first.

``run_candidate`` imports the candidate's source, then runs the stages in ``STAGES`` order and
reports one verdict row per stage through ``emit`` as soon as the stage ends, stopping at the
first failure. Streaming matters: if a later stage kills the process (segfault, timeout), the
worker still has the earlier verdicts and knows which stage was running.

This module runs on GPU hosts that only have torch: it imports torch and the standard library
only. Every tolerance comes from the settings the orchestrator sends (``FiltersConfig``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from opsynth.filters import compare
from opsynth.filters.candidate_load import (
    CANDIDATE_MODULE,
    draw_inputs,
    input_tensors,
    load_module,
    seed_all,
    to_device,
    with_input_tensor,
)
from opsynth.filters.device_init import cpu_name, device_init_for
from opsynth.filters.failures import DETAIL_LIMIT, Fail, classify, describe
from opsynth.filters.gpu_sections import compile_locked, gpu_lock
from opsynth.filters.gpulock import exclusive_s, waited_s
from opsynth.filters.harness import CODE_FILE, stages_of
from opsynth.filters.judge import MAX_OUTPUTS, structure_mismatch
from opsynth.filters.protocol import INT64
from opsynth.filters.reasons import STAGES, VERIFY
from opsynth.filters.serve import Runner, flush_l2
from opsynth.filters.size_inline import size_here
from opsynth.filters.sizing import Probe, chosen_too_fast, measured

Emit = Callable[[dict[str, Any]], None]

# Fixed seeds: the same candidate gets the same weights and inputs on every host and run.
SEED_INIT = 0
SEED_INPUTS = 1000
SEED_RUN = 2000

# Cached, unused device memory below this stays with the allocator after a stage: giving it
# back costs a pass through the GPU lock, for too little to spare a neighbour an ``oom``.
RELEASE_MIN_BYTES = 256 << 20
# The stages after which it is given back: degenerate holds the most at once (three draws and
# their outputs) and compile is followed by the judge's requests; after eager and randomness
# the next stage would only allocate the same blocks again.
RELEASE_AFTER = ("degenerate", "compile")


@dataclasses.dataclass(frozen=True)
class Settings:
    """The subset of ``FiltersConfig`` the checks need, sent as plain JSON by the pool."""

    device: str = "cpu"
    warmup_runs: int = 3
    timed_runs: int = 10
    window_ms: tuple[float, float] = (0.1, 1000.0)
    speed_factor: float = 1.0
    compile_atol: float = 1e-2
    compile_rtol: float = 1e-2
    input_draws: int = 3
    distinct_rtol: float = 1e-3
    determinism_atol: float = 1e-6
    determinism_rtol: float = 1e-5
    lock_dir: str = ""
    batch_timers: bool = True
    # Timed runs hold the GPU alone; a sizing probe may time in the shared section instead
    # (``sizing.probe_exclusive``), where it needs only to land within a factor-3 band.
    timed_exclusive: bool = True
    # The stages to run, in order: all of them to filter, a subset to measure (sizing).
    stages: tuple[str, ...] = STAGES
    # Whether compile times the compiled forward; off where verify times it
    # (``filters.timing_in_verify``).
    time_compiled: bool = True
    # Whether an output equal to an input tensor is a trivial answer (``filters.input_as_answer``).
    input_as_answer: bool = False
    # Whether tensors inside list inputs are checked as inputs (``filters.nested_inputs``).
    nested_inputs: bool = False
    # Whether every output must move for another draw (``filters.every_output_distinct``).
    every_output_distinct: bool = False
    # Whether every input draw must have the same tensor structure (``filters.stable_inputs``).
    stable_inputs: bool = False
    # Whether a sample's sums take one pass on a CUDA device (``filters.fused_sums``).
    fused_sums: bool = True

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Settings:
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["stages"] = stages_of(data)
        if "window_ms" in values:
            values["window_ms"] = tuple(values["window_ms"])
        return cls(**values)


# --------------------------------------------------------------------------------------------
# Entry points


def run_in(workdir: str, settings: dict[str, Any], emit: Emit) -> Any:
    """The ``filters`` harness's entry point (``filters.harness``): the candidate the runner
    wrote to ``workdir``. Returns what the judge's requests are served with (``serve``)."""
    return run_candidate(os.path.join(workdir, CODE_FILE), settings, emit)


def run_candidate(code_path: str, settings: dict[str, Any], emit: Emit) -> Any:
    """Run every stage on the candidate at ``code_path``; report through ``emit``. When
    every stage passed and the job goes on to the judge's ``verify``, returns the request
    handlers and the failure classifier it serves the judge with (``filters.serve``)."""
    sizing, too_fast = None, ""
    if settings.get("sizing"):  # size first, in this process (filters.size_inline)
        sizing = size_here(code_path, settings, probe)
        # a size the search could not grow into the window is not filtered: the orchestrator
        # rejects it from the claim (its sizing stage), so this process stops here
        below_ms = settings["sizing"].get("too_fast_below_ms", 0.0)
        too_fast = chosen_too_fast(sizing, below_ms) if sizing else ""
    cand = Candidate(code_path, Settings.from_dict(settings))
    stage_functions: dict[str, Callable[[Candidate], dict[str, Any]]] = {
        "eager": stage_eager,
        "randomness": stage_randomness,
        "degenerate": stage_degenerate,
        "runtime": stage_runtime,
        "compile": stage_compile,
    }
    passed = True
    for name in cand.s.stages:
        if name == VERIFY:
            continue
        emit({"event": "stage", "stage": name})
        start, waited, exclusive = time.perf_counter(), waited_s(), exclusive_s()
        try:
            if sizing is not None and sizing.get("poisoned"):
                raise Fail("cuda_error", "a sizing probe poisoned this process's CUDA context")
            if too_fast:
                raise Fail("too_fast", too_fast)
            row = _row(name, True, "ok", "", stage_functions[name](cand))
        except Fail as fail:
            row = _row(name, False, fail.reason, fail.detail, fail.measures)
        except BaseException as exc:  # the candidate may raise anything, SystemExit included
            default = "compile_error" if name == "compile" else "forward_error"
            row = _row(name, False, classify(exc, default), describe(exc, code_path), {})
        released = release_cached(cand) if row["passed"] and name in RELEASE_AFTER else 0.0
        if released:
            row["measures"]["device_released_gib"] = released
        row["elapsed_s"] = round(time.perf_counter() - start, 6)
        if sizing is not None:
            row["measures"]["sizing"], sizing = sizing, None  # on the first row only
        if cand.lock_dir:
            row["measures"]["gpu_lock_wait_s"] = round(waited_s() - waited, 6)
            row["measures"]["gpu_exclusive_s"] = round(exclusive_s() - exclusive, 6)
        emit({"event": "verdict", "verdict": row})
        if not row["passed"]:
            passed = False
            break
    emit({"event": "done"})
    if passed and VERIFY in cand.s.stages:
        return served(cand)
    return None


def release_cached(c: Candidate) -> float:
    """Give the device back what this process's allocator caches but no tensor uses, after a
    stage: GiB released. The allocator keeps a stage's peak reserved until told otherwise, so
    each of a GPU's workers would hold its candidate's highest peak (the checks hold several
    draws' outputs at once) through the stages after it, compile's seconds of CPU work
    included, and the sum of those peaks, not of what is in use, would decide whether a
    neighbour runs out of memory. Untimed GPU work, so under the shared lock."""
    if not c.cuda:
        return 0.0
    try:
        idle = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
        if idle < RELEASE_MIN_BYTES:
            return 0.0
        with c.gpu_shared():
            torch.cuda.empty_cache()
        left = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    except Exception:  # a poisoned context: the next stage finds it
        return 0.0
    return round((idle - left) / 2**30, 3)


def probe(path: str, settings: dict[str, Any]) -> tuple[Probe, float | None]:
    """One sizing probe of the variant at ``path`` in this process (``filters.size_inline``):
    its scaled eager median and device-memory peak, or why there is none, and the eager
    stage's ``device_init_s``. Everything it built is released before the next, and the
    memory peak reset."""
    cand = Candidate(path, Settings.from_dict(settings))
    init_s = None
    try:
        init_s = stage_eager(cand)["device_init_s"]
        found = measured(stage_runtime(cand))
    except Fail as fail:
        found = Probe(None, reason=fail.reason)
    except BaseException as exc:  # the candidate may raise anything, SystemExit included
        found = Probe(None, reason=classify(exc, "forward_error"))
    cand.release()
    sys.modules.pop(CANDIDATE_MODULE, None)
    gc.collect()
    if cand.cuda:
        with contextlib.suppress(Exception):  # a poisoned context fails here too
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    return found, init_s


def served(c: Candidate) -> tuple[dict[str, Any], Callable[[BaseException], str]]:
    """The requests the judge's ``verify`` makes of this candidate (``filters.serve``)."""

    def forward(fn: Any) -> Any:
        return lambda xs, rng: c.forward(xs, rng, fn=fn)  # timed runs: no seeding (rng None)

    forwards = {"eager": forward(None), "compiled": forward(c.compiled)}
    lock = c.gpu_lock if c.lock_dir else None
    runner = Runner(
        c.device, c.draw_from, forwards, lock, nested=c.s.nested_inputs, fused=c.s.fused_sums
    )
    return runner.handlers(), lambda exc: classify(exc, "forward_error")


# --------------------------------------------------------------------------------------------
# Candidate state shared by the stages


class Candidate:
    """The loaded module, model, first input draw and its outputs, passed stage to stage."""

    def __init__(self, path: str, settings: Settings) -> None:
        self.path = path
        self.s = settings
        self.device = torch.device(settings.device)
        self.module: Any = None
        self.model: torch.nn.Module | None = None
        self.inputs: list[Any] = []
        self.outputs: list[torch.Tensor] = []
        self.eager_ms: float | None = None
        self.compiled: Any = None
        self._l2_buffer: torch.Tensor | None = None
        self.device_init = device_init_for(self.device)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def release(self) -> None:
        """Drop the module, model and every tensor held here (a sizing probe's, before the
        next variant is built in the same process)."""
        self.module = self.model = self.compiled = None
        self.inputs, self.outputs, self._l2_buffer = [], [], None

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def draw(self, index: int) -> list[Any]:
        """The ``index``-th independent input draw, on the device (see ``draw_inputs``)."""
        return self.draw_from(SEED_INPUTS + index)

    def draw_from(self, seed: int) -> list[Any]:
        """The input draw of RNG seed ``seed``, on the device."""
        seed_all(seed)
        with self.gpu_shared():
            raw = draw_inputs(self.module.get_inputs, self.device, seed)
        if not isinstance(raw, list | tuple):
            raise Fail("init_error", f"get_inputs() returned {type(raw).__name__}, not a list")
        return [to_device(x, self.device) for x in raw]

    def forward(
        self, inputs: list[Any], seed: int | None = SEED_RUN, fn: Any = None
    ) -> list[torch.Tensor]:
        """One forward pass under a fixed RNG state (none with ``seed`` None: a timed run,
        whose clock seeding would inflate); returns the flattened output tensors."""
        if seed is not None:
            seed_all(seed)
        with self.gpu_shared(), torch.no_grad():
            out = (self.model if fn is None else fn)(*inputs)
            self.sync()
        return flatten_output(out)

    def flush_l2(self) -> None:
        """Evict the GPU's L2 so each timed run starts cold, as an evaluator's would."""
        self._l2_buffer = flush_l2(self._l2_buffer, self.device)

    @property
    def lock_dir(self) -> str:
        """The GPU lock's dir; empty (no locking) off the GPU or for a lone process."""
        return self.s.lock_dir if self.cuda else ""

    def gpu_lock(self, *, exclusive: bool = True) -> contextlib.AbstractContextManager[None]:
        """Exclusive around timed runs, shared around every other GPU section (``gpu_lock``)."""
        return gpu_lock(
            self.lock_dir, self.device, exclusive=exclusive, batch_timers=self.s.batch_timers
        )

    def gpu_shared(self) -> contextlib.AbstractContextManager[None]:
        return self.gpu_lock(exclusive=False)


# --------------------------------------------------------------------------------------------
# Stages


def stage_eager(c: Candidate) -> dict[str, Any]:
    """Import, instantiate, run once: outputs are finite tensors on the device."""
    start = time.perf_counter()
    try:
        c.module = load_module(c.path)
    except BaseException as exc:
        raise Fail(classify(exc, "import_error"), describe(exc, c.path)) from None
    missing = [
        n
        for n in ("Model", "get_inputs", "get_init_inputs")
        if not callable(getattr(c.module, n, None))
    ]
    if missing:
        raise Fail("import_error", f"module does not define callable {', '.join(missing)}")
    import_s = time.perf_counter() - start

    start = time.perf_counter()
    try:
        # Host generators only: seeding CUDA's would wait for the context DeviceInit is still
        # creating. A constructor that draws on the GPU gets a fresh process's fixed CUDA seed.
        seed_all(SEED_INIT, host_only=True)
        init_inputs = c.module.get_init_inputs()
        model = c.module.Model(*init_inputs)
        if not isinstance(model, torch.nn.Module):
            raise Fail("init_error", f"Model(...) is a {type(model).__name__}, not an nn.Module")
        build_s = time.perf_counter() - start
        device_wait_s = c.device_init.wait()
        with c.gpu_shared():
            c.model = model.to(c.device)
            c.sync()
        c.inputs = c.draw(0)
    except Fail:
        raise
    except BaseException as exc:
        raise Fail(classify(exc, "init_error"), describe(exc, c.path)) from None
    init_s = time.perf_counter() - start

    misplaced = misplaced_tensors(c.model, c.device)
    if misplaced:
        raise Fail(
            "wrong_device", f"module tensors not on {c.device.type}: {', '.join(misplaced[:5])}"
        )

    # clones and checks run on the GPU as well: shared, so no timer overlaps them
    with c.gpu_shared():
        before = [x.clone() if isinstance(x, torch.Tensor) else None for x in _inputs(c)]
        start = time.perf_counter()
        try:
            outputs = c.forward(c.inputs)
        except Fail:
            raise
        except BaseException as exc:
            raise Fail(classify(exc, "forward_error"), describe(exc, c.path)) from None
        first_ms = (time.perf_counter() - start) * 1e3

        if len(outputs) > MAX_OUTPUTS:
            raise Fail("too_many_outputs", f"{len(outputs)} output tensors; at most {MAX_OUTPUTS}")
        for k, t in enumerate(outputs):
            if t.device.type != c.device.type:
                raise Fail("wrong_device", f"output {k} is on {t.device}, expected {c.device.type}")
            if t.numel() == 0:
                raise Fail("bad_output", f"output {k} is empty (shape {tuple(t.shape)})")
            if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all()):
                raise Fail("nonfinite_output", f"output {k} contains NaN or Inf", output=k)
        mutated = [
            k
            for k, (x, old) in enumerate(zip(_inputs(c), before, strict=True))
            if old is not None and not compare.same_value(x, old)
        ]
        if mutated:
            raise Fail(
                "input_mutated", f"forward modified input(s) {mutated} in place", inputs=mutated
            )
    c.outputs = outputs
    c.device_init.candidates += 1
    reused = c.device_init.candidates > 1
    return {
        "import_s": round(import_s, 4),
        "init_s": round(init_s, 4),
        "build_s": round(build_s, 4),
        "device_init_s": 0.0 if reused else round(c.device_init.seconds, 4),
        "device_warm_s": 0.0 if reused else round(c.device_init.warm_seconds, 4),
        "device_wait_s": round(device_wait_s, 4),
        "context_reused": reused,
        "first_forward_ms": round(first_ms, 4),
        "parameters": sum(p.numel() for p in c.model.parameters()),
        "inputs": [_describe_value(x) for x in c.inputs],
        "outputs": [_describe_value(t) for t in outputs],
    }


def stage_randomness(c: Candidate) -> dict[str, Any]:
    """Same RNG state twice must agree (else nondeterministic); two RNG states too (else random).

    Each forward holds the GPU shared together with the comparison of its output (reductions
    over gigabyte tensors are kernels too, which a timer must not overlap), and lets go before
    the next one: a queued timer waits for the step in flight, not for the whole stage."""
    atol, rtol = c.s.determinism_atol, c.s.determinism_rtol
    with c.gpu_shared():
        repeat = c.forward(c.inputs, SEED_RUN)
        repeat_diff = compare.max_abs_diff(c.outputs, repeat)
        if not compare.all_close(c.outputs, repeat, atol=atol, rtol=rtol):
            raise Fail(
                "nondeterministic",
                f"two runs with the same RNG state differ by up to {repeat_diff:.3g}",
                repeat_max_abs_diff=repeat_diff,
            )
    del repeat
    with c.gpu_shared():
        reseeded = c.forward(c.inputs, SEED_RUN + 1)
        reseed_diff = compare.max_abs_diff(c.outputs, reseeded)
        if not compare.all_close(c.outputs, reseeded, atol=atol, rtol=rtol):
            raise Fail(
                "random",
                f"outputs depend on the RNG state (differ by up to {reseed_diff:.3g}); "
                "dropout in train mode or random numbers in forward",
                reseed_max_abs_diff=reseed_diff,
            )
    return {"repeat_max_abs_diff": repeat_diff, "reseed_max_abs_diff": reseed_diff}


def stage_degenerate(c: Candidate) -> dict[str, Any]:
    """Reject outputs a do-nothing kernel could match, or that ignore (part of) the input.
    One GPU section per step, as in ``stage_randomness``."""
    rtol = c.s.distinct_rtol
    for k, t in enumerate(c.outputs):
        if t.numel() > 1 or t.is_complex():  # a complex scalar is two reals
            with c.gpu_shared():
                f = compare.real_view(t)
                lo, hi = float(f.min()), float(f.max())
            scale = max(abs(lo), abs(hi))
            if hi - lo <= rtol * scale:
                raise Fail(
                    "constant_output",
                    f"output {k} is constant across its elements (spread {hi - lo:.3g}, "
                    f"magnitude {scale:.3g})",
                    output=k,
                    spread=hi - lo,
                    magnitude=scale,
                )
    for k, t in enumerate(c.outputs):
        with c.gpu_shared():
            trivial = compare.trivial_answer(t, atol=c.s.compile_atol, rtol=c.s.compile_rtol)
            max_abs = float(compare.real_view(t).abs().max()) if trivial else 0.0
        if trivial:
            raise Fail(
                "trivial_answer",
                f"output {k}: {trivial} passes allclose(atol={c.s.compile_atol}, "
                f"rtol={c.s.compile_rtol}) against the real output",
                output=k,
                max_abs=max_abs,
            )

    if c.s.input_as_answer:
        with c.gpu_shared():
            atol, rtol = c.s.compile_atol, c.s.compile_rtol
            tensors = input_tensors(c.inputs, c.s.nested_inputs)
            handed_back = compare.input_answer(c.outputs, tensors, atol=atol, rtol=rtol)
        if handed_back is not None:
            k, i = handed_back
            raise Fail(
                "trivial_answer",
                f"output {k}: input tensor {i} itself passes allclose(atol={atol}, "
                f"rtol={rtol}) against the real output",
                output=k,
                input=i,
            )

    draws = [c.inputs] + [c.draw(i) for i in range(1, c.s.input_draws)]
    if c.s.stable_inputs:
        first = input_tensors(c.inputs, c.s.nested_inputs)
        for i, draw in enumerate(draws[1:], start=1):
            later = input_tensors(draw, c.s.nested_inputs)
            why = structure_mismatch(first, later, what="input tensor")
            if why:
                raise Fail("unstable_inputs", f"input draws 0 and {i}: {why}", draws=[0, i])
    outputs = [c.outputs] + [c.forward(d) for d in draws[1:]]
    pairwise = []
    for i in range(len(outputs)):
        for j in range(i + 1, len(outputs)):
            with c.gpu_shared():
                d = compare.rel_diff(outputs[i], outputs[j])
            pairwise.append(d)
            which: dict[str, Any] = {}
            if d > rtol and c.s.every_output_distinct and len(outputs[i]) > 1:
                with c.gpu_shared():
                    k, d = compare.least_moved(outputs[i], outputs[j])
                which = {"output": k}
            if d <= rtol:
                what = f"output {which['output']}" if which else "outputs"
                raise Fail(
                    "indistinguishable",
                    f"input draws {i} and {j} give {what} within {d:.3g} (relative)",
                    draws=[i, j],
                    rel_diff=d,
                    **which,
                )
    del outputs

    influence: dict[str, float] = {}
    for k, (x, other) in enumerate(zip(_inputs(c), _inputs(c, draws[1]), strict=False)):
        if not (isinstance(x, torch.Tensor) and isinstance(other, torch.Tensor)):
            continue
        with c.gpu_shared():
            if x.shape != other.shape or compare.same_value(x, other):
                continue  # a deterministic input cannot be varied without knowing its meaning
            d = compare.rel_diff(c.outputs, c.forward(_with_input(c, k, other)))
        influence[str(k)] = d
        if d <= rtol:
            raise Fail(
                "input_ignored",
                f"changing input {k} changes the output by only {d:.3g} (relative)",
                input=k,
                rel_diff=d,
            )
    return {
        "min_pairwise_rel_diff": min(pairwise) if pairwise else None,
        "input_influence": influence,
    }


def _inputs(c: Candidate, draw: list[Any] | None = None) -> list[Any]:
    """The inputs the checks vary and compare, numbered as their rows name them: every input
    in order, or with ``filters.nested_inputs`` the input tensors, those inside list and tuple
    inputs included (``candidate_load.input_tensors``)."""
    inputs = c.inputs if draw is None else draw
    return input_tensors(inputs, True) if c.s.nested_inputs else list(inputs)


def _with_input(c: Candidate, k: int, value: torch.Tensor) -> list[Any]:
    """``c.inputs`` with its ``k``-th input (as ``_inputs`` numbers them) replaced."""
    if c.s.nested_inputs:
        return with_input_tensor(c.inputs, k, value, True)
    return [value if i == k else x for i, x in enumerate(c.inputs)]


def stage_runtime(c: Candidate) -> dict[str, Any]:
    """Eager median over timed runs, scaled by device_speed_factor, inside the window."""
    lo, hi = c.s.window_ms
    factor = c.s.speed_factor
    times = time_runs(c, c.model, slow_ms=hi / factor)
    median = statistics.median(times)
    scaled = median * factor
    measures = {
        "eager_ms_median": round(median, 6),
        "eager_ms_min": round(min(times), 6),
        "timed_runs": len(times),
        "speed_factor": factor,
        "scaled_ms": round(scaled, 6),
        "window_ms": [lo, hi],
        "device_name": _device_name(c),
    }
    if c.cuda:
        # what the task needs of the device (its tensors + the L2 flush buffer), for audits and
        # for judging how many such tasks share a GPU
        measures["device_peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    if scaled < lo:
        raise Fail("too_fast", f"eager median {scaled:.4g} ms < {lo} ms", **measures)
    if scaled > hi:
        raise Fail("too_slow", f"eager median {scaled:.4g} ms > {hi} ms", **measures)
    c.eager_ms = median
    return measures


def stage_compile(c: Candidate) -> dict[str, Any]:
    """torch.compile (default mode) runs and matches eager within the evaluator's tolerance."""
    start = time.perf_counter()
    try:
        compiled = compile_locked(c.model, c.gpu_shared if c.lock_dir else None)
        with torch.no_grad():
            compiled(*c.inputs)
        outputs = c.forward(c.inputs, fn=compiled)
    except BaseException as exc:
        raise Fail(classify(exc, "compile_error"), describe(exc, c.path)) from None
    compile_s = time.perf_counter() - start
    c.compiled = compiled
    atol, rtol = c.s.compile_atol, c.s.compile_rtol
    with c.gpu_shared():
        diff = compare.max_abs_diff(c.outputs, outputs)
        matches = compare.all_close(outputs, c.outputs, atol=atol, rtol=rtol)
    if not matches:
        raise Fail(
            "compile_mismatch",
            f"compiled output differs from eager by up to {diff:.3g}",
            max_abs_diff=diff,
            compile_s=round(compile_s, 3),
        )
    if not c.s.time_compiled:
        return {"compile_s": round(compile_s, 4), "max_abs_diff": diff}
    try:
        times = time_runs(c, compiled, slow_ms=None)
    except BaseException as exc:
        raise Fail(classify(exc, "compile_error"), describe(exc, c.path)) from None
    median = statistics.median(times)
    measures: dict[str, Any] = {
        "compile_s": round(compile_s, 4),
        "compiled_ms_median": round(median, 6),
        "compiled_ms_min": round(min(times), 6),
        "max_abs_diff": diff,
    }
    if c.eager_ms:
        measures["speedup"] = round(c.eager_ms / median, 4) if median > 0 else None
    return measures


# --------------------------------------------------------------------------------------------
# Timing


def time_runs(c: Candidate, fn: Any, slow_ms: float | None) -> list[float]:
    """Milliseconds per run after warm-up. On CUDA: events, synchronize, L2 flushed before each
    run, and the GPU's lock held exclusively, so no other worker's GPU work overlaps (in the
    shared section instead when the settings say so: a sizing probe's option). On CPU:
    wall time, which an oversubscribed host inflates (a worker with 2 intra-op threads on 2
    busy cores read a 10 us forward as 10 ms), so CPU windows are only as good as the host is
    quiet.
    Stops early once more than half the runs exceed ``slow_ms`` (the median can no longer
    fall inside the window)."""
    args = c.inputs
    with torch.no_grad():
        with c.gpu_shared():
            for _ in range(c.s.warmup_runs):
                fn(*args)
            c.sync()
        times: list[float] = []
        with c.gpu_lock(exclusive=c.s.timed_exclusive):
            for _ in range(c.s.timed_runs):
                if c.cuda:
                    c.flush_l2()
                    begin = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    begin.record()
                    fn(*args)
                    end.record()
                    end.synchronize()
                    times.append(float(begin.elapsed_time(end)))
                else:
                    t0 = time.perf_counter()
                    fn(*args)
                    times.append((time.perf_counter() - t0) * 1e3)
                if slow_ms is not None and sum(t > slow_ms for t in times) > c.s.timed_runs // 2:
                    break
    return times


# --------------------------------------------------------------------------------------------
# Helpers


def flatten_output(out: Any) -> list[torch.Tensor]:
    """A tensor or (nested) tuples/lists of tensors, as a flat list; anything else fails."""
    if isinstance(out, torch.Tensor):
        return [out.detach()]
    if isinstance(out, list | tuple) and out:
        flat: list[torch.Tensor] = []
        for item in out:
            flat += flatten_output(item)
        return flat
    raise Fail("bad_output", f"forward returned {type(out).__name__}, not tensors")


def misplaced_tensors(model: torch.nn.Module, device: torch.device) -> list[str]:
    """Parameters, buffers and plain tensor attributes that are not on ``device``."""
    bad = [
        name
        for name, t in [*model.named_parameters(), *model.named_buffers()]
        if t.device.type != device.type
    ]
    for mod_name, module in model.named_modules():
        for attr, value in vars(module).items():
            if isinstance(value, torch.Tensor) and value.device.type != device.type:
                bad.append(f"{mod_name}.{attr}" if mod_name else attr)
    return bad


def _describe_value(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return {"shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, str):
        return value[:200]
    if isinstance(value, int | float | bool) or value is None:
        return jsonable(value)
    return type(value).__name__


def _device_name(c: Candidate) -> str:
    return torch.cuda.get_device_name(0) if c.cuda else cpu_name()


def _row(
    stage: str, passed: bool, reason: str, detail: str, measures: dict[str, Any]
) -> dict[str, Any]:
    return {
        "stage": stage,
        "passed": passed,
        "reason": reason,
        "detail": detail[:DETAIL_LIMIT],
        "measures": jsonable(measures),
    }


def jsonable(value: Any) -> Any:
    """Plain JSON: tensors to numbers, tuples to lists, non-finite floats to strings."""
    if isinstance(value, torch.Tensor):
        value = value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, int) and not isinstance(value, bool) and not -INT64 <= value < INT64:
        return f"an integer of {value.bit_length()} bits"  # beyond a measure (and str())
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    return str(value)
