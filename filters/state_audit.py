"""What a candidate left changed in its process, so a process takes another candidate only if
it left nothing behind that could change that candidate's verdict.

Why reuse processes at all: every candidate in a fresh process needs a CUDA context of its own,
and a host's driver creates them one at a time (``benchmarks/context_creation.py``: 4.5/s on an
idle H200 host, about 2.5/s under the filters' load), which caps a host near 150 candidates a
minute whatever its GPUs. A process that runs several candidates pays one context for them all.

What is audited, before a candidate and after its cleanup (``snapshot`` / ``differences``):

- torch's global switches that change numerics, algorithm choice or autograd (cuDNN and TF32
  flags, matmul precision, default dtype and device, grad and inference mode, deterministic
  algorithms, anomaly mode, autocast, thread counts, scaled-dot-product backends, torch
  function and dispatch mode stacks);
- who is who in the modules and classes a candidate or the checks call (``torch``,
  ``torch.nn.functional``, ``torch.Tensor``, ``torch.nn.Module`` and every class in
  ``torch.nn``, ``torch.cuda``, ``torch.cuda.Event``, the checks' own standard-library
  modules, and every ``opsynth`` module the process has loaded: the checks, their
  comparisons, the lock, the audit itself): a callable replaced, or any attribute added that is
  not a submodule;
- the process's threads.

Anything different retires the process; the next candidate gets a fresh one. What this cannot
see is state outside Python attributes (native memory written through a forbidden route); the
static pre-check refuses ``ctypes``, ``os``, ``sys`` and dunder introspection, the routes there.

Standard library and torch only: this runs in the sandboxed candidate process.
"""

from __future__ import annotations

import builtins
import contextlib
import gc
import linecache
import math
import os
import random
import statistics
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

Snapshot = dict[str, Any]

# The seed of a fresh process's CUDA generator (torch's default_rng_seed_val): a candidate whose
# constructor draws on the GPU gets the weights it would get in a fresh process.
FRESH_CUDA_SEED = 67280421310721
# A process whose resident memory grew by more than this share of the per-candidate memory limit
# since its baseline is retired: what it keeps would count against the next candidate's limit.
# Growth, not the total: a CUDA process holds 1-3 GiB (context, cuBLAS, cuDNN, inductor) before
# any candidate, as a fresh one does.
RESIDENT_SHARE = 0.25
# Threads torch starts and stops on its own while compiling: tqdm's monitor runs while one of
# inductor's progress bars is open and only redraws it. Candidates cannot import threading
# (filters.static_check), so a thread of this name is torch's.
HARNESS_THREADS = frozenset({"tqdm_monitor"})
# Attributes Python sets on a class as a cache: copyreg records ``__slotnames__`` the first
# time an instance is copied or pickled (``copy.copy`` of a tensor does).
CACHE_ATTRIBUTES = frozenset({"__slotnames__"})


def _switches() -> dict[str, Callable[[], Any]]:
    """Name -> getter of each global switch; a getter this torch lacks is left out."""
    cuda = torch.backends.cuda
    found: dict[str, Callable[[], Any]] = {
        "cudnn.enabled": lambda: torch.backends.cudnn.enabled,
        "cudnn.benchmark": lambda: torch.backends.cudnn.benchmark,
        "cudnn.deterministic": lambda: torch.backends.cudnn.deterministic,
        "cudnn.allow_tf32": lambda: torch.backends.cudnn.allow_tf32,
        "matmul.allow_tf32": lambda: cuda.matmul.allow_tf32,
        "matmul.fp16_reduced_precision": lambda: cuda.matmul.allow_fp16_reduced_precision_reduction,
        "matmul.bf16_reduced_precision": lambda: cuda.matmul.allow_bf16_reduced_precision_reduction,
        "float32_matmul_precision": torch.get_float32_matmul_precision,
        "default_dtype": torch.get_default_dtype,
        "grad_enabled": torch.is_grad_enabled,
        "inference_mode": torch.is_inference_mode_enabled,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled,
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled,
        "anomaly": torch.is_anomaly_enabled,
        "num_threads": torch.get_num_threads,
        "num_interop_threads": torch.get_num_interop_threads,
        "flash_sdp": cuda.flash_sdp_enabled,
        "mem_efficient_sdp": cuda.mem_efficient_sdp_enabled,
        "math_sdp": cuda.math_sdp_enabled,
        "torch_function_modes": torch._C._len_torch_function_stack,
        "dispatch_modes": torch._C._len_torch_dispatch_stack,
    }
    if hasattr(torch, "get_default_device"):
        found["default_device"] = lambda: str(torch.get_default_device())
    for device in ("cpu", "cuda"):
        found[f"autocast.{device}"] = _autocast_getter(device)
    return found


