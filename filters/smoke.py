"""Smoke check of the filters on this host: every known sample must get its reason.

``python -m opsynth.filters.smoke [--device auto|cpu|cuda] [--workers N]`` evaluates
``filters.samples`` (plus the GPU-only samples on CUDA) in a sandboxed pool with a runtime
window wide enough for any device, prints one line per sample and the pool's stats, and exits
non-zero if any sample got another reason. Run it once on a new GPU host before a real run.
"""

from __future__ import annotations

import argparse
import sys

from opsynth.config import FiltersConfig
from opsynth.filters.pool import WorkerPool, resolve_device
from opsynth.filters.samples import GPU_SAMPLES, SAMPLES, Sample
from opsynth.record import Task, Verdict

# Wide enough that no sample is judged on speed: the samples test the other stages.
ANY_SPEED_MS = (0.0, 60000.0)


def run_smoke(cfg: FiltersConfig, device: str) -> list[tuple[Sample, list[Verdict]]]:
    device = resolve_device(device)
    samples = SAMPLES + (GPU_SAMPLES if device == "cuda" else ())
    cfg = cfg.model_copy(update={"window_ms_cpu": ANY_SPEED_MS, "window_ms_cuda": ANY_SPEED_MS})
    tasks = [Task(ops=[s.name], data_source="torch#1", code=s.code) for s in samples]
    with WorkerPool(cfg, device) as pool:
        results = pool.evaluate(tasks)
        print(f"pool: {pool.stats}")
    return [(s, results[t.id]) for s, t in zip(samples, tasks, strict=True)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args(argv)
    failures = 0
    for sample, rows in run_smoke(FiltersConfig(workers=args.workers), args.device):
        last = rows[-1]
        ok = (last.stage, last.reason) == (sample.stage, sample.reason)
        failures += not ok
        print(
            f"{'ok ' if ok else 'BAD'} {sample.name:28} expected {sample.stage}/{sample.reason}, "
            f"got {last.stage}/{last.reason} {'' if ok else last.detail[:200]}"
        )
    print(f"{failures} sample(s) got an unexpected reason")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
