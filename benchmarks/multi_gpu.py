"""Filter throughput on 1 and N GPUs of one host through the Dask runner, with verdicts compared.

Run by hand on a multi-GPU host (needs prefect and prefect-dask besides torch), e.g.

    python benchmarks/multi_gpu.py --candidates results/throughput/candidates.parquet \
        --gpus 1 2 --out results/multi_gpu

The candidate set is the throughput benchmark's (``benchmarks/throughput.py`` writes it, sized,
as ``candidates.parquet``), so both runs see identical tasks. Each GPU count runs in its own
process: the ``screen`` stage of ``opsynth run`` (static checks, decontamination, then every
filter shard submitted at once to a local Dask cluster of one worker per GPU, each worker
seeing only its GPU and an equal share of the cores, each running its own warm pool), in a
Prefect flow on Prefect's temporary local server, with an empty compile cache, so both runs
compile cold. Wall time covers the cluster's and pools' start as well as the filtering.

Verdicts are compared task by task (final stage and reason). A difference is *borderline* when
either side's eager median lies within ``--borderline`` (relative) of the runtime window's
edges, or either side timed out; any other difference is listed as a real mismatch.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


# ------------------------------------------------------------------------ one run (subprocess)


def one_run(args: argparse.Namespace) -> None:
    """The screen stage over the candidate set on ``--one`` GPUs; prints one JSON line."""
    from flows.prefect_env import configure_prefect

    out = args.out / f"gpus-{args.one}"
    configure_prefect(out / ".prefect")
    from prefect import flow

    from flows.runners import LocalOnly, task_runner
    from flows.stages import LazyPool, WorkLedger, screen
    from opsynth.config import RunConfig
    from opsynth.store import RunDir, read_tasks, write_verdicts

    tasks = read_tasks(args.candidates)
    cache = tempfile.mkdtemp(prefix="compile-cache-", dir=out)
    cfg = RunConfig().with_section(
        "filters",
        shard_size=args.shard_size,
        cache_dir=cache,
        max_workers_per_gpu=args.workers_per_gpu,
        candidates_per_process_cuda=args.candidates_per_process,
    )
    cfg = cfg.with_section(
        "runner", kind="dask", workers=args.one, shards_per_worker=args.shards_per_worker
    )

    @flow(name="multi-gpu-benchmark")
    def screen_flow(progress) -> list:
        run = RunDir.create(out / "run")
        pool = LazyPool(cfg, args.device)  # stays unstarted: every shard goes to the cluster
        try:
            return screen(run, cfg, tasks, args.device, pool, WorkLedger(), progress)
        finally:
            pool.close()

    start = time.perf_counter()
    engine = task_runner(cfg.runner, args.device, cfg.filters)
    verdicts = screen_flow.with_options(task_runner=engine)(LocalOnly(lambda *a: None))
    wall = time.perf_counter() - start
    write_verdicts(verdicts, out / "verdicts.parquet")
    print(json.dumps({"gpus": args.one, "tasks": len(tasks), "wall_s": wall}))


# ------------------------------------------------------------------------ pure comparison


def final_rows(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """task id -> its last verdict row (stage, reason, eager median when measured)."""
    last: dict[str, dict[str, Any]] = {}
    eager: dict[str, float] = {}
    for row in rows:
        last[row["task_id"]] = row
        measures = row.get("measures") or {}
        if isinstance(measures, str):
            measures = json.loads(measures or "{}")
        if "eager_ms_median" in measures:
            eager[row["task_id"]] = float(measures["eager_ms_median"])
    return {
        k: {"stage": v["stage"], "reason": v["reason"], "eager_ms": eager.get(k)}
        for k, v in last.items()
    }


def filter_span_s(rows: list[dict[str, Any]]) -> float | None:
    """Seconds from the first to the last sandboxed-filter verdict (``created_at``, whole
    seconds): the filtering itself, without the cluster's, the pools' and Prefect's start-up
    and the orchestrator-side prefilter, which do not shrink with more GPUs."""
    from datetime import datetime

    from filters.reasons import STAGES

    times = [datetime.fromisoformat(r["created_at"]) for r in rows if r["stage"] in STAGES]
    return (max(times) - min(times)).total_seconds() if len(times) > 1 else None


def borderline(a: dict[str, Any], b: dict[str, Any], window: tuple[float, float], rel: float):
    if "timeout" in (a["reason"], b["reason"]):
        return True
    for side in (a, b):
        ms = side["eager_ms"]
        if ms is not None and any(abs(ms - edge) <= rel * edge for edge in window):
            return True
    return False


def compare(
    base: dict[str, dict[str, Any]],
    other: dict[str, dict[str, Any]],
    window: tuple[float, float],
    rel: float,
) -> dict[str, Any]:
    differ = [k for k in base if (base[k]["stage"], base[k]["reason"]) != _key(other.get(k))]
    edge = [k for k in differ if k in other and borderline(base[k], other[k], window, rel)]
    real = [k for k in differ if k not in edge]
    rows = [{"task_id": k, "base": base[k], "other": other.get(k)} for k in differ]
    return {
        "tasks": len(base),
        "identical": len(base) - len(differ),
        "borderline": edge,
        "mismatch": real,
        "differences": rows,
    }


def _key(row: dict[str, Any] | None) -> tuple[str, str] | None:
    return None if row is None else (row["stage"], row["reason"])


# ------------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from opsynth.config import FiltersConfig, RunnerConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--candidates", type=Path, required=True, help="candidates.parquet")
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 2], help="GPU counts to run")
    parser.add_argument("--shard-size", type=int, default=16, help="candidates per Dask task")
    parser.add_argument(
        "--shards-per-worker",
        type=int,
        default=RunnerConfig().shards_per_worker,
        help="shards a Dask worker runs at once on its pool (runner.shards_per_worker)",
    )
    parser.add_argument("--workers-per-gpu", type=int, default=8, help="sandboxed workers/GPU")
    parser.add_argument(
        "--candidates-per-process",
        type=int,
        default=FiltersConfig().candidates_per_process_cuda,
        help="candidates one process may run in turn (filters.candidates_per_process_cuda)",
    )
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a dry run")
    parser.add_argument("--borderline", type=float, default=0.1, help="relative window slack")
    parser.add_argument("--out", type=Path, default=Path("multi_gpu"))
    parser.add_argument("--one", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    args.out, args.candidates = args.out.resolve(), args.candidates.resolve()
    if args.one:
        one_run(args)
        return {}
    from benchmarks.throughput import device_init
    from opsynth.config import FiltersConfig
    from opsynth.store import read_table

    runs = []
    for count in args.gpus:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(count))}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
        command = [sys.executable, __file__, "--one", str(count), *_passthrough(args)]
        print(f"{count} GPU(s) ...", flush=True)
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"{count} GPU run failed:\n{done.stderr[-4000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        rows = read_table(args.out / f"gpus-{count}" / "verdicts.parquet").to_pylist()
        result["final"] = final_rows(rows)
        result["per_minute"] = round(result["tasks"] / result["wall_s"] * 60, 1)
        result["filter_span_s"] = filter_span_s(rows)
        result["device_init"] = device_init(rows)
        runs.append(result)
        print(f"  {result['wall_s']:.0f} s, {result['per_minute']}/min", flush=True)
    base = runs[0]
    window = FiltersConfig().window_ms(args.device)
    summary = {
        "candidates": base["tasks"],
        "shard_size": args.shard_size,
        "shards_per_worker": args.shards_per_worker,
        "workers_per_gpu": args.workers_per_gpu,
        "candidates_per_process": args.candidates_per_process,
        "runs": [
            {
                "gpus": r["gpus"],
                "wall_s": round(r["wall_s"], 1),
                "per_minute": r["per_minute"],
                "speedup": round(base["wall_s"] / r["wall_s"], 2),
                "filter_span_s": r["filter_span_s"],
                "filter_span_speedup": _ratio(base["filter_span_s"], r["filter_span_s"]),
                "kept": sum(1 for v in r["final"].values() if v["reason"] == "ok"),
                "verdicts_vs_first": compare(base["final"], r["final"], window, args.borderline),
                "device_init": r["device_init"],
            }
            for r in runs
        ],
    }
    (args.out / "multi_gpu.json").write_text(json.dumps(summary, indent=2))
    print(table(summary))
    return summary


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def _passthrough(args: argparse.Namespace) -> list[str]:
    return [
        "--candidates",
        str(args.candidates),
        "--shard-size",
        str(args.shard_size),
        "--shards-per-worker",
        str(args.shards_per_worker),
        "--workers-per-gpu",
        str(args.workers_per_gpu),
        "--candidates-per-process",
        str(args.candidates_per_process),
        "--out",
        str(args.out),
        "--device",
        args.device,
    ]


def table(summary: dict[str, Any]) -> str:
    lines = [
        "| GPUs | wall s | candidates/min | speed-up | filter span s | span speed-up | kept "
        "| identical verdicts | borderline | mismatches "
        "| CUDA contexts: created; creation median s; candidates' wait total s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in summary["runs"]:
        c = r["verdicts_vs_first"]
        init = r.get("device_init") or {}
        context = (
            f"{init.get('contexts_created')}; {init.get('creation_median_s')}; "
            f"{init.get('wait_total_s')}"
            if init
            else "n/a"
        )
        lines.append(
            f"| {r['gpus']} | {r['wall_s']} | {r['per_minute']} | {r['speedup']}x "
            f"| {r['filter_span_s']} | {r['filter_span_speedup']}x | {r['kept']} "
            f"| {c['identical']}/{c['tasks']} | {len(c['borderline'])} | {len(c['mismatch'])} "
            f"| {context} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
