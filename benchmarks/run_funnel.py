"""What a finished (or interrupted) run directory says about its candidates, by category.

    python -m benchmarks.run_funnel RUN_DIR [--json OUT.json]

Prints the funnel from ``run.json``, the share of sized candidates that pass every sandboxed
filter, the pool's rate (sandboxed jobs per minute between its first and last result: filter
runs and sizing probes together), and per operator category (``opsynth.taxonomy``) how many
candidates reached the sandbox, how many it rejected and the main reasons, so that an operator
family that fails often stands out. Reads only pyarrow and the standard library (it runs on GPU
hosts without polars).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

import pyarrow.parquet as pq

from opsynth.taxonomy import task_categories

SANDBOX_STAGES = ("eager", "randomness", "degenerate", "runtime", "compile")


def summarise(run: Path) -> dict:
    manifest = json.loads((run / "run.json").read_text())
    candidates = pq.read_table(run / "candidates.parquet", columns=["id", "ops"]).to_pylist()
    verdicts = pq.read_table(
        run / "verdicts.parquet", columns=["task_id", "stage", "passed", "reason"]
    ).to_pylist()
    by_task: dict[str, list[dict]] = defaultdict(list)
    for row in verdicts:
        by_task[row["task_id"]].append(row)
    sandboxed = passed = 0
    per_category: dict[str, dict] = defaultdict(
        lambda: {"sandboxed": 0, "rejected": 0, "reasons": Counter()}
    )
    for task in candidates:
        rows = [r for r in by_task.get(task["id"], []) if r["stage"] in SANDBOX_STAGES]
        if not rows:
            continue
        failed = next((r for r in rows if not r["passed"]), None)
        sandboxed += 1
        passed += failed is None
        ops = json.loads(task["ops"]) if isinstance(task["ops"], str) else task["ops"]
        for name in task_categories(ops) or {"other"}:
            entry = per_category[name]
            entry["sandboxed"] += 1
            if failed:
                entry["rejected"] += 1
                entry["reasons"][failed["reason"]] += 1
    runtime = manifest.get("filters_runtime") or {}
    span = (runtime.get("last_result_at") or 0) - (runtime.get("first_result_at") or 0)
    return {
        "candidates": len(candidates),
        "sandboxed": sandboxed,
        "kept_after_sizing": passed / max(1, sandboxed),
        "counts": manifest.get("counts"),
        "funnel": manifest.get("funnel"),
        "filter_candidates_per_min": (runtime.get("candidates", 0) / span * 60)
        if span > 0
        else None,
        "sandbox": runtime.get("sandbox"),
        "device_name": runtime.get("device_name"),
        "categories": {
            name: {**entry, "reasons": dict(entry["reasons"].most_common(4))}
            for name, entry in sorted(per_category.items())
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    summary = summarise(args.run)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2, default=str))
    print(
        f"candidates {summary['candidates']}, sized and filtered {summary['sandboxed']}, "
        f"passing every sandboxed filter {summary['kept_after_sizing']:.1%}"
    )
    print(
        f"sandbox {summary['sandbox']} on {summary['device_name']}: "
        f"{summary['filter_candidates_per_min'] or 0:.1f} sandboxed jobs/min "
        "(filter runs and sizing probes together)"
    )
    for row in summary["funnel"] or []:
        top = sorted(row["reasons"].items(), key=lambda kv: -kv[1])[:3]
        print(f"  {row['stage']:<11} {row['entered']:>5} -> {row['passed']:>5}  {top}")
    print(f"{'category':<16}{'sandboxed':>10}{'rejected':>10}  top reasons")
    for name, entry in summary["categories"].items():
        share = entry["rejected"] / max(1, entry["sandboxed"])
        print(f"{name:<16}{entry['sandboxed']:>10}{share:>10.0%}  {entry['reasons']}")


if __name__ == "__main__":
    main()
