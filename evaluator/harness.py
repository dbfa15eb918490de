"""The sandboxed side of the evaluator: build a solution, check it against its task, time both.

Runs inside a filters worker's forked child (``settings["harness"] == "evaluator"``), in a
directory holding ``candidate.py`` (the task: ``Model``, ``get_inputs``, ``get_init_inputs``),
``model_new.py`` (the solution: ``ModelNew``) and optionally ``kernels/`` (CUDA/C++ sources with
their pybind11 bindings, built as the torch extension ``solution_ext`` that ``model_new.py``
imports). Standard library and torch only, like the rest of the worker.

Stages, each one verdict row: ``build`` (extension + imports), ``correctness`` (state dict,
``trials`` fresh input draws compared at atol/rtol, a repeat run on the same inputs, inputs left
untouched, plain tensors out, and in strict mode no ``torch.nn.functional`` call and no Python
-level torch compute inside ``ModelNew``), ``timing`` (eager reference, ``torch.compile``
reference and solution: warm-up, then a fresh input set for every timed call, L2 flushed,
CUDA events around the call with a full-device synchronise before the end event so work on
other streams counts, and the last timed call's output checked against the reference).

The timing primitives are bound here, when the harness is imported and before any solution
code runs, so a solution that patches ``torch.cuda.Event`` or ``torch.cuda.synchronize``
patches nothing the harness uses.
"""

from __future__ import annotations

import contextlib
import glob
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from opsynth.filters.candidate_load import draw_inputs, load_module
from opsynth.filters.failures import exception_text
from opsynth.filters.gpu_sections import compile_locked, gpu_lock

Event = torch.cuda.Event
synchronize = torch.cuda.synchronize
perf_counter = time.perf_counter
# Every callable of torch.nn.functional, by identity: many are C builtins whose __module__
# is not torch.nn.functional (F.gelu is torch._C._nn.gelu).
FUNCTIONAL = {id(obj) for obj in vars(torch.nn.functional).values() if callable(obj)}
Emit = Callable[[dict[str, Any]], None]

TASK_FILE = "candidate.py"
TASK_MODULE = "opsynth_task"
SOLUTION_FILE = "model_new.py"
KERNELS_DIR = "kernels"
EXTENSION_NAME = "solution_ext"
SOURCE_SUFFIXES = (".cu", ".cpp", ".cc")
DETAIL_LIMIT = 2000

# Torch functions ModelNew.forward may call from Python: shape queries, views, allocation and
# layout; everything else is compute that a kernel should be doing.
NON_COMPUTE = frozenset(
    {
        "__get__",
        "__len__",
        "__getitem__",
        "__format__",
        "__repr__",
        "__bool__",
        "size",
        "dim",
        "stride",
        "numel",
        "nelement",
        "element_size",
        "data_ptr",
        "storage_offset",
        "is_contiguous",
        "contiguous",
        "view",
        "view_as",
        "reshape",
        "flatten",
        "unsqueeze",
        "squeeze",
        "expand",
        "permute",
        "transpose",
        "t",
        "empty",
        "empty_like",
        "new_empty",
        "empty_strided",
        "get_device",
        "is_floating_point",
        "type",
    }
)


class Rejected(Exception):
    def __init__(self, reason: str, detail: str, **measures: Any) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail, self.measures = reason, detail, measures


class Guard(TorchFunctionMode):
    """Sees every torch function ModelNew calls from Python. Strict: a ``torch.nn.functional``
    call or a compute op raises; lenient: they are only counted (harness sanity runs use it
    to score the reference itself as a solution)."""

    def __init__(self, strict: bool) -> None:
        super().__init__()
        self.strict = strict
        self.functional: list[str] = []
        self.compute: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if id(func) in FUNCTIONAL:
            self.functional.append(name)
            if self.strict:
                raise Rejected("functional_call", f"ModelNew called torch.nn.functional.{name}")
        elif name not in NON_COMPUTE:
            self.compute.append(name)
            if self.strict:
                raise Rejected("torch_compute", f"ModelNew.forward ran torch op {name!r}")
        return func(*args, **(kwargs or {}))


