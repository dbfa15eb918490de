"""Replay a run's dedup as it happens during the run, chunk after chunk, and print its cost.

    .venv/bin/python -m benchmarks.dedup_rounds [RUN_DIR] [--chunk-size 160] [--workers 0]

``opsynth run`` dedups every task that has passed the filters so far after each chunk, so its
dedup work grows with the set. This takes the tasks that reached ``dedup`` in a run directory
(default: the committed v1.0.0 run), in the order the run screened them, and dedups the growing
prefix after each chunk twice: analysing every task each time, and with a ``KeyCache`` that
keeps the keys of tasks already analysed (what the run does). Prints the seconds of both per
chunk and in all, and checks that both give the same verdicts.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from opsynth.ast_dedup.dedup import KeyCache, dedup
from opsynth.config import DedupConfig
from opsynth.record import Task
from opsynth.store import read_tasks, read_verdicts

RELEASE_RUN = Path(__file__).resolve().parent.parent / "data/releases/v1.0.0/run"


def reached_dedup(run: Path) -> list[Task]:
    """The candidates with a ``dedup`` verdict, in the run's candidate order."""
    ids = {v.task_id for v in read_verdicts(run / "verdicts.parquet") if v.stage == "dedup"}
    return [t for t in read_tasks(run / "candidates.parquet") if t.id in ids]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("run", type=Path, nargs="?", default=RELEASE_RUN)
    parser.add_argument("--chunk-size", type=int, default=160)
    parser.add_argument("--workers", type=int, default=0, help="0 = host cores, as in a run")
    args = parser.parse_args()
    tasks = reached_dedup(args.run)
    cfg = DedupConfig(workers=args.workers)
    cache = KeyCache()
    totals = {"every_time": 0.0, "key_cache": 0.0}
    print(f"{len(tasks)} tasks reached dedup in {args.run}; chunks of {args.chunk_size}")
    print(f"{'tasks':>6s} {'every time s':>13s} {'key cache s':>12s}")
    for end in range(args.chunk_size, len(tasks) + args.chunk_size, args.chunk_size):
        prefix = tasks[:end]
        t0 = time.perf_counter()
        plain = dedup(prefix, cfg)
        t1 = time.perf_counter()
        cached = dedup(prefix, cfg, cache)
        t2 = time.perf_counter()
        same = [(v.task_id, v.reason) for v in plain.verdicts] == [
            (v.task_id, v.reason) for v in cached.verdicts
        ]
        if not same:
            raise SystemExit(f"the verdicts differ at {len(prefix)} tasks")
        totals["every_time"] += t1 - t0
        totals["key_cache"] += t2 - t1
        print(f"{len(prefix):6d} {t1 - t0:13.2f} {t2 - t1:12.2f}")
    print(
        f"in all: every time {totals['every_time']:.1f} s, key cache {totals['key_cache']:.1f} s;"
        " the verdicts are the same"
    )


if __name__ == "__main__":
    main()
