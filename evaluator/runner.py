"""The sandboxed side of a judged evaluation: one process per role, answering the judge.

The ``evaluator`` harness's entry point (``evaluator.reasons.HARNESS``). The worker starts
two processes per (task, solution) pair, one after the other: ``reference`` builds the task's
``Model`` (and its ``torch.compile``), ``solution`` builds the solution (its extension,
``ModelNew`` with the reference's weights). Each then only draws inputs from the seeds it is
sent, runs forwards and hands over samples of its outputs (``filters.serve``); the judge
(``evaluator.judge``, in the worker) compares, times and decides. The solution's process
never holds a seed before the judge needs its output, nor anything of the reference's.

The in-process stages of ``evaluator.harness`` are reused for building; the agent's own
feedback commands (``trainer.commands``) run those stages directly.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from opsynth.evaluator.harness import (
    Rejected,
    Session,
    _classify,
    _flatten,
    _gpu,
    build_models,
    build_reference,
    load_task,
    stage_build,
)
from opsynth.evaluator.kernels import COUNT_LIMIT, NAME_LIMIT
from opsynth.filters.gpu_sections import compile_locked
from opsynth.filters.serve import Refusal, Runner

REFERENCE, SOLUTION = "reference", "solution"


def serve_role(workdir: str, settings: dict[str, Any], emit: Any) -> Any:
    """Report ``done`` at once (nothing of the job has run yet) and return what this role
    serves the judge with: the common requests plus ``load`` (and, for the reference,
    ``compile``; for the solution, ``guard``)."""
    session = Session(workdir, settings)
    role = str(settings.get("role", REFERENCE))
    emit({"event": "done"})
    forwards: dict[str, Any] = {}
    lock = (lambda: _gpu(session, exclusive=True)) if session.cuda else None
    # tensors inside list inputs are sampled too, so a solution writing one is seen
    runner = Runner(session.device, session.draw, forwards, lock, nested=True)
    handlers = runner.handlers()
    if role == SOLUTION:
        forwards["new"] = lambda xs, rng: _flatten(session.run_new(xs), "ModelNew")
        # timed calls: strict mode keeps the guard on (a fallback must not become possible
        # when timed); lenient mode, which only counts, leaves its per-call cost out
        strict = session.guard.strict
        forwards["new_timed"] = lambda xs, rng: _flatten(session.run_new(xs, strict), "ModelNew")
        handlers["load"] = lambda request: _load_solution(session)
        handlers["guard"] = lambda request: _guard_counts(session)
        handlers["kernels"] = lambda request: _kernels(session, runner)
    else:
        compiled: dict[str, Any] = {}
        forwards["eager"] = lambda xs, rng: _flatten(session.run_ref(xs), "Model")
        forwards["compiled"] = lambda xs, rng: _flatten(compiled["fn"](*xs), "Model")
        handlers["load"] = lambda request: _load_reference(session)
        handlers["compile"] = lambda request: _compile(session, runner, compiled)
    return handlers, _reason


def _reason(exc: BaseException) -> str:
    return exc.reason if isinstance(exc, Rejected) else _classify(exc, "correctness")


def _load_reference(s: Session) -> dict[str, Any]:
    load_task(s)
    build_reference(s)
    return {}


def _load_solution(s: Session) -> dict[str, Any]:
    try:
        measures = stage_build(s)
        build_models(s)
    except Rejected as exc:
        raise Refusal(exc.reason, exc.detail) from None
    return measures


def _compile(s: Session, runner: Runner, compiled: dict[str, Any]) -> dict[str, Any]:
    shared = (lambda: _gpu(s, exclusive=False)) if s.s.get("lock_dir") and s.cuda else None
    compiled["fn"] = compile_locked(s.model, shared)
    start = time.perf_counter()
    with torch.no_grad():
        compiled["fn"](*runner.inputs)
    s.sync()
    return {"compile_s": round(time.perf_counter() - start, 3)}


def _kernels(s: Session, runner: Runner) -> dict[str, Any]:
    """The names of the GPU kernels one forward on the drawn inputs launches, as the profiler
    saw them (``evaluator.kernels`` classifies them in the judge); none off the GPU."""
    if not s.cuda:
        return {"kernels": []}
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        s.run_new(runner.inputs)
        s.sync()
    events = trace.events()
    names = dict.fromkeys(
        e.name[:NAME_LIMIT] for e in events if str(e.device_type).endswith("CUDA")
    )
    return {"kernels": list(names)[:COUNT_LIMIT]}


def _guard_counts(s: Session) -> dict[str, Any]:
    return {
        "functional_calls": len(s.guard.functional),
        "torch_compute_calls": len(s.guard.compute),
        "torch_ops_seen": sorted(set(s.guard.compute))[:20],
    }
