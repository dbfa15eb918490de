"""Does the evaluator's kernel trace slow the solution's process down for its timed calls?

The judge asks the solution's process for the GPU kernels one forward launches
(``evaluator.runner._kernels``, ``torch.profiler`` with CUDA activity) during correctness,
before the timed calls; the reference's process is never profiled. If profiling leaves
CUPTI attached, every later kernel launch of that process pays for it, and the solution's
timed calls (their draw, L2 flush and forward, all counted: ``evaluator.judge._ms``) read
slower than the same model's in the reference process. This times those three requests'
work in one process before and after one such trace, for KernelBench level-2 problems,
each ``TEARDOWN_CUPTI`` setting in its own fresh process:

    python -m benchmarks.profiler_residue --problems 57 81 95 --calls 60

It prints, per problem and setting, the median milliseconds of draw / flush / forward
before and after the trace, and after / before for their sum.
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
import types
from pathlib import Path
from typing import Any

SETTINGS = {"default": None, "teardown": "1", "no_teardown": "0"}


def measure(code: str, calls: int) -> dict[str, list[float]]:
    """Median ms of draw, flush and forward over ``calls`` calls, before and after one
    profiled forward, in this process."""
    import torch

    from opsynth.evaluator.harness import Session
    from opsynth.evaluator.runner import _kernels
    from opsynth.filters.candidate_load import draw_inputs, load_module
    from opsynth.filters.serve import flush_l2

    device = torch.device("cuda")
    with tempfile.TemporaryDirectory() as workdir:
        path = os.path.join(workdir, "task.py")
        Path(path).write_text(code)
        task = load_module(path)
    model = task.Model(*task.get_init_inputs()).to(device).eval()
    session = Session(workdir, {"device": "cuda", "strict": False})
    session.new = model
    buffer: Any = None

    def timed(fn: Any) -> tuple[float, Any]:
        torch.cuda.synchronize()
        start = time.perf_counter()
        result = fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e3, result

    def rounds() -> list[float]:
        nonlocal buffer
        parts: list[list[float]] = [[], [], []]
        for seed in range(calls):
            draw_ms, inputs = timed(lambda s=seed: draw_inputs(task.get_inputs, device, s))
            flush_ms, buffer = timed(lambda b=buffer: flush_l2(b, device))
            with torch.no_grad():
                forward_ms, _ = timed(lambda xs=inputs: model(*xs))
            for part, ms in zip(parts, (draw_ms, flush_ms, forward_ms), strict=True):
                part.append(ms)
        return [statistics.median(part) for part in parts]

    rounds()  # warm: allocator, cuBLAS/cuDNN handles, the L2 buffer
    before = rounds()

    # the judge's kernel trace: one profiled forward on the drawn inputs
    _kernels(session, types.SimpleNamespace(inputs=draw_inputs(task.get_inputs, device, 0)))
    return {"before": before, "after": rounds()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, nargs="+", default=[57, 81, 95])
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: the task's code file
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(Path(args.one).read_text(), args.calls)))
        return

    from opsynth.refdata import KERNELBENCH, shared_file
    from opsynth.tasksets import load_kernelbench

    path = shared_file(KERNELBENCH)
    if path is None:
        raise SystemExit("KernelBench reference data not found (see README)")
    by_id = {t.meta["problem_id"]: t for t in load_kernelbench(path, [2])}
    print(
        "| problem | TEARDOWN_CUPTI | before: draw / flush / forward ms | after | after / before |"
    )
    print("| --- | --- | --- | --- | --- |")
    for problem in args.problems:
        task = by_id[problem]
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as fh:
            fh.write(task.code)
        for name, value in SETTINGS.items():
            env = {k: v for k, v in os.environ.items() if k != "TEARDOWN_CUPTI"}
            if value is not None:
                env["TEARDOWN_CUPTI"] = value
            command = [sys.executable, "-m", "benchmarks.profiler_residue", "--one", fh.name]
            done = subprocess.run(
                [*command, "--calls", str(args.calls)], env=env, capture_output=True, text=True
            )
            if done.returncode != 0:
                print(f"| {problem} | {name} | failed: {done.stderr.strip()[-300:]} | | |")
                continue
            found = json.loads(done.stdout.strip().splitlines()[-1])
            before, after = found["before"], found["after"]
            ratio = sum(after) / sum(before)
            cells = [" / ".join(f"{ms:.3f}" for ms in part) for part in (before, after)]
            print(f"| {problem} | {name} | {cells[0]} | {cells[1]} | {ratio:.3f} |")
        os.unlink(fh.name)


if __name__ == "__main__":
    main()
