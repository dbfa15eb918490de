"""Filter throughput on 1 and N GPUs of one host through the Dask runner, with verdicts compared.

Run by hand on a multi-GPU host (needs prefect and prefect-dask besides torch), e.g.

    python -m benchmarks.multi_gpu --candidates results/throughput/candidates.parquet \
        --gpus 1/16 2 1 --out results/multi_gpu

The candidate set is the throughput benchmark's (``benchmarks/throughput.py`` writes it, sized,
as ``candidates.parquet``; with ``--size-only`` it stops there), so all runs see identical
tasks. Each GPU count runs in its own process: the ``screen`` stage of ``opsynth run`` (static
checks, decontamination, then every filter shard submitted at once to a local Dask cluster of
one worker per GPU, each worker seeing only its GPU and an equal share of the cores, each
running its own warm pool), in a Prefect flow on Prefect's temporary local server, with an
empty compile cache, so every run compiles cold. Wall time covers the cluster's and pools'
start as well as the filtering.

A run is ``GPUS`` or ``GPUS/CORES``: ``1/16`` runs one GPU on the first 16 of the host's cores
(the share each GPU gets in a 2-GPU run on 32 cores), ``1`` one GPU on all of them, so that
what the second GPU adds can be told apart from what the extra cores add. ``2x1/16`` runs two
independent copies of ``1/16`` side by side, each on its own GPU and cores with its own Prefect
server, Dask cluster and compile cache, starting at different points of the set: what the host
allows with nothing of the pipeline shared, against which a multi-GPU run's shortfall is the
runner's and the rest the host's (``host_scaling.py`` measures the host's cores alone).
Speed-ups are against the first run. Throughput is given three ways: end to end (wall),
between the first and the last sandboxed verdict (span), and steady (between the 10th and 90th
percentile of the candidates' last verdicts, leaving out the pools' ramp-up and the last
shards' tail).

Verdicts are compared task by task (final stage and reason). A difference is *borderline* when
either side's eager median lies within ``--borderline`` (relative) of the runtime window's
edges, or either side timed out; a *memory edge* when both sides rejected the candidate at one
stage for different memory limits (``oom`` on the device, ``resource_limit`` on the host: a
candidate over both is stopped by whichever it reaches first); any other difference is listed
as a real mismatch.

While each run filters, the run's own cores' busy share (``/proc/stat``) and every GPU's
utilisation (``nvidia-smi``) are sampled and summarised over its steady window: a steady rate
that falls short of the GPU count with neither near saturation points at something the GPUs
share on the host (the driver, the file system) rather than at the CPUs or the GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------ one run (subprocess)


def one_run(args: argparse.Namespace) -> None:
    """The screen stage over the candidate set on ``--one`` GPUs; prints one JSON line."""
    from opsynth.flows.prefect_env import configure_prefect

    out = args.out / run_label(args.one, args.one_cores, args.copy)
    configure_prefect(out / ".prefect")
    from prefect import flow

    from opsynth.config import RunConfig
    from opsynth.flows.runners import LocalOnly, task_runner
    from opsynth.flows.stages import LazyPool, WorkLedger, screen
    from opsynth.store import RunDir, read_tasks, write_verdicts

    tasks = read_tasks(args.candidates)
    if args.copy:  # side-by-side copies start at different points of the set (``rotated``)
        tasks = rotated(tasks, args.copy, args.copies)
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
    )  # one worker per GPU, each with an equal share of this process's cores (its affinity)

    marks: dict[str, float] = {}

    @flow(name="multi-gpu-benchmark")
    def screen_flow(progress) -> tuple[list, list[dict[str, Any]]]:
        marks["flow_started_at"] = time.time()
        run = RunDir.create(out / "run")
        pool = LazyPool(cfg, args.device)  # stays unstarted: every shard goes to the cluster
        try:
            verdicts = screen(run, cfg, tasks, args.device, pool, WorkLedger(), progress)
        finally:
            pool.close()
        marks["screened_at"] = time.time()
        return verdicts, cluster_pool_stats()

    marks["started_at"] = time.time()
    start = time.perf_counter()
    engine = task_runner(cfg.runner, args.device, cfg.filters)
    verdicts, pools = screen_flow.with_options(task_runner=engine)(LocalOnly(lambda *a: None))
    wall = time.perf_counter() - start
    write_verdicts(verdicts, out / "verdicts.parquet")
    cores = len(os.sched_getaffinity(0))
    result = {"gpus": args.one, "cores": cores, "tasks": len(tasks), "wall_s": wall}
    print(json.dumps({**result, "marks": marks, "pools": pools}))


def cluster_pool_stats() -> list[dict[str, Any]]:
    """Every Dask worker's warm-pool stats (``filters.process_pool.stats``), in worker order:
    when its pool started and was ready, how its candidates' processes were started, reused or
    retired. Call inside the flow, while the cluster is up."""
    from prefect_dask import get_dask_client

    from opsynth.filters import process_pool

    with get_dask_client() as client:
        found = client.run(process_pool.stats)
    return [found[address] for address in sorted(found)]


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


def stamped(rows: list[dict[str, Any]], stages: Any = None) -> list[tuple[dict, datetime]]:
    """(row, its ``created_at``) for the rows of ``stages``, by default the sandboxed
    filters'. Verdict times are whole seconds."""
    from opsynth.filters.reasons import STAGES

    wanted = STAGES if stages is None else stages
    return [(r, datetime.fromisoformat(r["created_at"])) for r in rows if r["stage"] in wanted]


