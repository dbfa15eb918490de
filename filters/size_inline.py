"""Sizing inside a candidate's own filter process: measure the composed size and each size
the search asks for (``filters.sizing.Search``), then leave the chosen variant in the code
file for the filters' stages. Sized by separate probes, a candidate costs a sandboxed process,
and with it a CUDA context, per probe plus one for its verdict; a host creates contexts one at
a time, so that count, not GPU time, sets the rate (benchmarks/RESULTS.md). Here it costs one.

What the process reports (the eager row's ``sizing`` measure: the chosen value and the steps)
is the candidate's own claim, like everything else its process writes. The orchestrator uses
only the chosen value, checks it is one the search could choose, and rewrites the size literal
itself (``filters.sizing.claimed``); the stages and the judge's ``verify`` then decide on what
this process runs. ARCHITECTURE.md's threat model says what that leaves.

A probe that poisons the CUDA context (``cuda_error``) ends the search: the stages cannot run
in this process any more, so the claim says so (``poisoned``) and the orchestrator filters the
chosen variant in a fresh one. Standard library only; the child's checks do the measuring
(``filters.checks.probe``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import time
from collections.abc import Callable
from typing import Any

from opsynth.filters.sizing import Probe, RuleSettings, Search, find_knob, set_knob

# Measures the variant at a path under the given settings (``filters.checks.probe``): the
# probe, and the context's creation time when this was the process's first.
Measure = Callable[[str, dict[str, Any]], tuple[Probe, float | None]]

# The variant being measured; the chosen one is written over the candidate's own file.
PROBE_FILE = "probe.py"
# A probe's checks: build and run the model, then time it, with no window.
PROBE_STAGES = ("eager", "runtime")
# glibc's mallopt parameters, and the fixed values a CPU process that sizes inline sets.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES = 32 << 20, 1 << 30


def size_here(code_path: str, settings: dict[str, Any], measure: Measure) -> dict[str, Any] | None:
    """Size the candidate at ``code_path`` as ``settings["sizing"]`` asks
    (``filters.sizing.inline_settings``), rewrite the file to
    the chosen variant, and return the claim for the eager row; None when the job asks for no
    sizing or the code has no size constant."""
    spec = settings.get("sizing")
    if not spec:
        return None
    with open(code_path) as fh:
        code = fh.read()
    knob = find_knob(code, spec["constant_names"])
    if knob is None:
        return None
    start = time.perf_counter()
    if settings.get("device") != "cuda":
        steady_host_allocations()
    search = Search(knob.value, float(spec["target_ms"]), RuleSettings.from_json(spec["rule"]))
    probe_settings = {
        **settings,
        "stages": list(PROBE_STAGES),
        "window_ms": [0.0, 1e300],
        "warmup_runs": spec["warmup_runs"],
        "timed_runs": spec["timed_runs"],
        "timed_exclusive": bool(spec.get("exclusive", True)),
    }
    path = os.path.join(os.path.dirname(code_path), PROBE_FILE)
    value: int | None = knob.value
    poisoned = False
    device_init_s: float | None = None  # the first probe's wait for the process's context
    while value is not None:
        with open(path, "w") as fh:
            fh.write(set_knob(code, knob, value))
        probe, init_s = measure(path, probe_settings)
        device_init_s = device_init_s if device_init_s is not None else init_s
        poisoned = probe.reason == "cuda_error"  # no measurement: the search ends here
        value = search.observe(probe)
    chosen = search.chosen() or knob.value
    with open(code_path, "w") as fh:
        fh.write(set_knob(code, knob, chosen))
    claim: dict[str, Any] = {
        "chosen": chosen,
        "steps": search.steps,
        "seconds": round(time.perf_counter() - start, 4),
        "device_init_s": device_init_s or 0.0,
    }
    if poisoned:
        claim["poisoned"] = True
    return claim


def steady_host_allocations() -> None:
    """Fix glibc's mmap and trim thresholds in this process. By default a large allocation is
    mapped fresh (and page-faulted on every forward) until a free of that size raises the
    threshold, so on CPU a variant measured after a smaller one can read several times slower
    than the same variant in a fresh process, and slower than its own filter run right after.
    With fixed thresholds a forward's outputs reuse the heap whatever was measured before.
    Not glibc: nothing to do."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None)
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
