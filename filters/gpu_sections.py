"""GPU work under the host's GPU lock (``filters.gpulock``): the lock of a device, named so
every worker sharing the GPU shares it, and ``torch.compile`` whose compiled graphs run in the
lock's shared section. The filters' checks and the evaluator's harness both use these.

Standard library and torch only: this runs in the sandboxed candidate process.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from typing import Any

import torch

from opsynth.filters.gpulock import gpu_section, held


def gpu_lock(
    lock_dir: str, device: torch.device, *, exclusive: bool, batch_timers: bool = True
) -> contextlib.AbstractContextManager[None]:
    """The host-wide lock of ``device``'s GPU (``filters.gpulock``), named by its UUID so that
    workers seeing it under different ``CUDA_VISIBLE_DEVICES`` indices share it. No-op without
    a lock dir (CPU, or a process with nobody to exclude)."""
    if not lock_dir:
        return contextlib.nullcontext()
    ident = _gpu_ident(device)
    return gpu_section(lock_dir, ident, exclusive=exclusive, batch_timers=batch_timers)


@functools.cache
def _gpu_ident(device: torch.device) -> str:
    uuid = str(getattr(torch.cuda.get_device_properties(device), "uuid", ""))
    return _safe_name(uuid or os.environ.get("CUDA_VISIBLE_DEVICES", "0"))


def _safe_name(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)[:100]


def compile_locked(model: Any, shared: Callable[[], Any] | None) -> Any:
    """``torch.compile(model)`` (inductor, default mode) whose compiled graphs each run inside
    ``shared()``, the GPU's shared section. The first call compiles for seconds on the CPU,
    which must stay outside the lock (a queued timer would wait for it), then runs the graphs,
    where inductor also benchmarks the candidate configs of its kernels: GPU work a timer must
    not overlap. So the lock is taken around each compiled graph's run, not around the call.
    Eager code between graphs (a graph break) of that first call still runs unlocked. Without a
    section (CPU, a lone process) this is plain ``torch.compile``. The filters' compile stage
    and the evaluator's ``torch.compile`` reference both compile this way."""
    if shared is None:
        return torch.compile(model)
    inductor = torch._dynamo.lookup_backend("inductor")

    def backend(graph: Any, example_inputs: Any) -> Any:
        compiled = inductor(graph, example_inputs)

        def run(*args: Any) -> Any:
            if held():  # a timed or untimed section already covers this run
                return compiled(*args)
            with shared():
                return compiled(*args)

        # inductor may return a function that takes its arguments as one list; keep that
        run._boxed_call = getattr(compiled, "_boxed_call", False)  # type: ignore[attr-defined]
        return run

    return torch.compile(model, backend=backend)