def filter_span_s(rows: list[dict[str, Any]]) -> float | None:
    """Seconds from the first to the last sandboxed-filter verdict: the filtering itself,
    without the cluster's, the pools' and Prefect's start-up and the orchestrator-side
    prefilter, which do not shrink with more GPUs."""
    times = [at for _, at in stamped(rows)]
    return (max(times) - min(times)).total_seconds() if len(times) > 1 else None


def steady_window(
    rows: list[dict[str, Any]], low: float = 0.1, high: float = 0.9
) -> tuple[int, datetime, datetime] | None:
    """(candidates, start, end) between the ``low`` and ``high`` quantiles of the candidates'
    last sandboxed verdicts: once every pool is running and before the last shards leave
    GPUs idle, both of which a longer run amortises."""
    last: dict[str, datetime] = {}
    for row, at in stamped(rows):
        last[row["task_id"]] = max(at, last.get(row["task_id"], at))
    times = sorted(last.values())
    first, final = int(low * len(times)), int(high * len(times)) - 1
    if final <= first or times[final] <= times[first]:
        return None
    return final - first, times[first], times[final]


def steady_per_minute(
    rows: list[dict[str, Any]], low: float = 0.1, high: float = 0.9
) -> float | None:
    """Candidates per minute within ``steady_window``."""
    window = steady_window(rows, low, high)
    if window is None:
        return None
    count, start, end = window
    return round(count / (end - start).total_seconds() * 60, 1)


def usage_within(row_sets: list[list[dict[str, Any]]], cpu: Any, gpu: Any) -> dict[str, Any]:
    """The run's cores' busy share and each GPU's utilisation within its steady window (from
    the earliest to the latest of its copies' windows; the whole run where there is none):
    whether the CPUs or the GPUs bound the steady rate."""
    windows = [w for w in map(steady_window, row_sets) if w is not None]
    between = None
    if windows:
        between = (min(w[1] for w in windows).timestamp(), max(w[2] for w in windows).timestamp())
    return {"cpu": cpu.summary(between), "gpu": gpu.summary(between)}


def phases(
    marks: dict[str, float], pools: list[dict[str, Any]], rows: list[dict[str, Any]]
) -> dict[str, Any]:
    """Seconds from the run's start to each milestone: the flow running (Prefect's server and
    the cluster up), the prefilter's last row, each worker's pool ready and done with its last
    candidate (a pool done well before the others had nothing left to take), the first and
    last sandboxed verdict, the flow done. Verdict times are whole seconds."""
    start = marks["started_at"]

    def at(stages: Any, pick: Any) -> float | None:
        times = [moment for _, moment in stamped(rows, stages)]
        return round(pick(times).timestamp() - start, 1) if times else None

    ready = [
        round(p["started_at"] + p["start_s"] - start, 1)
        for p in pools
        if p.get("started_at") is not None and p.get("start_s") is not None
    ]
    done = [round(p["last_result_at"] - start, 1) for p in pools if p.get("last_result_at")]
    return {
        "flow_running_s": round(marks["flow_started_at"] - start, 1),
        "prefilter_done_s": at(("static", "decontam"), max),
        "pools_ready_s": ready,
        "pools_done_s": done,
        "first_verdict_s": at(None, min),
        "last_verdict_s": at(None, max),
        "flow_done_s": round(marks["screened_at"] - start, 1),
    }


