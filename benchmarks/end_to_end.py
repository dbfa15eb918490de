"""A whole ``opsynth run`` from a cold start, and where its wall time went, stage by stage.

    python -m benchmarks.end_to_end --target 150 --device cuda --out e2e

Runs the real CLI in a subprocess with an empty user cache (so the seed catalogue is extracted,
as on a fresh host) unless ``--warm-catalogue`` is given, times it from the outside, then reads
the run's ``run.json``: the wall seconds of each stage in this invocation (``stage_seconds``,
written by the ``regenerate`` flow), the funnel's counts and the filter pool's start. Prints the
per-stage table and the whole run's candidates per minute (candidates over the wall time, start
of the process included); writes ``end_to_end.json`` beside the run folder.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Stages in the order a run takes them; anything else run.json names comes after.
ORDER = ("seeds", "compose", "size", "filter", "size_filter", "dedup", "pool_close", "export")


def summarise(manifest: dict[str, Any], wall_s: float) -> dict[str, Any]:
    """The per-stage table and the run's rates, from ``run.json`` and the outside wall time."""
    seconds = dict(manifest.get("stage_seconds") or {})
    pool_start = seconds.pop("pool_start", None)
    names = [n for n in ORDER if n in seconds] + sorted(set(seconds) - set(ORDER))
    staged = sum(float(seconds[n]) for n in names)
    counts = manifest.get("counts") or {}
    candidates = int(counts.get("candidates") or 0)
    # every probe, filter run and retry is one sandboxed process
    jobs = int((manifest.get("filters_runtime") or {}).get("candidates") or 0)
    return {
        "wall_s": round(wall_s, 1),
        "stages": [
            {"stage": n, "seconds": round(float(seconds[n]), 1), "share": seconds[n] / wall_s}
            for n in names
        ],
        "outside_stages_s": round(wall_s - staged, 1),  # interpreter, Prefect, manifest writes
        "pool_start_s": pool_start,
        "candidates": candidates,
        "accepted": int(counts.get("accepted") or 0),
        "unscreened": int(manifest.get("unscreened") or 0),
        "candidates_per_min": round(60.0 * candidates / wall_s, 1) if wall_s > 0 else None,
        "sandbox_processes": jobs,
        "processes_per_candidate": round(jobs / candidates, 2) if candidates else None,
        "status": manifest.get("status"),
    }


def table(s: dict[str, Any]) -> str:
    lines = ["| stage | wall s | share of run |", "| --- | --- | --- |"]
    for row in s["stages"]:
        lines.append(f"| {row['stage']} | {row['seconds']} | {100 * row['share']:.1f}% |")
    lines.append(f"| outside the stages (start-up, Prefect) | {s['outside_stages_s']} | |")
    lines.append(f"| **whole run** | **{s['wall_s']}** | 100% |")
    lines.append("")
    lines.append(
        f"{s['candidates']} candidates ({s['unscreened']} composed but left unscreened), "
        f"{s['accepted']} accepted, status {s['status']}; filter pool start "
        f"{s['pool_start_s']} s (inside size or filter); "
        f"**{s['candidates_per_min']} candidates/min** end to end; "
        f"{s['sandbox_processes']} sandboxed processes "
        f"({s['processes_per_candidate']} per candidate)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=int, default=150)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--config", type=Path, help="a run config (TOML); default: built-in")
    parser.add_argument(
        "--warm-catalogue",
        action="store_true",
        help="use the user cache as it is (a catalogue extracted before is reused)",
    )
    parser.add_argument("--out", type=Path, default=Path("end-to-end"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    run_dir = args.out / "run"
    env = dict(os.environ)
    if not args.warm_catalogue:
        env["OPSYNTH_CACHE"] = tempfile.mkdtemp(prefix="cache-", dir=args.out)
    cmd = [sys.executable, "-m", "opsynth.flows.cli", "run", "--out", str(run_dir)]
    cmd += ["--target", str(args.target), "--device", args.device]
    if args.config:
        cmd += ["--config", str(args.config)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env)
    wall_s = time.perf_counter() - start
    manifest = json.loads((run_dir / "run.json").read_text())
    result = {"command": cmd[1:], "returncode": proc.returncode, **summarise(manifest, wall_s)}
    (args.out / "end_to_end.json").write_text(json.dumps(result, indent=2))
    print(table(result))
    return result


if __name__ == "__main__":
    main()
