"""What one judged request costs a candidate's process while other processes share its GPU.

Run by hand on a GPU host, e.g.

    python -m benchmarks.request_latency --neighbours 0 7 15 --elements 67108864

``filters.verify`` talks to a candidate's process in requests (``filters.serve``): ``draw``
the inputs, ``run`` a forward, ``sample`` the outputs, each ending in a synchronisation. In a
run, fifteen other candidates' processes use the same GPU from their own CUDA contexts. This
times those requests the way serve makes them, in a process of their own, with N neighbour
processes each running forwards and synchronising in a loop, and also a forward and its
sample answered as one request (one synchronisation instead of two). Prints a markdown table:
per neighbour count and request, the median and 90th percentile milliseconds. On a CUDA
device a sample sums each output in one pass (``filters.fused_sums``); ``--torch-sums`` times
the torch operations it replaced.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from typing import Any

REQUESTS = ("draw", "run", "sample", "run_and_sample")
WARMUP = 2  # rounds run first and not recorded


def sync(device: str) -> None:
    """Wait for the device's work, as each of serve's requests does before it replies."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def forward(x: Any) -> Any:
    """A memory-bound forward of a few elementwise steps, as most sized tasks are."""
    import torch

    y = torch.tanh(x) * 2.0 + x
    return torch.sigmoid(y) * y.sin()


def neighbour(elements: int, device: str, stop: Any, ready: Any) -> None:  # pragma: no cover
    import torch

    x = torch.randn(elements, device=device)
    ready.release()
    while not stop.is_set():
        forward(x)
        sync(device)


def probe(
    elements: int, device: str, rounds: int, fused: bool, out: Any
) -> None:  # pragma: no cover
    import torch

    from opsynth.filters.serve import sample_tensor

    times: dict[str, list[float]] = {name: [] for name in REQUESTS}
    generator = torch.Generator(device=device)
    for k in range(rounds + WARMUP):
        steps = []
        start = time.perf_counter()
        generator.manual_seed(k)
        x = torch.randn(elements, device=device, generator=generator)
        sync(device)
        steps.append(("draw", time.perf_counter()))
        y = forward(x)
        sync(device)
        steps.append(("run", time.perf_counter()))
        sample_tensor(y, k, fused=fused)
        steps.append(("sample", time.perf_counter()))
        before = time.perf_counter()
        sample_tensor(forward(x), k, fused=fused)
        merged = time.perf_counter() - before
        if k < WARMUP:
            continue
        for name, at in steps:
            times[name].append((at - start) * 1e3)
            start = at
        times["run_and_sample"].append(merged * 1e3)
        del x, y
    out.put(times)


def sample_parts(elements: int, device: str, rounds: int) -> dict[str, float]:
    """Median milliseconds, alone on the device, of a sample's parts (``filters.serve``) on
    one tensor against the forward it samples: the whole sample as serve makes it (its sums
    fused into one pass on a CUDA device, ``filters.fused_sums``), the sums alone each way,
    and the torch path's parts: the sampled positions, the weights drawn for its checksums,
    the weighted sums and the two magnitudes."""
    import torch

    from opsynth.filters import serve
    from opsynth.filters.judge import CHECKSUMS, SAMPLE_POSITIONS

    f64 = torch.float64
    x = torch.randn(elements, device=device)
    y = forward(x)
    generator = torch.Generator(device=device)
    parts: dict[str, Any] = {
        "forward": lambda: forward(x),
        "sample (whole)": lambda: serve.sample_tensor(y, 1),
        "sums, torch operations": lambda: serve.torch_sums(
            y, generator, CHECKSUMS, magnitudes=True
        ),
        "positions": lambda: y[torch.randint(elements, (SAMPLE_POSITIONS,), device=device)],
        "weights": lambda: [
            torch.randn(elements, generator=generator, device=device) for _ in range(CHECKSUMS)
        ],
        "weighted sums": lambda: [(x * y).sum(dtype=f64) for _ in range(CHECKSUMS)],
        "magnitudes": lambda: (y.abs().sum(dtype=f64), y.square().sum(dtype=f64)),
    }
    if device == "cuda":
        parts["sums, fused"] = lambda: serve.fused_sums_of(y, 1, CHECKSUMS, magnitudes=True)
    found = {}
    for name, part in parts.items():
        times = []
        for _ in range(rounds + WARMUP):
            sync(device)
            start = time.perf_counter()
            part()
            sync(device)
            times.append((time.perf_counter() - start) * 1e3)
        found[name] = statistics.median(times[WARMUP:])
    return found


def measure(
    neighbours: int, elements: int, device: str, rounds: int, fused: bool = True
) -> dict[str, list[float]]:
    ctx = mp.get_context("spawn")
    stop, ready, results = ctx.Event(), ctx.Semaphore(0), ctx.Queue()
    others = [
        ctx.Process(target=neighbour, args=(elements, device, stop, ready))
        for _ in range(neighbours)
    ]
    for p in others:
        p.start()
    for _ in others:
        ready.acquire()
    prober = ctx.Process(target=probe, args=(elements, device, rounds, fused, results))
    prober.start()
    times = results.get()
    prober.join()
    stop.set()
    for p in others:
        p.join()
    return times


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def table(found: dict[int, dict[str, list[float]]]) -> str:
    lines = ["| neighbours | request | median ms | p90 ms |", "|---|---|---|---|"]
    for count, times in found.items():
        for name in REQUESTS:
            values = times[name]
            median, p90 = statistics.median(values), percentile(values, 0.9)
            lines.append(f"| {count} | {name} | {median:.2f} | {p90:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[int, dict[str, list[float]]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--neighbours", type=int, nargs="+", default=[0, 7, 15])
    parser.add_argument("--elements", type=int, default=1 << 26, help="floats per tensor")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--parts", action="store_true", help="also time a sample's parts alone")
    parser.add_argument(
        "--torch-sums", action="store_true", help="samples sum with torch operations (unfused)"
    )
    args = parser.parse_args(argv)
    if args.parts:
        parts = sample_parts(args.elements, args.device, args.rounds)
        print("\n".join(f"| {name} | {ms:.3f} ms |" for name, ms in parts.items()), flush=True)
    fused = not args.torch_sums
    found = {n: measure(n, args.elements, args.device, args.rounds, fused) for n in args.neighbours}
    print(table(found), flush=True)
    return found


if __name__ == "__main__":
    main()