class Session:
    """The task, the solution and the state passed from stage to stage."""

    def __init__(self, workdir: str, settings: dict[str, Any]) -> None:
        self.workdir = workdir
        self.s = settings
        self.device = torch.device(settings.get("device", "cpu"))
        self.task: Any = None
        self.solution: Any = None
        self.model: torch.nn.Module | None = None
        self.new: torch.nn.Module | None = None
        self.guard = Guard(bool(settings.get("strict", True)))

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            synchronize()

    def draw(self, seed: int) -> list[Any]:
        torch.manual_seed(seed)
        raw = draw_inputs(self.task.get_inputs, self.device, seed)
        return [x.to(self.device) if torch.is_tensor(x) else x for x in raw]

    def run_new(self, inputs: list[Any], guarded: bool = True) -> Any:
        with torch.no_grad(), self.guard if guarded else contextlib.nullcontext():
            return self.new(*inputs)

    def run_ref(self, inputs: list[Any]) -> Any:
        with torch.no_grad():
            return self.model(*inputs)


def run_solution(workdir: str, settings: dict[str, Any], emit: Emit) -> None:
    """Every stage on the (task, solution) in ``workdir``; reports through ``emit``."""
    session = Session(workdir, settings)
    stages: dict[str, Callable[[Session], dict[str, Any]]] = {
        "build": stage_build,
        "correctness": stage_correctness,
        "timing": stage_timing,
    }
    for name in settings.get("stages") or stages:
        emit({"event": "stage", "stage": name})
        start = perf_counter()
        try:
            # correctness is GPU work from end to end: shared, so no timed run overlaps it
            shared = name == "correctness"
            with _gpu(session, exclusive=False) if shared else contextlib.nullcontext():
                row = _row(name, True, "ok", "", stages[name](session))
        except Rejected as rejected:
            row = _row(name, False, rejected.reason, rejected.detail, rejected.measures)
        except BaseException as exc:  # solution code may raise anything, SystemExit included
            row = _row(name, False, _classify(exc, name), _describe(exc), {})
        row["elapsed_s"] = round(perf_counter() - start, 6)
        emit({"event": "verdict", "verdict": row})
        if not row["passed"]:
            break
    emit({"event": "done"})


# ------------------------------------------------------------------------------------ stages


def stage_build(s: Session) -> dict[str, Any]:
    start = perf_counter()
    pattern = os.path.join(s.workdir, KERNELS_DIR, "**", "*")
    sources = sorted(p for p in glob.glob(pattern, recursive=True) if p.endswith(SOURCE_SUFFIXES))
    if sources:
        from torch.utils import cpp_extension

        build_dir = os.path.join(s.workdir, "build")
        os.makedirs(build_dir, exist_ok=True)
        try:
            module = cpp_extension.load(
                name=EXTENSION_NAME,
                sources=sources,
                build_directory=build_dir,
                extra_cflags=["-O3"],
                extra_cuda_cflags=["-O3"],
                verbose=False,
            )
        except BaseException as exc:
            raise Rejected("build_error", _describe(exc)) from exc
        sys.modules[EXTENSION_NAME] = module
    built_s = perf_counter() - start
    load_task(s)
    try:
        s.solution = load_module(os.path.join(s.workdir, SOLUTION_FILE), "model_new")
    except BaseException as exc:
        raise Rejected("solution_import_error", _describe(exc)) from exc
    if not isinstance(getattr(s.solution, "ModelNew", None), type):
        raise Rejected("solution_import_error", "model_new.py defines no class ModelNew")
    return {"sources": len(sources), "build_s": round(built_s, 3)}


def load_task(s: Session) -> None:
    task_file = str(s.s.get("task_file", TASK_FILE))  # the trainer's workdir names it model.py
    s.task = load_module(os.path.join(s.workdir, task_file), TASK_MODULE)


def build_reference(s: Session) -> list[Any]:
    """``Model`` from the task's init inputs, seeded; the init inputs."""
    init = s.task.get_init_inputs()
    torch.manual_seed(0)
    s.model = s.task.Model(*init).to(s.device).eval()
    return init


