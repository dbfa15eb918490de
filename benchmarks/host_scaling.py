"""Whether this host's cores stay as fast when more of them are busy, with no GPU involved.

Why: two single-GPU filter runs side by side on one host, sharing nothing the pipeline hands
out (cores, GPUs, Prefect server, Dask cluster, compile cache: ``multi_gpu.py --gpus 2x1/16``),
can still each run slower than one alone. The filters are mostly CPU-bound (torch.compile on
one thread per candidate, a fresh process's torch import), so a host whose per-core speed
falls as more cores get busy (a shared clock or power budget, shared caches and memory)
caps what a second GPU adds, whatever the runner does. This measures that ceiling directly.

Each phase starts one process per core of a core set, pinned to it, all at once; each runs the
workload ``--repeats`` times, busy for ``--duty`` of its time (idle the rest, like a filter
worker waiting for its GPU), and reports every repeat's seconds. Phases run on the first
``N`` cores for each ``--cores N`` (default: half the cores this process may use, then all of
them); the table gives each workload's median seconds per repeat and its ratio to the first
phase's. Workloads:

- ``python``: a pure-Python integer loop (the interpreter's single-core speed);
- ``import``: a fresh Python process that imports torch (what a new filter worker pays);
- ``trace``: a fresh process that imports torch and traces a small function through
  TorchDynamo and AOTAutograd (``aot_eager``): the Python-bound front half of a compile;
- ``compile``: the same through inductor for the CPU into an empty cache, C++ compiler
  included (not run by default: the C++ compile makes it the slowest by far).

    python -m benchmarks.host_scaling --out results/host_scaling
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WORKLOADS = ("python", "import", "trace", "compile")
# Lighter workloads first, so a cut-off run keeps them.
DEFAULT_WORKLOADS = ["python", "import", "trace"]
# Iterations of the pure-Python loop: about half a second on a current server core.
PYTHON_LOOP = 5_000_000
COMPILE_SCRIPT = """
import torch
def f(x, w):
    return torch.nn.functional.gelu(x @ w).softmax(-1).sum(0)
x, w = torch.randn(64, 64), torch.randn(64, 64)
torch.compile(f, backend={backend!r})(x, w)
"""
SCRIPTS = {
    "import": "import torch",
    "trace": COMPILE_SCRIPT.format(backend="aot_eager"),
    "compile": COMPILE_SCRIPT.format(backend="inductor"),
}


def python_loop(n: int = PYTHON_LOOP) -> int:
    total = 0
    for i in range(n):
        total = (total + i * i) % 1_000_003
    return total


def one_repeat(workload: str, scratch: str) -> float:
    """Seconds for one repeat of ``workload``; fresh processes start from this one's core."""
    start = time.perf_counter()
    if workload == "python":
        python_loop()
    else:
        script = SCRIPTS[workload]
        cache = tempfile.mkdtemp(prefix="cache-", dir=scratch)
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache, "inductor"),
            "TRITON_CACHE_DIR": os.path.join(cache, "triton"),
            "TORCHINDUCTOR_COMPILE_THREADS": "1",
            "OMP_NUM_THREADS": "1",
        }
        subprocess.run([sys.executable, "-c", script], env=env, check=True)
    return time.perf_counter() - start


def worker(workload: str, repeats: int, duty: float, scratch: str) -> list[float]:
    """One pinned process's repeats: each followed by an idle spell that keeps it busy for
    ``duty`` of its time."""
    seconds = []
    for _ in range(repeats):
        took = one_repeat(workload, scratch)
        seconds.append(took)
        time.sleep(took * (1.0 / duty - 1.0))
    return seconds


def mean_mhz(cpus: set[int], path: str = "/proc/cpuinfo") -> float | None:
    """The mean of ``cpu MHz`` over ``cpus`` now; None where the kernel does not report it
    (many virtual machines report a fixed nominal clock, which says nothing)."""
    found: list[float] = []
    current = None
    try:
        with open(path) as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "processor":
                    current = int(value)
                elif key == "cpu MHz" and current in cpus:
                    found.append(float(value))
    except (OSError, ValueError):
        return None
    return round(statistics.mean(found), 1) if found else None


