"""How fast is this GPU against a device with published KernelBench timings?

``filters.device_speed_factor`` emulates a reference device's runtime window. The fixed
micro-benchmark in ``filters.calibrate`` needs a run on the reference device; KernelBench
already publishes eager timings of its problems on H100s, so the eager medians our runtime
filter measured on those same problems give the factor directly:

    python -m benchmarks.filter_sets --kernelbench kernelbench.jsonl --levels 2 --device cuda \
        --out kb/
    python -m benchmarks.kernelbench_speed --verdicts kb/kernelbench-l2-verdicts.parquet \
        --kernelbench kernelbench.jsonl \
        --timing KernelBench/results/timing/H100_Modal/baseline_time_torch.json

It prints the per-problem ratio spread and the factor (geometric mean of reference / local),
the number to put in ``[filters] device_speed_factor`` to filter as if on the reference.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from opsynth.filters.calibrate import speed_factor
from opsynth.store import read_verdicts
from opsynth.tasksets import load_kernelbench, load_kernelbench_timings
from opsynth.verdicts import timing_measures


def local_eager_ms(verdicts_path: Path, kernelbench: Path, level: int) -> dict[int, float]:
    """Problem id -> eager median ms measured by the runtime filter."""
    ids = {t.id: t.meta["problem_id"] for t in load_kernelbench(kernelbench, [level])}
    measured = {}
    for v in read_verdicts(verdicts_path):
        timed = timing_measures(v)
        if timed and v.task_id in ids and "eager_ms_median" in timed:
            measured[int(ids[v.task_id])] = float(timed["eager_ms_median"])
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verdicts", type=Path, required=True)
    parser.add_argument("--kernelbench", type=Path, required=True)
    parser.add_argument("--timing", type=Path, required=True, action="append")
    parser.add_argument("--level", type=int, default=2)
    args = parser.parse_args()
    local = local_eager_ms(args.verdicts, args.kernelbench, args.level)
    for timing in args.timing:
        reference = load_kernelbench_timings(timing, args.level)
        ratios = sorted(local[k] / reference[k] for k in local if k in reference)
        if not ratios:
            print(f"{timing}: no problem in common", file=sys.stderr)
            continue
        tenth = len(ratios) // 10
        print(
            f"{timing.parent.name}: {len(ratios)} problems, local/reference eager ms "
            f"median {statistics.median(ratios):.3f} (p10 {ratios[tenth]:.3f}, "
            f"p90 {ratios[-1 - tenth]:.3f}); device_speed_factor = "
            f"{speed_factor(local, reference):.3f}"
        )


if __name__ == "__main__":
    main()