class RunSpec(NamedTuple):
    """``gpus`` GPUs on ``cores`` cores (0 = the host's share), ``copies`` times side by side."""

    gpus: int
    cores: int
    copies: int = 1


def run_label(gpus: int, cores: int, copy: int | None = None) -> str:
    """A run's folder; ``copy`` numbers the copies of a side-by-side run."""
    label = f"gpus-{gpus}" + (f"-cores-{cores}" if cores else "")
    return label if copy is None else f"{label}-copy-{copy}"


def parse_run(text: str) -> RunSpec:
    """``GPUS``, ``GPUS/CORES`` or ``COPIESxGPUS[/CORES]`` (cores 0 or left out = all of the
    host's, split between the copies)."""
    copies, _, rest = text.rpartition("x")
    gpus, _, cores = rest.partition("/")
    try:
        parsed = RunSpec(int(gpus), int(cores or 0), int(copies or 1))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected GPUS, GPUS/CORES or COPIESxGPUS/CORES"
        ) from None
    if parsed.gpus < 1 or parsed.cores < 0 or parsed.copies < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: GPUs and copies must be >= 1, cores >= 0")
    return parsed


def copy_slices(spec: RunSpec, cores: list[int]) -> list[tuple[list[int], list[int]]]:
    """(cores, GPU indices) of each copy of ``spec``: disjoint slices of the host's cores and
    GPUs, so side-by-side copies share nothing the benchmark hands out. Pure."""
    share = spec.cores or len(cores) // spec.copies
    if share * spec.copies > len(cores) or share < 1:
        raise ValueError(
            f"{spec.copies}x{spec.gpus}/{spec.cores}: needs {share * spec.copies} cores, "
            f"this process may use {len(cores)}"
        )
    return [
        (cores[i * share : (i + 1) * share], list(range(i * spec.gpus, (i + 1) * spec.gpus)))
        for i in range(spec.copies)
    ]


# Reasons for a candidate stopped by a memory limit: the device's (``oom``) or the host's
# (``resource_limit``: resident memory). A candidate that needs more than both allow is stopped
# by whichever it reaches first, which can differ from run to run.
MEMORY_LIMITS = frozenset({"oom", "resource_limit"})


def borderline(a: dict[str, Any], b: dict[str, Any], window: tuple[float, float], rel: float):
    if "timeout" in (a["reason"], b["reason"]):
        return True
    for side in (a, b):
        ms = side["eager_ms"]
        if ms is not None and any(abs(ms - edge) <= rel * edge for edge in window):
            return True
    return False