def phase(args: argparse.Namespace, workload: str, cores: list[int]) -> dict[str, Any]:
    """One process per core of ``cores``, all at once; every repeat's seconds and the cores'
    mean clock sampled while they run."""
    # the repeats' compile caches go with it: nothing of a phase is left in /tmp
    with tempfile.TemporaryDirectory(prefix=f"host-scaling-{workload}-") as scratch:
        command = [sys.executable, __file__, "--worker", workload, "--repeats", str(args.repeats)]
        command += ["--duty", str(args.duty), "--scratch", scratch]
        procs = [
            subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                text=True,
                preexec_fn=lambda core=core: os.sched_setaffinity(0, {core}),
            )
            for core in cores
        ]
        clocks = []
        while any(p.poll() is None for p in procs):
            clock = mean_mhz(set(cores))
            if clock is not None:
                clocks.append(clock)
            time.sleep(0.5)
        seconds: list[float] = []
        for proc in procs:
            out, _ = proc.communicate()
            if proc.returncode:
                sys.exit(
                    f"{workload} on {len(cores)} cores: a worker failed (exit {proc.returncode})"
                )
            seconds += json.loads(out.strip().splitlines()[-1])
    return {
        "workload": workload,
        "cores": len(cores),
        "repeats": len(seconds),
        "median_s": round(statistics.median(seconds), 3),
        "mean_mhz": round(statistics.mean(clocks), 1) if clocks else None,
    }


def against_first(phases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each phase with its median's ratio to the same workload's first phase: above 1, a repeat
    ran slower with more cores busy. Pure."""
    first: dict[str, float] = {}
    out = []
    for p in phases:
        base = first.setdefault(p["workload"], p["median_s"])
        out.append({**p, "slowdown": round(p["median_s"] / base, 3) if base else None})
    return out


def table(phases: list[dict[str, Any]]) -> str:
    lines = [
        "| workload | busy cores | repeats | median s | slowdown vs first | mean MHz |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for p in phases:
        lines.append(
            f"| {p['workload']} | {p['cores']} | {p['repeats']} | {p['median_s']} "
            f"| {p['slowdown']}x | {p['mean_mhz'] if p['mean_mhz'] is not None else 'n/a'} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=DEFAULT_WORKLOADS)
    parser.add_argument(
        "--cores",
        type=int,
        nargs="+",
        default=None,
        help="busy core counts, one phase each (default: half the usable cores, then all)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="repeats per process")
    parser.add_argument(
        "--duty", type=float, default=0.5, help="share of its time each process is busy"
    )
    parser.add_argument("--out", type=Path, default=Path("host_scaling"))
    parser.add_argument("--worker", choices=WORKLOADS, help=argparse.SUPPRESS)
    parser.add_argument("--scratch", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not 0 < args.duty <= 1:
        parser.error(f"--duty must be in (0, 1], not {args.duty}")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    return args


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.repeats, args.duty, args.scratch)))
        return []
    usable = sorted(os.sched_getaffinity(0))
    counts = args.cores or [max(1, len(usable) // 2), len(usable)]
    if max(counts) > len(usable) or min(counts) < 1:
        sys.exit(f"--cores {counts}: this process may use {len(usable)} cores")
    args.out.mkdir(parents=True, exist_ok=True)
    phases: list[dict[str, Any]] = []
    for workload in args.workloads:
        for count in counts:
            phases = against_first([*phases, phase(args, workload, usable[:count])])
            (args.out / "host_scaling.json").write_text(json.dumps(phases, indent=2))
            print(table(phases[-1:]).splitlines()[-1], flush=True)  # a cut-off run keeps these
    print(table(phases))
    return phases


if __name__ == "__main__":
    main()