def _autocast_getter(device: str) -> Callable[[], Any]:
    def enabled() -> Any:
        try:
            return torch.is_autocast_enabled(device)
        except TypeError:  # older torch: no device argument
            return torch.is_autocast_enabled() if device == "cuda" else None

    return enabled


def _namespaces() -> Iterator[tuple[str, Any]]:
    """Every module and class whose attributes are audited, by a stable name."""
    yield "torch", torch
    yield "torch.nn.functional", torch.nn.functional
    yield "torch.nn.init", torch.nn.init
    yield "torch.cuda", torch.cuda
    yield "torch.Tensor", torch.Tensor
    yield "torch.cuda.Event", torch.cuda.Event
    for module in (builtins, math, random, statistics, time, threading):
        yield module.__name__, module
    for name, value in sorted(vars(torch.nn).items()):
        if isinstance(value, type):
            yield f"torch.nn.{name}", value
    # The harness's own modules: a candidate that replaced a check's function in a reused
    # process would fool the in-process checks of every later candidate there.
    for name, module in sorted(sys.modules.items()):
        if isinstance(module, types.ModuleType) and name.partition(".")[0] == "opsynth":
            yield name, module


def _identities(namespace: Any) -> dict[str, tuple[int, bool]]:
    """attribute -> (id, whether it is callable or a class), submodules left out: importing a
    submodule (torch.compile imports ``torch._dynamo``) sets it as an attribute."""
    found = {}
    for name, value in list(vars(namespace).items()):
        if isinstance(value, types.ModuleType):
            continue
        found[name] = (id(value), callable(value) or isinstance(value, type))
    return found


def prepare(device: str) -> None:
    """Compile and run a tiny model once, before the baseline is taken. A process's first
    ``torch.compile`` patches torch for good (dynamo wraps ``torch.manual_seed`` and
    ``nn.Module.__init__``/``__setstate__``, and a progress monitor thread starts): done by
    the harness, not by a candidate, and never again, so it belongs in the baseline."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).to(device)
    with torch.no_grad():
        torch.compile(model)(torch.ones(2, 8, device=device))
    torch._dynamo.reset()


def snapshot(device: str = "cpu") -> Snapshot:
    """The audited state now. Taken once per process before its first candidate; each later
    snapshot is compared with that one."""
    switches = {}
    for name, getter in _switches().items():
        try:
            switches[name] = repr(getter())
        except Exception as exc:  # a getter this build cannot answer is recorded as such
            switches[name] = f"<{type(exc).__name__}>"
    return {
        "switches": switches,
        "identities": {name: _identities(ns) for name, ns in _namespaces()},
        "threads": sorted(_thread_names()),
        "resident": _resident_bytes(),
        "device_allocated": _device_allocated() if device == "cuda" else 0,
    }


def _thread_names() -> list[str]:
    """Python threads by name, counters masked (``ThreadPoolExecutor-3_0``): a thread of the
    harness's that ended and another of the same kind that started are no change."""
    return [_mask_counters(t.name) for t in threading.enumerate()]


