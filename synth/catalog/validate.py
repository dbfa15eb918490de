"""Validate a spec by running the task it renders: meta device first, then a real CPU run.

The rendered source is what ships, so it is what runs: ``Model(*get_init_inputs())`` built
under the meta device and called on meta copies of ``get_inputs()`` gives the shapes; a CPU
run must agree with them (when meta could run it), return tensors, and stay finite. Two CPU
runs under different RNG seeds flag a stochastic operator; an input changed by the forward
flags an in-place one. With ``fill_uninitialized`` the CPU runs fill memory torch hands out
uninitialized (``torch.empty`` and kin) with NaN, so an operator whose output is such memory
is rejected every time, not only when the allocator held something non-finite. This runs
inside the per-library extraction subprocess.
"""

from __future__ import annotations

import signal
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from opsynth.record import Task, Verdict, content_id
from opsynth.synth.catalog.probe import output_shapes, tensors_of
from opsynth.synth.catalog.reasons import OK, check
from opsynth.synth.catalog.render import render_code
from opsynth.synth.catalog.serialize import spec_to_json
from opsynth.synth.catalog.spec import CatalogSpec

COMPOSER = "seed-catalog"
# What extraction and seed validation make of a library, apart from its version: raised when
# they change what a catalogue holds; a seed's composer version, and part of a cached
# catalogue's key. Not the composer's version (``synth.__version__``), which changes how seeds
# are chained, not which seeds there are: a new composer would otherwise re-extract every
# cached catalogue on every host into the same files (benchmarks/bench_seeds.py times one).
CATALOGUE_VERSION = 1
STAGE = "seeds"


class SeedTimeout(Exception):
    pass


class Rejected(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = check(reason), detail


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """SIGALRM-based wall clock for one seed (the extraction worker is single-threaded)."""

    def expire(signum: int, frame: Any) -> None:
        raise SeedTimeout(f"over {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _load(code: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "opsynth_seed"}
    exec(compile(code, "<seed>", "exec"), namespace)
    return namespace


def _to_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty_like(value, device="meta")
    if isinstance(value, list | tuple):
        return type(value)(_to_meta(v) for v in value)
    return value


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, list | tuple):
        return type(value)(_clone(v) for v in value)
    return value


def _same(a: Any, b: Any) -> bool:
    ta, tb = tensors_of(a), tensors_of(b)
    return len(ta) == len(tb) and all(
        x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)
        for x, y in zip(ta, tb, strict=True)
    )


def meta_shapes(ns: dict[str, Any]) -> tuple[list[list[int]] | None, str]:
    try:
        with torch.device("meta"):
            model = ns["Model"](*ns["get_init_inputs"]())
        with torch.no_grad():
            return output_shapes(model(*_to_meta(list(ns["get_inputs"]())))), ""
    except Exception as exc:  # meta coverage is partial; the CPU run decides
        return None, f"{type(exc).__name__}: {str(exc)[:200]}"


@contextmanager
def uninitialized_filled(fill: bool) -> Iterator[None]:
    """Inside, memory torch allocates without initializing reads as NaN (integers: their
    largest value), through deterministic mode's ``fill_uninitialized_memory``; operators
    without a deterministic kernel only warn, and the warnings are dropped. Restored after."""
    if not fill:
        yield
        return
    import torch.utils.deterministic as deterministic

    was = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        deterministic.fill_uninitialized_memory,
    )
    torch.use_deterministic_algorithms(True, warn_only=True)
    deterministic.fill_uninitialized_memory = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        torch.use_deterministic_algorithms(was[0], warn_only=was[1])
        deterministic.fill_uninitialized_memory = was[2]


