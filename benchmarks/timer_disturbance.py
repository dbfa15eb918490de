"""Whether other processes' work moves a timed section's reading, one kind of work at a time.

    python3 -m benchmarks.timer_disturbance --device cuda --disturbers 15 --rounds 40 \\
        --mode idle --mode cpu --mode contexts --mode shared --mode unlocked

A run's timings of one task scatter more than a quiet GPU explains
(``benchmarks/timing_agreement.py``). This times one fixed task the way the ``runtime`` stage
does (``filters.checks.stage_runtime``: warm-up runs, then timed runs with the L2 flushed
before each and the GPU's lock held exclusively) ``--rounds`` times per mode, while
``--disturbers`` processes do one kind of work:

- ``idle``: nothing (the reference every other mode is compared with);
- ``cpu``: spin, a core each (compiles, imports and sandbox start-ups keep a run's cores busy,
  and a short forward is launched from the CPU);
- ``contexts``: start a process that creates a CUDA context, warms the math libraries as a
  candidate's prestarted child does (``filters.device_init``) and exits, over and over; a run
  starts and ends one such process per candidate, outside the GPU lock;
- ``shared``: run the task's forward inside the lock's shared sections, as untimed stages do
  (the lock should keep them out of the timed runs);
- ``unlocked``: run the forward with no lock at all (the size of a real overlap).

Prints, per mode, the median, 95th percentile and largest of the timer's medians and their
ratios to ``idle``'s, and writes them to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.timing_agreement import quantile

MODES = ("idle", "cpu", "contexts", "shared", "unlocked")
GPU_ONLY = ("contexts",)
# The task: a chain of elementwise passes over one large tensor (memory-bound, a few kernels),
# about a millisecond on a large GPU at the default size, like the window's short tasks.
TASK = """import torch
import torch.nn as nn

ELEMENTS = {elements}


class Model(nn.Module):
    def forward(self, x):
        for _ in range(8):
            x = torch.tanh(x * 1.0001 + 0.25)
        return x


def get_inputs():
    return [torch.randn(ELEMENTS)]


def get_init_inputs():
    return []
"""
# What a prestarted child does before its candidate: a context, then the libraries warmed.
CONTEXT_CHILD = (
    "import torch\n"
    "from opsynth.filters.device_init import warm_libraries\n"
    "torch.zeros(1, device='cuda')\n"
    "warm_libraries(torch.device('cuda'))\n"
)


def settings(device: str, lock_dir: str, warmup_runs: int, timed_runs: int) -> Any:
    from opsynth.filters.checks import Settings

    return Settings(
        device=device,
        lock_dir=lock_dir,
        warmup_runs=warmup_runs,
        timed_runs=timed_runs,
        window_ms=(0.0, 1e300),
    )


def disturb(mode: str, path: str, device: str, lock_dir: str, stop: Any, ready: Any) -> None:
    """One disturber's loop until ``stop`` is set; sets ``ready`` once its work is running."""
    if mode == "cpu":
        ready.set()
        while not stop.is_set():
            pass
        return
    if mode == "contexts":
        ready.set()
        while not stop.is_set():
            subprocess.run([sys.executable, "-c", CONTEXT_CHILD], check=False)
        return
    import torch

    from opsynth.filters.checks import Candidate, stage_eager
    from opsynth.filters.gpu_sections import gpu_lock

    c = Candidate(path, settings(device, lock_dir, 0, 1))
    stage_eager(c)
    locked = mode == "shared" and c.lock_dir
    ready.set()
    with torch.no_grad():
        while not stop.is_set():
            if locked:
                with gpu_lock(c.lock_dir, c.device, exclusive=False):
                    c.model(*c.inputs)
                    c.sync()
            else:
                c.model(*c.inputs)
                c.sync()


def time_rounds(path: str, device: str, lock_dir: str, rounds: int, args: Any) -> list[float]:
    """``rounds`` runtime-stage medians (ms) of the task, in this process."""
    from opsynth.filters.checks import Candidate, stage_eager, stage_runtime

    c = Candidate(path, settings(device, lock_dir, args.warmup_runs, args.timed_runs))
    stage_eager(c)
    return [float(stage_runtime(c)["eager_ms_median"]) for _ in range(rounds)]


def run_mode(mode: str, path: str, args: Any, lock_dir: str) -> list[float]:
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    started = []
    for _ in range(0 if mode == "idle" else args.disturbers):
        ready = ctx.Event()
        process = ctx.Process(
            target=disturb, args=(mode, path, args.device, lock_dir, stop, ready), daemon=True
        )
        process.start()
        started.append((process, ready))
    try:
        for process, ready in started:
            while not ready.wait(0.5):
                if not process.is_alive():
                    raise SystemExit(f"a {mode} disturber exited with {process.exitcode}")
        time.sleep(args.settle_s if started else 0.0)
        return time_rounds(path, args.device, lock_dir, args.rounds, args)
    finally:
        stop.set()
        for process, _ in started:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()


def summary(medians: list[float], reference: list[float] | None) -> dict[str, Any]:
    ordered = sorted(medians)
    found = {
        "rounds": len(ordered),
        "median_ms": round(statistics.median(ordered), 4),
        "p95_ms": round(quantile(ordered, 0.95), 4),
        "max_ms": round(ordered[-1], 4),
    }
    if reference:
        base = statistics.median(reference)
        for key in ("median", "p95", "max"):
            found[f"{key}_ratio"] = round(found[f"{key}_ms"] / base, 3) if base > 0 else None
    return found


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    parser.add_argument("--mode", action="append", choices=MODES, help="default: all")
    parser.add_argument("--disturbers", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--elements", type=int, default=1 << 24)
    parser.add_argument("--warmup-runs", type=int, default=3)
    parser.add_argument("--timed-runs", type=int, default=10)
    parser.add_argument("--settle-s", type=float, default=2.0, help="after the disturbers start")
    parser.add_argument("--out", type=Path, default=Path("timer_disturbance.json"))
    args = parser.parse_args(argv)
    modes = list(dict.fromkeys(["idle", *(args.mode or MODES)]))
    if args.device == "cpu" and any(m in GPU_ONLY for m in modes):
        raise SystemExit(f"modes {', '.join(GPU_ONLY)} need --device cuda")
    results: dict[str, Any] = {"device": args.device, "disturbers": args.disturbers, "modes": {}}
    with tempfile.TemporaryDirectory(prefix="timer-disturbance-") as tmp:
        path = os.path.join(tmp, "task.py")
        Path(path).write_text(TASK.format(elements=args.elements))
        lock_dir = os.path.join(tmp, "locks")
        os.mkdir(lock_dir)
        reference = None
        for mode in modes:
            medians = run_mode(mode, path, args, lock_dir)
            reference = reference or medians
            results["modes"][mode] = summary(medians, reference)
            row = results["modes"][mode]
            print(
                f"{mode:>9s}: median {row['median_ms']:.4f} ms, p95 {row['p95_ms']:.4f}, "
                f"max {row['max_ms']:.4f}  (x{row['median_ratio']} / x{row['p95_ratio']} / "
                f"x{row['max_ratio']} of idle's median)",
                flush=True,
            )
            args.out.write_text(json.dumps(results, indent=1))  # a cut-short call keeps these
    return results


if __name__ == "__main__":
    main()