def build_models(s: Session) -> None:
    """``Model`` and ``ModelNew`` from the task's init inputs, both seeded alike, the
    solution given the reference's weights."""
    init = build_reference(s)
    torch.manual_seed(0)
    try:
        s.new = s.solution.ModelNew(*init).to(s.device).eval()
    except BaseException as exc:
        raise Rejected("solution_import_error", f"ModelNew(*init): {_describe(exc)}") from exc
    if isinstance(s.new, s.task.Model):
        raise Rejected("incorrect", "ModelNew is a subclass of Model")
    try:
        s.new.load_state_dict(s.model.state_dict())
    except BaseException as exc:
        raise Rejected("state_dict_mismatch", _describe(exc)) from exc


def stage_correctness(s: Session) -> dict[str, Any]:
    build_models(s)
    atol, rtol = float(s.s.get("atol", 1e-2)), float(s.s.get("rtol", 1e-2))
    worst = 0.0
    for trial in range(int(s.s.get("trials", 5))):
        inputs = s.draw(1000 + trial)
        pristine = _clone(inputs)
        expected = _flatten(s.run_ref(_clone(inputs)), "Model")
        got = _flatten(s.run_new(inputs), "ModelNew")
        s.sync()
        worst = max(worst, _compare(expected, got, atol, rtol, f"trial {trial}"))
        if not _same(pristine, inputs):
            raise Rejected("input_mutated", f"trial {trial}: ModelNew changed its inputs")
    inputs = s.draw(999)
    first = [t.clone() for t in _flatten(s.run_new(inputs), "ModelNew")]
    second = _flatten(s.run_new(inputs), "ModelNew")
    s.sync()
    for i, (a, b) in enumerate(zip(first, second, strict=True)):
        if not torch.allclose(a, b, atol=1e-5, rtol=1e-5, equal_nan=True):
            raise Rejected("unstable_output", f"output {i} differs between two identical runs")
    return {
        "trials": int(s.s.get("trials", 5)),
        "max_abs_diff": worst,
        "functional_calls": len(s.guard.functional),
        "torch_compute_calls": len(s.guard.compute),
        "torch_ops_seen": sorted(set(s.guard.compute))[:20],
    }


def stage_timing(s: Session) -> dict[str, Any]:
    if not s.cuda and not s.s.get("time_on_cpu", False):
        return {"timed": False}
    sets = [s.draw(2000 + i) for i in range(int(s.s.get("input_sets", 4)))]
    runs, warmup = int(s.s.get("timed_runs", 50)), int(s.s.get("warmup_runs", 5))
    eager_ms = _time(s, s.run_ref, sets, runs, warmup)
    # its graphs run inside the GPU's shared section, inductor's config benchmarks included, so
    # no other worker's timed section overlaps them; the compile itself stays outside the lock
    shared = (lambda: _gpu(s, exclusive=False)) if s.s.get("lock_dir") and s.cuda else None
    compiled = compile_locked(s.model, shared)
    start = perf_counter()
    with torch.no_grad():
        compiled(*sets[0])
    compile_s = perf_counter() - start
    compile_ms = _time(s, lambda xs: compiled(*xs), sets, runs, warmup)
    solution_ms = _time(s, s.run_new, sets, runs, warmup)
    last = sets[(runs - 1) % len(sets)]
    atol, rtol = float(s.s.get("atol", 1e-2)), float(s.s.get("rtol", 1e-2))
    replay = _flatten(s.run_new(last), "ModelNew")
    expected = _flatten(s.run_ref(last), "Model")
    try:
        _compare(expected, replay, atol, rtol, "a timed input set")
    except Rejected as exc:
        raise Rejected("replayed_output", exc.detail) from exc
    return {
        "timed": True,
        "device_name": torch.cuda.get_device_name() if s.cuda else "cpu",
        "eager_ms": round(eager_ms, 6),
        "compile_ms": round(compile_ms, 6),
        "solution_ms": round(solution_ms, 6),
        "compile_s": round(compile_s, 3),
        "timed_runs": runs,
    }


# ----------------------------------------------------------------------------------- helpers