def cpu_run(ns: dict[str, Any]) -> dict[str, Any]:
    torch.manual_seed(0)
    try:
        model = ns["Model"](*ns["get_init_inputs"]())
        inputs = list(ns["get_inputs"]())
    except Exception as exc:
        raise Rejected("init_error", f"{type(exc).__name__}: {str(exc)[:300]}") from exc
    originals = _clone(inputs)
    try:
        with torch.no_grad():
            torch.manual_seed(1)
            first = model(*inputs)
            mutated = not _same(inputs, originals)
            torch.manual_seed(2)
            second = model(*_clone(originals))
    except Exception as exc:
        raise Rejected("forward_error", f"{type(exc).__name__}: {str(exc)[:300]}") from exc
    try:
        shapes = output_shapes(first)
    except TypeError as exc:
        raise Rejected("bad_output", str(exc)) from exc
    floats = [t for t in tensors_of(first) if t.dtype.is_floating_point or t.is_complex()]
    if not all(torch.isfinite(t).all() for t in floats):
        raise Rejected("nonfinite_output", "NaN or inf on random inputs")
    return {
        "output_shapes": shapes,
        "output_dtypes": [str(t.dtype).removeprefix("torch.") for t in tensors_of(first)],
        "input_shapes": [list(t.shape) for t in tensors_of(inputs)],
        "stochastic": not _same(first, second),
        "inplace": mutated,
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def describe(spec: CatalogSpec) -> dict[str, Any]:
    return {
        "library": spec.library,
        "name": spec.name,
        "kind": spec.kind,
        "family": spec.family,
        "flags": list(spec.flags),
    }


def _verdict(spec: CatalogSpec, task_id: str, reason: str, detail: str, t0: float) -> Verdict:
    return Verdict(
        task_id=task_id,
        stage=STAGE,
        passed=reason == OK,
        reason=reason,
        detail=detail,
        measures=describe(spec),
        device="cpu",
        torch_version=torch.__version__,
        elapsed_s=round(time.perf_counter() - t0, 4),
    )


def rejection(spec: CatalogSpec, reason: str, detail: str, t0: float | None = None) -> Verdict:
    """A verdict for a seed that is not a task; its id hashes the library and the name."""
    task_id = content_id("", [spec.name], spec.source)
    return _verdict(spec, task_id, check(reason), detail, t0 or time.perf_counter())


def validate(
    spec: CatalogSpec, timeout_s: float, fill_uninitialized: bool = True
) -> tuple[Task | None, Verdict]:
    """The seed ``spec`` renders, or None, and its verdict (``seeds.fill_uninitialized``:
    see the module doc)."""
    t0 = time.perf_counter()
    if spec.reason:
        return None, rejection(spec, spec.reason, spec.detail, t0)
    try:
        with deadline(timeout_s):
            code = render_code(spec)
            ns = _load(code)
            shapes, meta_error = meta_shapes(ns)
            with uninitialized_filled(fill_uninitialized):
                run = cpu_run(ns)
    except SeedTimeout as exc:
        return None, rejection(spec, "seed_timeout", str(exc), t0)
    except Rejected as exc:
        return None, rejection(spec, exc.reason, exc.detail, t0)
    except Exception as exc:
        return None, rejection(spec, "init_error", f"{type(exc).__name__}: {str(exc)[:300]}", t0)
    if shapes is not None and shapes != run["output_shapes"]:
        detail = f"meta {shapes} vs cpu {run['output_shapes']}"
        return None, rejection(spec, "meta_mismatch", detail, t0)
    flags = sorted(set(spec.flags) | {f for f in ("stochastic", "inplace") if run.pop(f)})
    first = run["input_shapes"][0] if run["input_shapes"] else None
    seed = {
        **describe(spec),
        "flags": flags,
        **run,
        "meta_shapes": shapes,
        "meta_error": meta_error,
        "preserves_shape": first is not None and run["output_shapes"] == [first],
        "init_args": {name: repr(value) for name, value in spec.init},
        "spec": spec_to_json(spec),
        **spec.evidence,
    }
    task = Task(
        ops=[spec.name],
        data_source=spec.source,
        code=code,
        composer=COMPOSER,
        composer_version=str(CATALOGUE_VERSION),
        meta={"seed": seed},
    )
    task.seed_ids = [task.id]
    return task, _verdict(spec, task.id, OK, "", t0)
