"""A fixed calibration micro-benchmark, to derive ``FiltersConfig.device_speed_factor``.

The runtime window (1-100 ms on a GPU) was applied to the released Ops-6K on H20 GPUs. A
faster GPU (an H200) measures the same task in fewer milliseconds, so a task at 1.5 ms on an
H20 might read 0.6 ms here and be dropped as ``too_fast``. ``device_speed_factor`` multiplies
measured milliseconds before the window check to emulate the reference device.

How to derive it:

1. On a reference-device host, run ``calibration_benchmark("cuda")`` (or
   ``WorkerPool(cfg, "cuda").calibrate()``) and store the returned dict.
2. On the local host, run the same, then ``speed_factor(local, reference)``: the geometric
   mean of reference_ms / local_ms over the benchmarks, > 1 when the local device is faster.
3. Put that number in ``[filters] device_speed_factor``. The default 1.0 means "no scaling".

The benchmarks are a small fixed mix of what Ops-6K tasks spend time on: a large matmul and a
convolution (compute bound), an elementwise chain, a row reduction and a softmax (memory
bound). Shapes are fixed per device kind, so numbers are comparable between hosts of the same
kind. Standard library and torch only: this runs inside a sandboxed worker.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch

Benchmark = Callable[[torch.device, bool], Callable[[], object]]


def _matmul(device: torch.device, small: bool) -> Callable[[], object]:
    n = 512 if small else 4096
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    return lambda: a @ b


def _conv2d(device: torch.device, small: bool) -> Callable[[], object]:
    batch = 1 if small else 32
    conv = torch.nn.Conv2d(64, 64, 3, padding=1).to(device)
    x = torch.randn(batch, 64, 56, 56, device=device)
    return lambda: conv(x)


def _elementwise(device: torch.device, small: bool) -> Callable[[], object]:
    x = torch.randn((1 << 20) if small else (1 << 26), device=device)
    return lambda: torch.nn.functional.gelu(x) * 2.0 + 1.0


def _reduction(device: torch.device, small: bool) -> Callable[[], object]:
    x = torch.randn(256 if small else 8192, 8192, device=device)
    return lambda: x.sum(dim=-1)


def _softmax(device: torch.device, small: bool) -> Callable[[], object]:
    x = torch.randn(256 if small else 8192, 4096, device=device)
    return lambda: torch.softmax(x, dim=-1)


BENCHMARKS: dict[str, Benchmark] = {
    "matmul_fp32": _matmul,
    "conv2d_fp32": _conv2d,
    "elementwise_fp32": _elementwise,
    "reduction_fp32": _reduction,
    "softmax_fp32": _softmax,
}


def calibration_benchmark(device: str, runs: int = 20, warmup: int = 3) -> dict[str, float]:
    """Median milliseconds of each benchmark on ``device`` ("cpu" or "cuda")."""
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    torch.manual_seed(0)
    results: dict[str, float] = {}
    with torch.no_grad():
        for name, make in BENCHMARKS.items():
            fn = make(dev, not cuda)
            for _ in range(warmup):
                fn()
            times = []
            for _ in range(runs):
                if cuda:
                    torch.cuda.synchronize()
                    begin = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    begin.record()
                    fn()
                    end.record()
                    end.synchronize()
                    times.append(float(begin.elapsed_time(end)))
                else:
                    start = time.perf_counter()
                    fn()
                    times.append((time.perf_counter() - start) * 1e3)
            results[name] = statistics.median(times)
    return results


def speed_factor(local: dict[str, float], reference: dict[str, float]) -> float:
    """Geometric mean of reference_ms / local_ms over the benchmarks both ran."""
    shared = [k for k in local if k in reference and local[k] > 0 and reference[k] > 0]
    if not shared:
        raise ValueError("no benchmark in common between local and reference results")
    return math.exp(sum(math.log(reference[k] / local[k]) for k in shared) / len(shared))
