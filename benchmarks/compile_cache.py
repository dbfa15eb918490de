"""What the compile-cache layers cost (filters/compile_cache.py).

    python -m benchmarks.compile_cache --kernelbench kernelbench.jsonl --tasks 48 --device cuda

Three pools filter the same KernelBench level-2 problems, each starting from an empty
``filters.cache_dir``:

- ``cold``: the pool builds the trusted layer at start (its warm-up), then filters;
- ``trusted``: a second pool on the same cache dir finds the layer and filters;
- ``none``: a pool whose layer is left empty (as when a warm-up fails), so every candidate
  compiles with nothing shared.

Each candidate's own caches are private in all three. Prints start time, warm-up time, filter
wall time and candidates/min per pool, and the compile stage's mean seconds; writes
``compile_cache.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from opsynth.config import FiltersConfig
from opsynth.filters import compile_cache
from opsynth.filters.audit import audit_tasks
from opsynth.filters.pool import WorkerPool, resolve_device
from opsynth.tasksets import load_kernelbench


def run_pool(name: str, tasks: list, cfg: FiltersConfig, device: str) -> dict[str, Any]:
    began = time.perf_counter()
    with WorkerPool(cfg, device) as pool:
        start_s = time.perf_counter() - began
        filtering = time.perf_counter()
        result = audit_tasks(tasks, cfg, device, pool=pool)
        filter_s = time.perf_counter() - filtering
        stats = dict(pool.stats)
    compile_s = [v.elapsed_s for v in result.verdicts if v.stage == "compile" and v.passed]
    row = {
        "pool": name,
        "layer": stats.get("compile_cache"),
        "warm_up_s": stats.get("compile_cache_s"),
        "start_s": round(start_s, 1),
        "filter_s": round(filter_s, 1),
        "per_min": round(60.0 * len(tasks) / filter_s, 1),
        "kept": len(result.kept),
        "compile_mean_s": round(statistics.mean(compile_s), 2) if compile_s else None,
    }
    print(json.dumps(row), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernelbench", type=Path, required=True)
    parser.add_argument("--tasks", type=int, default=48)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--workers", type=int, default=0, help="0 = the pool's default")
    parser.add_argument("--out", type=Path, default=Path("compile-cache-bench"))
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    tasks = load_kernelbench(args.kernelbench, [2])[: args.tasks]
    args.out.mkdir(parents=True, exist_ok=True)
    cache = tempfile.mkdtemp(prefix="compile-cache-", dir=args.out)
    cfg = FiltersConfig(cache_dir=cache, **({"workers": args.workers} if args.workers else {}))
    rows = [run_pool("cold", tasks, cfg, device), run_pool("trusted", tasks, cfg, device)]
    empty = cfg.model_copy(update={"cache_dir": tempfile.mkdtemp(prefix="none-", dir=args.out)})
    original = compile_cache.ensure_layer
    compile_cache.ensure_layer = lambda base, *_: (compile_cache.empty_dir(base), "skipped")
    try:
        rows.append(run_pool("none", tasks, empty, device))
    finally:
        compile_cache.ensure_layer = original
    (args.out / "compile_cache.json").write_text(json.dumps(rows, indent=1))
    print(
        "| pool | layer | warm-up s | start s | filter s | candidates/min | kept | compile mean s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['pool']} | {r['layer']} | {r['warm_up_s']} | {r['start_s']} | {r['filter_s']} "
            f"| {r['per_min']} | {r['kept']} | {r['compile_mean_s']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