def memory_edge(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Both runs rejected the candidate for a memory limit, at the same stage."""
    return a["stage"] == b["stage"] and {a["reason"], b["reason"]} <= MEMORY_LIMITS


def compare(
    base: dict[str, dict[str, Any]],
    other: dict[str, dict[str, Any]],
    window: tuple[float, float],
    rel: float,
) -> dict[str, Any]:
    """Final verdicts task by task. A difference is borderline (the runtime window's edges, a
    timeout), a memory edge (rejected by both, for different memory limits) or a mismatch."""
    differ = [k for k in base if (base[k]["stage"], base[k]["reason"]) != _key(other.get(k))]
    edge = [k for k in differ if k in other and borderline(base[k], other[k], window, rel)]
    memory = [k for k in differ if k in other and k not in edge and memory_edge(base[k], other[k])]
    real = [k for k in differ if k not in edge and k not in memory]
    rows = [{"task_id": k, "base": base[k], "other": other.get(k)} for k in differ]
    return {
        "tasks": len(base),
        "identical": len(base) - len(differ),
        "borderline": edge,
        "memory_edge": memory,
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
    parser.add_argument(
        "--gpus",
        type=parse_run,
        nargs="+",
        default=[RunSpec(1, 0), RunSpec(2, 0)],
        help="runs, in order: GPUS or GPUS/CORES (CORES of the host's; default all); "
        "COPIESxGPUS/CORES runs COPIES independent copies of that run side by side, each on "
        "its own GPUs and cores: what the host allows with nothing shared between the GPUs",
    )
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
    parser.add_argument("--one-cores", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--copy", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--copies", type=int, default=1, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    args.out, args.candidates = args.out.resolve(), args.candidates.resolve()
    if args.one:
        one_run(args)
        return {}
    from benchmarks.cpu_usage import CpuSampler
    from benchmarks.gpu_usage import GpuSampler

    runs = []
    cores = sorted(os.sched_getaffinity(0))
    for spec in args.gpus:
        try:
            slices = copy_slices(spec, cores)
        except ValueError as exc:
            sys.exit(str(exc))
        print(f"{spec.copies}x{run_label(spec.gpus, spec.cores)} ...", flush=True)
        allowed = {c for own, _ in slices for c in own}
        with CpuSampler(cpus=allowed) as cpu, GpuSampler() as gpu:
            copies = run_copies(args, spec, slices)
        runs.append(combine(spec, copies, cpu, gpu))
        print(f"  {runs[-1]['wall_s']:.0f} s, {runs[-1]['per_minute']}/min", flush=True)
        summary = summarise(args, runs)
        (args.out / "multi_gpu.json").write_text(json.dumps(summary, indent=2))
    print(table(summary))
    return summary


def rotated(items: list[Any], copy: int, copies: int) -> list[Any]:
    """``items`` started ``copy``/``copies`` of the way in and wrapped around: side-by-side
    copies of a run then meet the set's heaviest candidates (the GPU- and host-memory-hungry
    ones, the slow compiles) at different times instead of all at once, as shards of one run
    spread over GPUs do. Pure."""
    start = copy * len(items) // copies
    return items[start:] + items[:start]


def run_copies(
    args: argparse.Namespace, spec: RunSpec, slices: list[tuple[list[int], list[int]]]
) -> list[dict[str, Any]]:
    """Each copy of ``spec`` in its own process, all at once, each on its slice of the cores
    and GPUs; each result with its verdict rows."""
    from opsynth.store import read_table

    side_by_side = spec.copies > 1
    started = []
    for i, (own, gpus) in enumerate(slices):
        copy = i if side_by_side else None
        label = run_label(spec.gpus, spec.cores, copy)
        shutil.rmtree(args.out / label, ignore_errors=True)  # an earlier run's rows would mix in
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
        command = [sys.executable, __file__, "--one", str(spec.gpus)]
        command += ["--one-cores", str(spec.cores), *_passthrough(args)]
        command += ["--copy", str(i), "--copies", str(spec.copies)] if side_by_side else []
        started.append(
            (
                label,
                subprocess.Popen(
                    command,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    preexec_fn=lambda own=own: os.sched_setaffinity(0, own),
                ),
            )
        )
    results = []
    for label, proc in started:
        stdout, stderr = proc.communicate()
        if proc.returncode:
            sys.exit(f"{label} run failed:\n{stderr[-4000:]}")
        result = json.loads(stdout.strip().splitlines()[-1])
        result["rows"] = read_table(args.out / label / "verdicts.parquet").to_pylist()
        results.append(result)
    return results


def combine(spec: RunSpec, copies: list[dict[str, Any]], cpu: Any, gpu: Any) -> dict[str, Any]:
    """One run's figures from its copies (one, or several side by side on the same candidate
    set): rates add up, times are the slowest copy's."""
    from benchmarks.throughput import device_init

    rows = [row for c in copies for row in c["rows"]]
    pools = [p for c in copies for p in c["pools"]]
    steady = [steady_per_minute(c["rows"]) for c in copies]
    spans = [filter_span_s(c["rows"]) for c in copies]
    first = min(copies, key=lambda c: c["marks"]["started_at"])
    wall = max(c["wall_s"] for c in copies)
    return {
        "gpus": spec.gpus,
        "copies": spec.copies,
        "cores": sum(c["cores"] for c in copies),
        "tasks": first["tasks"],
        "wall_s": wall,
        "per_minute": round(sum(c["tasks"] for c in copies) / wall * 60, 1),
        "filter_span_s": max(spans) if None not in spans else None,
        "steady_per_minute": round(sum(steady), 1) if None not in steady else None,
        "finals": [final_rows(c["rows"]) for c in copies],
        "usage": usage_within([c["rows"] for c in copies], cpu, gpu),
        "device_init": device_init(rows),
        "phases": phases(first["marks"], pools, rows),
        "pools": pools,
    }


def compare_copies(
    base: dict[str, dict[str, Any]],
    finals: list[dict[str, dict[str, Any]]],
    window: tuple[float, float],
    rel: float,
) -> dict[str, Any]:
    """``compare`` of every copy's verdicts against ``base``, added up."""
    total: dict[str, Any] = {}
    for final in finals:
        for key, value in compare(base, final, window, rel).items():
            total[key] = total.get(key, 0 if isinstance(value, int) else []) + value
    return total


