"""How many CUDA contexts one host creates per second, with N processes creating at once.

Run by hand on a GPU host (torch only), e.g.

    python -m benchmarks.context_creation --counts 1 4 16 32
    python -m benchmarks.context_creation --counts 16 --env CUDA_DEVICE_MAX_CONNECTIONS=1

Every candidate runs in a fresh process (``filters.worker``), so every candidate creates a
CUDA context, and the host's rate of creating them bounds candidates per minute whatever the
number of GPUs. This measures that rate the way the worker meets it: the parent imports torch
without touching CUDA, forks N children at once, and each child times ``cuInit`` and then its
first tensor on the GPU (the primary context and torch's CUDA state). Prints a markdown table:
per count, the wall time until all N have a context, the median and slowest child, and the
rate N / wall. ``--env`` settings apply to the children (the driver reads them at ``cuInit``).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import time


def child(report_fd: int) -> None:  # pragma: no cover - runs in a forked child
    import torch

    start = time.perf_counter()
    ctypes.CDLL("libcuda.so.1").cuInit(0)
    initialised = time.perf_counter()
    torch.zeros(1, device="cuda")
    done = time.perf_counter()
    os.write(report_fd, f"{initialised - start:.4f} {done - initialised:.4f}\n".encode())
    os._exit(0)


def create_at_once(count: int) -> dict[str, float]:
    """Fork ``count`` children that each create a context; their timings and the wall."""
    read_fd, write_fd = os.pipe()
    start = time.perf_counter()
    pids = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            child(write_fd)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    wall = time.perf_counter() - start
    os.close(write_fd)
    chunks = []
    while chunk := os.read(read_fd, 1 << 16):
        chunks.append(chunk)
    os.close(read_fd)
    fields = b"".join(chunks).decode().split()
    init, context = [float(x) for x in fields[0::2]], [float(x) for x in fields[1::2]]
    if len(context) != count:
        raise SystemExit(f"{count - len(context)} of {count} children created no context")
    return {
        "count": count,
        "wall_s": wall,
        "cu_init_median_s": statistics.median(init),
        "context_median_s": statistics.median(context),
        "context_max_s": max(context),
        "per_s": count / wall,
    }


def table(rows: list[dict[str, float]], env: list[str]) -> str:
    lines = [
        f"settings: {' '.join(env) or 'driver defaults'}",
        "| processes | wall s | cuInit median s | context median / max s | contexts/s |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['count']} | {r['wall_s']:.2f} | {r['cu_init_median_s']:.2f} | "
            f"{r['context_median_s']:.2f} / {r['context_max_s']:.2f} | {r['per_s']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 4, 16, 32])
    parser.add_argument("--env", nargs="*", default=[], help="KEY=VALUE for the children")
    args = parser.parse_args(argv)
    for setting in args.env:
        key, _, value = setting.partition("=")
        os.environ[key] = value
    import torch  # noqa: F401  - imported before the fork, as the worker does

    rows = [create_at_once(n) for n in args.counts]
    print(table(rows, args.env))
    return rows


if __name__ == "__main__":
    main()
