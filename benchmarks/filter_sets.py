"""Run whole task sets through the static check and the sandboxed filters, without Prefect.

For GPU hosts that have only torch (plus pyarrow and pydantic): prints the funnel per set and
writes every verdict, e.g.

    python -m benchmarks.filter_sets --kernelbench kernelbench.jsonl --levels 2 \
        --ops6k cuda_agent_ops_6k.parquet --sample 600 --device cuda --out results/
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import Counter
from pathlib import Path

from opsynth.config import FiltersConfig
from opsynth.filters.audit import audit_tasks
from opsynth.funnel import funnel
from opsynth.store import write_verdicts
from opsynth.tasksets import load_kernelbench, load_task_set


def report(name: str, tasks, result, seconds: float, out: Path) -> dict:
    stages = funnel(result.verdicts)
    print(f"\n== {name}: {len(tasks)} tasks, kept {len(result.kept)}, {seconds:.0f} s ==")
    print(f"{'stage':<12}{'entered':>8}{'passed':>8}  top reasons")
    for s in stages:
        reasons = ", ".join(f"{r} {n}" for r, n in s.top_reasons(4))
        print(f"{s.stage:<12}{s.entered:>8}{s.passed:>8}  {reasons}")
    final = {}
    for v in result.verdicts:
        if not v.passed:
            final[v.task_id] = v
    names = {t.id: " ".join(t.ops) for t in tasks}
    rejected = [
        {"task": names[i], "stage": v.stage, "reason": v.reason, "detail": v.detail[:160]}
        for i, v in final.items()
    ]
    write_verdicts(result.verdicts, out / f"{name}-verdicts.parquet")
    summary = {
        "set": name,
        "tasks": len(tasks),
        "kept": len(result.kept),
        "seconds": round(seconds, 1),
        "per_minute": round(len(tasks) / seconds * 60, 1),
        "funnel": [
            {"stage": s.stage, "entered": s.entered, "passed": s.passed, "reasons": dict(s.reasons)}
            for s in stages
        ],
        "reasons": dict(Counter(r["reason"] for r in rejected)),
        "rejected": rejected,
    }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kernelbench", type=Path)
    parser.add_argument("--levels", type=int, nargs="*", default=[2])
    parser.add_argument("--ops6k", type=Path)
    parser.add_argument("--sample", type=int, default=0, help="0 = every row")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("filter-sets"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cfg = FiltersConfig(workers=args.workers)
    sets = []
    if args.kernelbench:
        levels = "".join(map(str, args.levels))
        sets.append((f"kernelbench-l{levels}", load_kernelbench(args.kernelbench, args.levels)))
    if args.ops6k:
        tasks = list({t.id: t for t in load_task_set(args.ops6k)}.values())
        if args.sample and args.sample < len(tasks):
            tasks = random.Random(args.seed).sample(tasks, args.sample)
        sets.append(("ops6k", tasks))
    summaries = []
    for name, tasks in sets:
        start = time.perf_counter()
        result = audit_tasks(tasks, cfg, args.device)
        summaries.append(report(name, tasks, result, time.perf_counter() - start, args.out))
    (args.out / "summary.json").write_text(json.dumps(summaries, indent=2))


if __name__ == "__main__":
    main()