def _mask_counters(name: str) -> str:
    return "".join("N" if ch.isdigit() else ch for ch in name)


def _device_allocated() -> int:
    """Device memory held by live tensors, once cuBLAS's per-stream workspaces (allocated
    through the caching allocator, kept until cleared) are given back."""
    try:
        torch.cuda.synchronize()
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()
        torch.cuda.empty_cache()
        return int(torch.cuda.memory_allocated())
    except Exception:  # a sticky CUDA error: after_candidate's device check says so
        return -1


def _device_tensors() -> list[torch.Tensor]:
    """Device tensors Python still references (not those only C++ holds)."""
    found = []
    for obj in gc.get_objects():
        with contextlib.suppress(Exception):
            if isinstance(obj, torch.Tensor) and obj.is_cuda:
                found.append(obj)
    return found


def differences(before: Snapshot, after: Snapshot) -> list[str]:
    """What changed, one short line each; empty when the process can take another candidate.
    A callable or class replaced, and any attribute added, count; a plain value changed does
    not (torch keeps counters and lazily set caches in module attributes)."""
    found = []
    for name, value in before["switches"].items():
        now = after["switches"].get(name)
        if now != value:
            found.append(f"{name}: {value} -> {now}")
    # A thread that ended is no harm; one that is new may still be running candidate code.
    remaining = list(before.get("threads", []))
    for name in after.get("threads", []):
        if name in remaining:
            remaining.remove(name)
        elif name not in HARNESS_THREADS:
            found.append(f"thread started: {name}")
    for namespace, old in before["identities"].items():
        new = after["identities"].get(namespace)
        if new is None:
            found.append(f"{namespace}: gone")
            continue
        for attr, (ident, is_callable) in old.items():
            if attr not in new:
                found.append(f"{namespace}.{attr}: deleted")
            elif is_callable and new[attr][0] != ident:
                found.append(f"{namespace}.{attr}: replaced")
        for attr in new.keys() - old.keys() - CACHE_ATTRIBUTES:
            found.append(f"{namespace}.{attr}: added")
    for namespace in after["identities"].keys() - before["identities"].keys():
        found.append(f"{namespace}: added")
    return sorted(found)


def after_candidate(baseline: Snapshot, settings: dict[str, Any], device: str) -> list[str]:
    """Clean up after a candidate (its module, dynamo's caches, the allocator's cache, the
    CUDA generator and peak statistics) and say what it left behind; empty when this
    process may take another candidate."""
    sys.modules.pop("candidate", None)
    linecache.clearcache()
    os.chdir("/")  # the worker wipes the candidate's dir
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()
    gc.collect()
    now = snapshot(device)
    why = differences(baseline, now)
    from opsynth.filters import gpulock

    if gpulock.held():
        why.append("a GPU lock section is still held")
    if device == "cuda":
        try:
            left = now["device_allocated"] - int(baseline.get("device_allocated", 0))
            if now["device_allocated"] >= 0 and left > 0:
                tensors = _device_tensors()
                why.append(
                    f"{left} bytes of device memory still allocated "
                    f"({len(tensors)} device tensors referenced from Python)"
                )
            torch.cuda.reset_peak_memory_stats()
            torch.cuda.manual_seed(FRESH_CUDA_SEED)
            if float(torch.ones(64, device="cuda").sum()) != 64.0:
                why.append("the device computes wrong sums")
        except Exception as exc:  # a sticky CUDA error: this context is done
            why.append(f"the device fails: {type(exc).__name__}: {str(exc)[:200]}")
    grown = now["resident"] - int(baseline.get("resident", 0))
    limit = int(settings.get("memory_limit_bytes", 8 << 30))
    if grown > RESIDENT_SHARE * limit:
        why.append(f"resident memory grew {grown >> 20} MiB > {RESIDENT_SHARE:.0%} of the limit")
    return why


def _resident_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
