"""What ``sizing.too_fast_share`` would have caught in a run made without it, from the run's
own verdicts.

    python -m benchmarks.sizing_too_fast --run data/releases/v1.0.0/run --share 0.5 0.8 0.9

For every candidate whose eager row carries a sizing claim (a stopped chunk's journal left
out), the rule (``filters.sizing.chosen_too_fast``) is applied at each share of the run's own
runtime window's lower edge (its ``run.json``). Prints, per share, how many candidates it
catches, the stage and reason each of them ended with, how many of them the run accepted
(each a task the rule would lose), and the stage seconds the caught spent after sizing: their
own, and, for a run where ``verify`` decides the window (``filters.timing_in_verify``: no
``runtime`` stage, so a too-fast candidate goes on through ``compile`` and ``verify``), the
mean eager-to-verify seconds of the run's candidates that reached ``verify`` for each. Writes
nothing.
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from benchmarks.sizing_replay import run_config
from opsynth.filters.sizing import chosen_too_fast
from opsynth.record import Verdict
from opsynth.store import read_verdicts

# The stages a candidate runs once its size is chosen, when verify decides the window.
THROUGH_VERIFY = ("eager", "randomness", "degenerate", "compile", "verify")


def summarise(rows: list[Verdict], lower_ms: float, shares: list[float]) -> dict[float, Any]:
    by_task: dict[str, list[Verdict]] = defaultdict(list)
    for row in rows:
        by_task[row.task_id].append(row)
    through = [
        sum(r.elapsed_s for r in found if r.stage in THROUGH_VERIFY)
        for found in by_task.values()
        if any(r.stage == "verify" for r in found)
    ]
    to_verify = statistics.fmean(through) if through else 0.0
    total = sum(r.elapsed_s for r in rows)
    sized = {}
    for task_id, found in by_task.items():
        eager = next((r for r in found if r.stage == "eager"), None)
        claim = eager.measures.get("sizing") if eager else None
        if isinstance(claim, dict):
            sized[task_id] = claim
            total += float(claim.get("seconds") or 0.0)
    results: dict[float, Any] = {}
    for share in shares:
        caught = [t for t, claim in sized.items() if chosen_too_fast(claim, share * lower_ms)]
        ends = Counter()
        accepted = spent = 0.0
        for task_id in caught:
            found = [r for r in by_task[task_id] if r.stage != "dedup"]
            ends[(found[-1].stage, found[-1].reason)] += 1
            accepted += all(r.passed for r in by_task[task_id])
            spent += sum(r.elapsed_s for r in found)
        results[share] = {
            "sized": len(sized),
            "caught": len(caught),
            "ends": dict(ends),
            "accepted_lost": int(accepted),
            "stage_s_saved": spent,
            "stage_s_total": total,
            "verify_window_s_saved": len(caught) * to_verify,
        }
    return results


def main(argv: list[str] | None = None) -> dict[float, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--share", type=float, nargs="+", default=[0.8])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="its window")
    args = parser.parse_args(argv)
    rows = read_verdicts(args.run / "verdicts.parquet")
    lower = run_config(args.run).filters.window_ms(args.device)[0]
    results = summarise(rows, lower, args.share)
    for share, found in results.items():
        total = found["stage_s_total"] or 1.0
        print(
            f"share {share}: {found['caught']} of {found['sized']} sized candidates caught "
            f"(below {share * lower:.3g} ms); accepted among them: {found['accepted_lost']}; "
            f"stage s saved {found['stage_s_saved']:.0f} of {total:.0f} "
            f"({found['stage_s_saved'] / total:.1%}); with verify deciding the window "
            f"{found['verify_window_s_saved']:.0f} ({found['verify_window_s_saved'] / total:.1%})"
        )
        for (stage, reason), count in sorted(found["ends"].items(), key=lambda kv: -kv[1]):
            print(f"  ended at {stage}: {reason} {count}")
    return results


if __name__ == "__main__":
    main()