def summarise(args: argparse.Namespace, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs so far against the first (written after each run, so a cut-off session keeps
    what finished)."""
    from opsynth.config import FiltersConfig

    base = runs[0]
    window = FiltersConfig().window_ms(args.device)
    return {
        "candidates": base["tasks"],
        "shard_size": args.shard_size,
        "shards_per_worker": args.shards_per_worker,
        "workers_per_gpu": args.workers_per_gpu,
        "candidates_per_process": args.candidates_per_process,
        "runs": [
            {
                "gpus": r["gpus"],
                "copies": r["copies"],
                "cores": r["cores"],
                "wall_s": round(r["wall_s"], 1),
                "per_minute": r["per_minute"],
                "speedup": _ratio(base["wall_s"] * r["copies"], r["wall_s"] * base["copies"]),
                "filter_span_s": r["filter_span_s"],
                "filter_span_speedup": _ratio(
                    (base["filter_span_s"] or 0) * r["copies"],
                    (r["filter_span_s"] or 0) * base["copies"],
                ),
                "steady_per_minute": r["steady_per_minute"],
                "steady_speedup": _ratio(r["steady_per_minute"], base["steady_per_minute"]),
                "kept": [sum(v["reason"] == "ok" for v in f.values()) for f in r["finals"]],
                "verdicts_vs_first": compare_copies(
                    base["finals"][0], r["finals"], window, args.borderline
                ),
                "device_init": r["device_init"],
                "usage": r["usage"],
                "phases": r["phases"],
                "pools": [_pool_summary(p) for p in r["pools"]],
            }
            for r in runs
        ],
    }


def _pool_summary(stats: dict[str, Any]) -> dict[str, Any]:
    keys = ("workers", "start_s", "candidates", "child_prestarted", "child_reused")
    keys += ("audit_prepare_s", "first_result_at", "last_result_at")
    return {**{k: stats.get(k) for k in keys}, "child_retired": stats.get("child_retired")}


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


def _usage(usage: dict[str, Any] | None) -> str:
    cpu = (usage or {}).get("cpu") or {}
    gpus = (usage or {}).get("gpu") or {}
    busy = cpu.get("busy_mean_pct", "n/a")
    per_gpu = ", ".join(f"{g}: {v['utilization_mean_pct']}" for g, v in sorted(gpus.items()))
    return f"{busy}; {per_gpu or 'n/a'}"


def _gpus(run: dict[str, Any]) -> str:
    copies = run.get("copies", 1)
    return f"{copies} x {run['gpus']} side by side" if copies > 1 else str(run["gpus"])


def table(summary: dict[str, Any]) -> str:
    lines = [
        "| GPUs | cores | wall s | candidates/min | speed-up | filter span s | span speed-up "
        "| steady candidates/min | steady speed-up | kept | identical verdicts | borderline "
        "| memory edge | mismatches "
        "| CUDA contexts: created; creation median s; candidates' wait total s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
        "| --- |",
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
            f"| {_gpus(r)} | {r['cores']} | {r['wall_s']} | {r['per_minute']} | {r['speedup']}x "
            f"| {r['filter_span_s']} | {r['filter_span_speedup']}x | {r['steady_per_minute']} "
            f"| {r['steady_speedup']}x | {' + '.join(map(str, r['kept']))} "
            f"| {c['identical']}/{c['tasks']} "
            f"| {len(c['borderline'])} | {len(c['memory_edge'])} | {len(c['mismatch'])} "
            f"| {context} |"
        )
    lines += [
        "",
        "| GPUs | cores | flow running s | prefilter done s | pools ready s | pools done s "
        "| first verdict s | last verdict s | flow done s | per pool: candidates, reused "
        "processes, audit-baseline wait s | steady window: cores busy mean %; GPU utilisation "
        "mean % |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in summary["runs"]:
        p = r["phases"]
        pools = "; ".join(
            f"{x['candidates']}, {x['child_reused']}, {round(x['audit_prepare_s'] or 0, 1)}"
            for x in r["pools"]
        )
        lines.append(
            f"| {_gpus(r)} | {r['cores']} | {p['flow_running_s']} | {p['prefilter_done_s']} "
            f"| {', '.join(map(str, p['pools_ready_s']))} "
            f"| {', '.join(map(str, p['pools_done_s']))} | {p['first_verdict_s']} "
            f"| {p['last_verdict_s']} | {p['flow_done_s']} | {pools} | {_usage(r.get('usage'))} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