def _gpu(s: Session, *, exclusive: bool) -> contextlib.AbstractContextManager[None]:
    """The GPU's lock (``filters.gpulock``): exclusive for timed calls, else shared."""
    lock_dir = str(s.s.get("lock_dir", "")) if s.cuda else ""
    batch = bool(s.s.get("batch_timers", True))
    return gpu_lock(lock_dir, s.device, exclusive=exclusive, batch_timers=batch)


def _time(s: Session, fn: Callable[[list[Any]], Any], sets: list, runs: int, warmup: int) -> float:
    """Median ms; each call gets the next input set (prepared before timing started). On a GPU
    the timed calls hold its lock exclusively, as the filters' timing does, so scoring on a
    pool of workers times each solution with the GPU to itself."""
    with _gpu(s, exclusive=False):
        for i in range(warmup):
            fn(sets[i % len(sets)])
        s.sync()
    flush = torch.empty(64 << 20, dtype=torch.int8, device=s.device) if s.cuda else None
    with _gpu(s, exclusive=True):
        return statistics.median(_timed_calls(fn, sets, runs, flush))


def _timed_calls(fn: Callable[[list[Any]], Any], sets: list, runs: int, flush: Any) -> list:
    times = []
    for i in range(runs):
        inputs = sets[i % len(sets)]
        if flush is not None:
            flush.zero_()
            synchronize()
            begin, end = Event(enable_timing=True), Event(enable_timing=True)
            begin.record()
            fn(inputs)
            synchronize()  # every stream, not just the current one
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end))
        else:
            t0 = perf_counter()
            fn(inputs)
            times.append((perf_counter() - t0) * 1e3)
    return times


def _flatten(out: Any, who: str) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        if type(out) is not torch.Tensor and not isinstance(out, torch.nn.Parameter):
            raise Rejected("not_a_tensor", f"{who} returned a {type(out).__name__}")
        return [out]
    if isinstance(out, list | tuple) and out:
        return [t for item in out for t in _flatten(item, who)]
    raise Rejected("not_a_tensor", f"{who} returned {type(out).__name__}, not tensors")


def _compare(
    expected: list[torch.Tensor], got: list[torch.Tensor], atol: float, rtol: float, where: str
) -> float:
    if len(expected) != len(got):
        raise Rejected("incorrect", f"{where}: {len(got)} outputs, expected {len(expected)}")
    worst = 0.0
    for i, (e, g) in enumerate(zip(expected, got, strict=True)):
        if e.shape != g.shape or e.dtype != g.dtype:
            raise Rejected(
                "incorrect",
                f"{where}: output {i} is {g.dtype}{tuple(g.shape)}, "
                f"expected {e.dtype}{tuple(e.shape)}",
            )
        if g.device != e.device:
            raise Rejected("incorrect", f"{where}: output {i} is on {g.device}, not {e.device}")
        diff = (e.double() - g.double()).abs()
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
        if not torch.allclose(g, e, atol=atol, rtol=rtol, equal_nan=False):
            raise Rejected(
                "incorrect", f"{where}: output {i} differs by up to {worst:.4g}", max_abs_diff=worst
            )
    return worst


def _clone(inputs: list[Any]) -> list[Any]:
    return [x.clone() if torch.is_tensor(x) else x for x in inputs]


def _same(a: list[Any], b: list[Any]) -> bool:
    return all(not torch.is_tensor(x) or torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _row(stage: str, passed: bool, reason: str, detail: str, measures: dict) -> dict[str, Any]:
    return {
        "stage": stage,
        "passed": passed,
        "reason": reason,
        "detail": detail[:DETAIL_LIMIT],
        "measures": measures,
    }


def _classify(exc: BaseException, stage: str) -> str:
    text = exception_text(exc)
    if "CUDA error" in text or "device-side assert" in text or "illegal memory" in text:
        return "cuda_error"
    if isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in text:
        return "oom"
    # A solution that raises while being checked or timed is not a correct solution.
    return "solution_import_error" if stage == "build" else "incorrect"


def _describe(exc: BaseException) -> str:
    return exception_text(exc)[:DETAIL_LIMIT]
