"""Filter throughput of the warm worker pool against a naive harness, and timing noise.

Run by hand on a GPU host (torch, pyarrow and pydantic suffice; no Prefect), e.g.

    python -m benchmarks.throughput --kernelbench kernelbench.jsonl \
        --ops6k cuda_agent_ops_6k.parquet --composed 150 --device cuda --out results/throughput

One fixed, seeded candidate set (KernelBench level 2, ``--ops6k-n`` sampled Ops-6K rows,
``--composed`` candidates composed from the seed catalogue (``--catalogue``) and sized as
``opsynth run`` sizes them) goes through the static check and every sandboxed stage on one
``WorkerPool``: candidates per minute, seconds per stage (the verdict rows' ``elapsed_s``), peak
worker memory (/proc). Then a seeded subset (``--naive``, bounded by ``--naive-budget-s``) goes
through the naive harness: one fresh process per candidate, sequentially, the same filters, an
empty compile cache each time; its rate is extrapolated from the subset, drawn and weighted by
the pool's final reasons (see ``naive_subset``). Timing noise: the eager median of ``--noise``
tasks measured while the pool's other workers compiled, against the same tasks measured alone
(one worker, twice: the second pair is the noise floor). The pool builds its trusted
compile-cache layer at start (``--warm-cache`` reuses the host's); every candidate's own caches
are private, so both sides compile cold. Prints a markdown table
and writes ``throughput.json``, the verdicts and the sized candidate set
(``candidates.parquet``, which ``benchmarks/multi_gpu.py`` takes) to ``--out``; ``--size-only``
writes that set and stops.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.cpu_usage import CpuSampler
from benchmarks.gpu_usage import GpuSampler
from benchmarks.proc_memory import MemorySampler
from opsynth.config import ComposeConfig, FiltersConfig, SeedsConfig, SizingConfig
from opsynth.filters.audit import audit_tasks
from opsynth.filters.pool import WorkerPool, check_settings, host_cores, resolve_device
from opsynth.record import Task, Verdict
from opsynth.store import write_tasks, write_verdicts
from opsynth.tasksets import load_kernelbench, load_task_set
from opsynth.verdicts import group_by_task, timing_measures

NAIVE = Path(__file__).resolve().parent / "naive_candidate.py"


# ------------------------------------------------------------------------ the candidate set


def candidate_set(args: argparse.Namespace) -> tuple[list[Task], list[Task], dict[str, Any]]:
    """(fixed tasks: KernelBench + Ops-6K rows, composed tasks still to be sized, counts)."""
    if args.tasks:
        return reused_set(args.tasks)
    kb = load_kernelbench(args.kernelbench, [2]) if args.kernelbench else []
    kb = kb[: args.kb_limit] if args.kb_limit else kb
    ops6k: list[Task] = []
    if args.ops6k and args.ops6k_n:
        rows = list({t.id: t for t in load_task_set(args.ops6k)}.values())
        ops6k = random.Random(args.seed).sample(rows, min(args.ops6k_n, len(rows)))
    composed: list[Task] = []
    compose_s = 0.0
    if args.composed:
        from opsynth.synth.composers import run_composer

        start = time.perf_counter()
        seeds = catalogue_seeds(args.catalogue)
        result = run_composer(seeds, ComposeConfig(seed=args.seed), args.composed)
        composed = result.kept()[: args.composed]
        compose_s = time.perf_counter() - start
    counts = {"kernelbench_l2": len(kb), "ops6k": len(ops6k), "composed": len(composed)}
    return kb + ops6k, composed, {**counts, "compose_s": round(compose_s, 1)}


def catalogue_seeds(catalogue: Path | None) -> list[Task]:
    """The seeds a run composes from: an extracted catalogue's ``seeds.parquet`` (``opsynth
    seeds extract --out DIR``), else the default libraries' catalogue, extracted once into the
    user cache as ``opsynth run`` does."""
    from opsynth.store import read_tasks

    if catalogue is not None:
        return read_tasks(catalogue / "seeds.parquet")
    from opsynth.synth.catalog.report import ensure_catalogue

    root = Path(tempfile.mkdtemp(prefix="throughput-seeds-"))
    ensure_catalogue(root, SeedsConfig())
    return read_tasks(root / "catalogue" / "seeds.parquet")


def reused_set(path: Path) -> tuple[list[Task], list[Task], dict[str, Any]]:
    """A set an earlier run wrote (``candidates.parquet``: sized, in its filtering order), so
    that runs differing in one setting filter the same candidates without sizing again."""
    tasks = load_task_set(path)
    sized = sum(1 for t in tasks if "sizing" in t.meta)
    kb = sum(1 for t in tasks if t.data_source == "kernelbench_l2")
    counts = {"kernelbench_l2": kb, "ops6k": len(tasks) - kb - sized, "composed": sized}
    return tasks, [], {**counts, "compose_s": 0.0, "reused": str(path)}


def size(
    pool: WorkerPool, tasks: list[Task], cfg: FiltersConfig, device: str, sizing: SizingConfig
) -> list[Task]:
    """Composed tasks rescaled into the runtime window, as the ``size`` stage of a run does."""
    from opsynth.filters.sizing import Probe, probe_of, size_tasks

    def measure(batch: list[Task]) -> dict[str, Probe]:
        started = time.perf_counter()
        measured = pool.measure(batch)
        log(f"sizing round: {len(batch)} probes in {time.perf_counter() - started:.0f} s")
        return {task_id: probe_of(rows) for task_id, rows in measured.items()}

    return size_tasks(tasks, measure, cfg.window_ms(device), sizing)


# ------------------------------------------------------------------------ progress

BEGIN = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.perf_counter() - BEGIN:6.0f} s] {message}", flush=True)


def _every(step: int):
    def progress(done: int, total: int) -> None:
        if done % step == 0 or done == total:
            log(f"filtered {done}/{total}")

    return progress


# ------------------------------------------------------------------------ pure summaries


def stage_times(verdicts: list[Verdict]) -> dict[str, dict[str, float]]:
    """Per execution stage: rows, total and median seconds (the workers' own clocks), the part
    of the total spent queueing for the GPU's lock (``gpu_lock_wait_s``), and the time the
    stage held the GPU to itself (``gpu_exclusive_s``: its timed runs)."""
    by_stage: dict[str, list[float]] = {}
    waits: dict[str, float] = {}
    exclusive: dict[str, float] = {}
    for v in verdicts:
        if v.stage != "static":
            by_stage.setdefault(v.stage, []).append(v.elapsed_s)
            for into, key in ((waits, "gpu_lock_wait_s"), (exclusive, "gpu_exclusive_s")):
                into[v.stage] = into.get(v.stage, 0.0) + float(v.measures.get(key) or 0.0)
    return {
        stage: {
            "rows": len(times),
            "total_s": round(sum(times), 2),
            "median_s": round(statistics.median(times), 4),
            "lock_wait_s": round(waits[stage], 2),
            "exclusive_s": round(exclusive[stage], 2),
        }
        for stage, times in by_stage.items()
    }


def device_init(verdicts: list[Verdict] | list[dict[str, Any]]) -> dict[str, float] | None:
    """From the eager rows: the CUDA context's creation (median s) and what candidates waited
    for it (median and total s); a prestarted child has it ready before its candidate starts.
    The host creates contexts one at a time (``benchmarks/context_creation.py``), so a long
    wait means candidates arrive faster than the host makes contexts."""
    rows = []
    for v in verdicts:
        row = v if isinstance(v, dict) else v.__dict__
        measures = row.get("measures") or {}
        if isinstance(measures, str):  # as read back from parquet
            measures = json.loads(measures)
        if row["stage"] == "eager" and "device_wait_s" in measures:
            rows.append(measures)
    if not any(float(m.get("device_init_s") or 0) > 0 for m in rows):
        return None  # no context made: a CPU run
    waits = [float(m["device_wait_s"]) for m in rows]
    # A reused process's later candidates found its context made: no creation to count.
    created = [float(m["device_init_s"]) for m in rows if not m.get("context_reused")]
    return {
        "contexts_created": len(created),
        "creation_median_s": round(statistics.median(created), 3) if created else None,
        "wait_median_s": round(statistics.median(waits), 3),
        "wait_total_s": round(sum(waits), 1),
    }


def final_reasons(verdicts: list[Verdict] | list[dict[str, Any]]) -> dict[str, str]:
    """task id -> the reason of its last row (``ok`` for a task that passed every stage)."""
    last: dict[str, str] = {}
    for v in verdicts:
        row = v if isinstance(v, dict) else v.__dict__
        last[row["task_id"]] = row["reason"]
    return last


def naive_subset(tasks: list[Task], final: dict[str, str], n: int, seed: int) -> list[Task]:
    """``n`` tasks whose final reasons follow the pool's mix: systematic sampling over the
    tasks ordered by final reason. What a naive run costs depends on how far its candidate
    gets (a trivial answer is rejected in 4 s, a kept candidate compiles), so a plain random
    sample of a few can miss the expensive ones altogether."""
    rng = random.Random(seed)
    shuffled = list(tasks)
    rng.shuffle(shuffled)
    ordered = sorted(shuffled, key=lambda t: final.get(t.id, ""))
    n = min(n, len(ordered))
    if n == 0:
        return []
    step = len(ordered) / n
    offset = rng.random() * step
    picked = [ordered[int(offset + i * step)] for i in range(n)]
    rng.shuffle(picked)  # a budget that stops the run early still leaves a mixed sample
    return picked


def naive_seconds_per_task(rows: list[dict[str, Any]], final: dict[str, str]) -> float | None:
    """The naive harness's mean seconds per candidate over the pool's whole set: each final
    reason's mean over the candidates of it that ran, weighted by the pool's count of that
    reason; a reason none of which ran gets the mean of all that ran."""
    if not rows:
        return None
    overall = statistics.mean(r["seconds"] for r in rows)
    by_reason: dict[str, list[float]] = {}
    for r in rows:
        by_reason.setdefault(final.get(r["task_id"], ""), []).append(r["seconds"])
    counts = _count(final.values())
    total = sum(counts.values())
    return sum(
        count * (statistics.mean(by_reason[reason]) if reason in by_reason else overall)
        for reason, count in counts.items()
    ) / max(total, 1)


def eager_medians(rows: dict[str, list[Verdict]]) -> dict[str, float]:
    found = {}
    for task_id, verdicts in rows.items():
        for v in verdicts:
            timed = timing_measures(v)
            if timed and "eager_ms_median" in timed:
                found[task_id] = float(timed["eager_ms_median"])
    return found


def relative_spread(a: dict[str, float], b: dict[str, float]) -> float | None:
    """Median over tasks in both of |a - b| / b."""
    spreads = [abs(a[k] - b[k]) / b[k] for k in a.keys() & b.keys() if b[k] > 0]
    return round(statistics.median(spreads), 4) if spreads else None


# ------------------------------------------------------------------------ the three runs


def filtering_order(tasks: list[Task], seed: int) -> list[Task]:
    """Seeded shuffle, so that the noise tasks land among compiling ones."""
    ordered = list(tasks)
    random.Random(seed).shuffle(ordered)
    return ordered


def pool_run(
    tasks: list[Task],
    composed: list[Task],
    cfg: FiltersConfig,
    device: str,
    seed: int,
    sizing: SizingConfig,
    shuffle: bool = True,
) -> dict[str, Any]:
    """Start, size, filter on one pool; memory sampled throughout."""
    start = time.perf_counter()
    pool = WorkerPool(cfg, device)
    with MemorySampler() as memory, pool:  # entering starts the workers
        started = time.perf_counter()
        log(f"pool started ({pool.stats.get('workers')} workers)")
        sized = size(pool, composed, cfg, device, sizing) if composed else []
        size_s = time.perf_counter() - started
        sizing_retry_s = float(pool.stats.get("retried_alone_s") or 0.0)
        everything = filtering_order(tasks + sized, seed) if shuffle else tasks + sized
        filter_start = time.perf_counter()
        with GpuSampler() as gpu, CpuSampler() as cpu:
            result = audit_tasks(everything, cfg, device, progress=_every(25), pool=pool)
        filter_s = time.perf_counter() - filter_start
        stats = dict(pool.stats)
    by_task = group_by_task(result.verdicts)
    return {
        "tasks": everything,
        "verdicts": result.verdicts,
        "by_task": by_task,
        "kept": len(result.kept),
        "start_s": started - start,
        "size_s": size_s,
        "filter_s": filter_s,
        "filter_retry_s": float(stats.get("retried_alone_s") or 0.0) - sizing_retry_s,
        "gpu_usage": gpu.summary(),
        "cpu_usage": cpu.summary(),
        "stats": stats,
        "peak_rss_total_gb": memory.peak_total / 2**30,
        "peak_rss_process_gb": memory.peak_process / 2**30,
        "memory_samples": memory.samples,
    }


def naive_run(
    tasks: list[Task], cfg: FiltersConfig, device: str, budget_s: float
) -> dict[str, Any]:
    """Each task in a fresh process, one after another, until done or ``budget_s`` spent."""
    seconds: list[float] = []
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="opsynth-naive-") as tmp:
        settings = check_settings(cfg, device, threads=host_cores(), lock_dir=tmp)
        settings_path = Path(tmp, "settings.json")
        settings_path.write_text(json.dumps(settings))
        begin = time.perf_counter()
        for task in tasks:
            if seconds and time.perf_counter() - begin > budget_s:
                break
            work = Path(tempfile.mkdtemp(dir=tmp))
            code = work / "candidate.py"
            code.write_text(task.code)
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor")}
            env["TRITON_CACHE_DIR"] = str(work / "triton")
            start = time.perf_counter()
            try:
                done = subprocess.run(
                    [sys.executable, str(NAIVE), str(code), str(settings_path), task.data_source],
                    capture_output=True,
                    text=True,
                    env=env,
                    cwd=work,
                    timeout=cfg.task_timeout_s + cfg.grace_s,
                )
                lines = done.stdout.strip().splitlines()
                found = json.loads(lines[-1]) if lines else []
                reason = found[-1]["reason"] if found else f"exit {done.returncode}"
            except subprocess.TimeoutExpired:
                reason = "timeout"
            seconds.append(time.perf_counter() - start)
            rows.append({"task_id": task.id, "reason": reason, "seconds": seconds[-1]})
    return {"rows": rows, "seconds": seconds}


def alone_medians(tasks: list[Task], cfg: FiltersConfig, device: str) -> list[dict[str, float]]:
    """The tasks' eager medians on a one-worker pool, measured twice."""
    with WorkerPool(cfg.model_copy(update={"workers": 1}), device) as pool:
        return [eager_medians(pool.measure(tasks)) for _ in range(2)]


# ------------------------------------------------------------------------ report


def summarise(args, counts, cfg, device, pool, naive, alone) -> dict[str, Any]:
    n = len(pool["tasks"])
    pool_rate = n / pool["filter_s"] * 60 if pool["filter_s"] else 0.0
    e2e_s = pool["start_s"] + pool["size_s"] + pool["filter_s"]
    done = len(naive["seconds"])
    pool_final = final_reasons(pool["verdicts"])
    naive_mean = naive_seconds_per_task(naive["rows"], pool_final)
    naive_rate = 60 / naive_mean if naive_mean else None
    agree = sum(1 for r in naive["rows"] if pool_final.get(r["task_id"]) == r["reason"])
    concurrent = eager_medians(pool["by_task"])
    return {
        "device": device,
        "device_name": pool["stats"].get("device_name"),
        "torch_version": pool["stats"].get("torch_version"),
        "host_cores": host_cores(),
        "workers": pool["stats"].get("workers"),
        "sandbox": pool["stats"].get("sandbox"),
        "compile_cache": "trusted layer reused"
        if args.warm_cache
        else "trusted layer built at start",
        "preimported": pool["stats"].get("preimported", 0),
        "prestart_child": cfg.prestart_child,
        "batch_timers": cfg.batch_timers,
        "candidates_per_process": cfg.candidates_per_process(device),
        "sizing_max_device_gib": args.max_device_gib,
        "candidates": counts | {"total": n, "kept": pool["kept"]},
        "pool": {
            "start_s": round(pool["start_s"], 1),
            "size_s": round(pool["size_s"], 1),
            "filter_s": round(pool["filter_s"], 1),
            "per_minute": round(pool_rate, 1),
            "per_minute_with_start_and_sizing": round(n / e2e_s * 60, 1) if e2e_s else 0.0,
            "stage_times": stage_times(pool["verdicts"]),
            "device_init": device_init(pool["verdicts"]),
            "final_reasons": dict(sorted(_count(pool_final.values()).items())),
            "peak_rss_total_gb": round(pool["peak_rss_total_gb"], 2),
            "peak_rss_process_gb": round(pool["peak_rss_process_gb"], 2),
            "workers_started": pool["stats"].get("workers_started"),
            "retried_alone": pool["stats"].get("retried_alone"),
            "retried_alone_s": pool["stats"].get("retried_alone_s"),
            "filter_retry_s": round(pool["filter_retry_s"], 1),
            "gpu_usage": pool["gpu_usage"],
            "cpu_usage": pool["cpu_usage"],
            "children": {
                k: pool["stats"].get(f"child_{k}")
                for k in ("prestarted", "fresh", "replaced", "refused", "unresponsive", "reused")
            },
            "retired_by_audit": pool["stats"].get("child_retired") or {},
            "audit_prepare_s": round(pool["stats"].get("audit_prepare_s") or 0.0, 1),
        },
        "naive": {
            "subset": done,
            "subset_requested": args.naive,
            "extrapolated": done < n,
            "mean_s_per_candidate": round(naive_mean, 2) if naive_mean else None,
            "per_minute": round(naive_rate, 2) if naive_rate else None,
            "same_final_reason_as_pool": agree,
            "rows": naive["rows"],
        },
        "speedup_vs_naive": round(pool_rate / naive_rate, 2) if naive_rate else None,
        "noise": {
            "tasks": len(alone[0]) if alone else 0,
            "spread_concurrent_vs_alone": relative_spread(concurrent, alone[0]) if alone else None,
            "spread_alone_vs_alone": relative_spread(alone[1], alone[0]) if alone else None,
            "eager_ms": {
                k: {
                    "concurrent": concurrent.get(k),
                    "alone": alone[0][k],
                    "alone2": alone[1].get(k),
                }
                for k in (alone[0] if alone else {})
            },
        },
    }


def judge_comparison(on: dict[str, Any], off: dict[str, Any]) -> dict[str, Any]:
    """The same set filtered with the judge's verify stage (``on``) and without: rates, kept
    counts, and the tasks whose final reason differs (verify's own rejections among them)."""
    n = len(on["tasks"])
    final_on, final_off = final_reasons(on["verdicts"]), final_reasons(off["verdicts"])
    differ = {
        task_id: {"judge": final_on.get(task_id), "no_judge": reason}
        for task_id, reason in final_off.items()
        if final_on.get(task_id) != reason
    }
    verify = [v for v in on["verdicts"] if v.stage == "verify"]
    return {
        "candidates": n,
        "per_minute_judge": round(n / on["filter_s"] * 60, 1) if on["filter_s"] else None,
        "per_minute_no_judge": round(n / off["filter_s"] * 60, 1) if off["filter_s"] else None,
        "kept_judge": on["kept"],
        "kept_no_judge": off["kept"],
        "verify_rows": len(verify),
        "verify_mean_s": round(statistics.mean(v.elapsed_s for v in verify), 3) if verify else 0,
        "verify_rejected": dict(_count(v.reason for v in verify if not v.passed)),
        "final_reason_differs": differ,
    }


def judge_table(c: dict[str, Any]) -> str:
    return "\n".join(
        [
            "",
            "| design | candidates/min | kept |",
            "| --- | --- | --- |",
            f"| judge (verify stage) | {c['per_minute_judge']} | {c['kept_judge']} |",
            f"| candidate's own rows | {c['per_minute_no_judge']} | {c['kept_no_judge']} |",
            "",
            f"verify: {c['verify_rows']} rows, {c['verify_mean_s']} s mean, rejected "
            f"{c['verify_rejected'] or 'none'}; final reason differs for "
            f"{len(c['final_reason_differs'])} task(s)",
        ]
    )


def _count(values) -> dict[str, int]:
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return counts


def table(s: dict[str, Any]) -> str:
    p, nv, noise = s["pool"], s["naive"], s["noise"]
    c = s["candidates"]
    mix = f"{c['kernelbench_l2']} KB-L2 + {c['ops6k']} Ops-6K + {c['composed']} composed"
    naive_note = (
        f"{nv['subset']} run, extrapolated by final reason" if nv["extrapolated"] else "all"
    )
    rows = [
        ("device", f"{s['device']} {s['device_name'] or ''}, torch {s['torch_version']}"),
        (
            "host cores / pool workers / sandbox",
            f"{s['host_cores']} / {s['workers']} / {s['sandbox']}",
        ),
        ("candidates", f"{c['total']} ({mix}); kept {c['kept']}"),
        ("compile cache", s["compile_cache"]),
        ("modules each worker imported before its candidates", s.get("preimported", 0)),
        ("GPU lock: timed sections batched", s["batch_timers"]),
        ("candidates per process", s.get("candidates_per_process", 1)),
        ("sizing: device-memory cap (GiB; 0 = none)", s["sizing_max_device_gib"]),
        (
            "candidate processes: prestarted / fresh / replaced / refused / unresponsive / reused",
            " / ".join(str(v) for v in p["children"].values())
            + ("" if s["prestart_child"] else " (prestart off)"),
        ),
        (
            "processes retired instead of reused, by first finding",
            "; ".join(f"{k}: {v}" for k, v in p.get("retired_by_audit", {}).items()) or "none",
        ),
        (
            "audit baselines: candidates' wait s",
            f"{p.get('audit_prepare_s')}",
        ),
        (
            "re-run for memory (sizing + filters): tasks; seconds, of them in the filters",
            f"{p['retried_alone']}; {p['retried_alone_s']}, {p['filter_retry_s']}",
        ),
        ("pool: candidates/minute (filters)", f"**{p['per_minute']}** ({p['filter_s']} s)"),
        (
            "pool: incl. start and sizing",
            f"{p['per_minute_with_start_and_sizing']}/min "
            f"(start {p['start_s']} s, sizing {p['size_s']} s)",
        ),
        (
            "naive: candidates/minute",
            f"{nv['per_minute']} ({nv['mean_s_per_candidate']} s each; {naive_note})",
        ),
        ("speedup pool / naive", f"**{s['speedup_vs_naive']}x**"),
        ("naive verdicts equal pool's", f"{nv['same_final_reason_as_pool']} / {nv['subset']}"),
        (
            "peak worker RSS: total / one process",
            f"{p['peak_rss_total_gb']} / {p['peak_rss_process_gb']} GiB",
        ),
        (
            f"eager-median spread, concurrent vs alone ({noise['tasks']} tasks)",
            f"**{_pct(noise['spread_concurrent_vs_alone'])}**",
        ),
        ("eager-median spread, alone vs alone", _pct(noise["spread_alone_vs_alone"])),
    ]
    for stage, t in p["stage_times"].items():
        rows.append(
            (
                f"stage {stage}: rows, total s, median s, GPU-lock wait s, GPU exclusive s",
                f"{t['rows']}, {t['total_s']}, {t['median_s']}, {t['lock_wait_s']}, "
                f"{t['exclusive_s']}",
            )
        )
    init = p["device_init"]
    if init and s["device"] == "cuda":
        rows.append(
            (
                "CUDA contexts: created; creation median s; candidates' wait median, total s",
                f"{init.get('contexts_created')}; {init['creation_median_s']}; "
                f"{init['wait_median_s']}, {init['wait_total_s']}",
            )
        )
    for gpu, use in (p["gpu_usage"] or {}).items():
        rows.append(
            (
                f"GPU {gpu} while filtering: utilisation mean / median; memory peak; "
                "share of samples > 90% full",
                f"{use['utilization_mean_pct']}% / {use['utilization_median_pct']}%; "
                f"{use['memory_peak_gib']} of {use['memory_total_gib']} GiB; "
                f"{use['memory_nearly_full_share'] * 100:.0f}%",
            )
        )
    host = p["cpu_usage"]
    if host:
        rows.append(
            (
                "host CPU while filtering: busy mean / median; share of samples > 90% busy",
                f"{host['busy_mean_pct']}% / {host['busy_median_pct']}%; "
                f"{host['saturated_share'] * 100:.0f}%",
            )
        )
    rows.append(("final reasons", ", ".join(f"{k} {v}" for k, v in p["final_reasons"].items())))
    lines = ["| measure | value |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f}%"


# ------------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernelbench", type=Path, help="KernelBench jsonl (level 2 is used)")
    parser.add_argument("--kb-limit", type=int, default=0, help="first N level-2 problems; 0 = all")
    parser.add_argument("--ops6k", type=Path, help="Ops-6K parquet")
    parser.add_argument("--ops6k-n", type=int, default=50, help="seeded Ops-6K sample")
    parser.add_argument(
        "--tasks",
        type=Path,
        help="an earlier run's candidates.parquet, filtered as it is (no composing or sizing)",
    )
    parser.add_argument("--composed", type=int, default=150, help="offline-composed candidates")
    parser.add_argument(
        "--catalogue",
        type=Path,
        help="a seed catalogue (`opsynth seeds extract --out DIR`) to compose from; default: "
        "the default libraries' catalogue, through the user cache",
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument("--workers", type=int, default=0, help="0 = derived from the host")
    parser.add_argument("--naive", type=int, default=20, help="candidates run the naive way")
    parser.add_argument("--naive-budget-s", type=float, default=120.0, help="naive stops after")
    parser.add_argument("--noise", type=int, default=16, help="tasks of the noise measurement")
    parser.add_argument(
        "--warm-cache", action="store_true", help="reuse the host's trusted compile-cache layer"
    )
    parser.add_argument(
        "--max-device-gib",
        type=float,
        default=SizingConfig().max_device_gib,
        help="cap on a sized candidate's device memory (sizing.max_device_gib); 0 = none",
    )
    parser.add_argument(
        "--no-prestart",
        dest="prestart",
        action="store_false",
        help="fork each candidate's process only when it starts (filters.prestart_child off)",
    )
    parser.add_argument(
        "--no-batch-timers",
        dest="batch_timers",
        action="store_false",
        help="timed sections and untimed GPU work alternate (filters.batch_timers off)",
    )
    parser.add_argument(
        "--candidates-per-process",
        type=int,
        default=None,
        help="candidates one process may run in turn (default: the config's "
        "filters.candidates_per_process_cuda or _cpu, by device)",
    )
    parser.add_argument(
        "--size-only",
        action="store_true",
        help="write the sized candidate set (candidates.parquet) and stop: no filtering, "
        "noise or naive runs",
    )
    parser.add_argument(
        "--compare-judge",
        action="store_true",
        help="after the run, filter the same sized set again on a fresh pool with "
        "filters.judge off (the candidate's own rows decide), and report both rates and "
        "every task whose final verdict differs",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("throughput"))
    return parser.parse_args(argv)


def per_process_setting(value: int | None, device: str) -> dict[str, int]:
    """The config field ``--candidates-per-process`` sets on ``device``; none if not given."""
    if value is None:
        return {}
    return {f"candidates_per_process_{'cuda' if device == 'cuda' else 'cpu'}": value}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    begin = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    device = resolve_device(args.device)
    cache = "" if args.warm_cache else tempfile.mkdtemp(prefix="compile-cache-", dir=args.out)
    cfg = FiltersConfig(
        workers=args.workers,
        cache_dir=cache,
        prestart_child=args.prestart,
        batch_timers=args.batch_timers,
        **per_process_setting(args.candidates_per_process, device),
    )
    fixed, composed, counts = candidate_set(args)
    log(f"{len(fixed)} fixed + {len(composed)} composed candidates on {device}")
    sizing = SizingConfig(max_device_gib=args.max_device_gib)
    if args.size_only:  # the set multi_gpu.py takes, without spending device time filtering it
        with WorkerPool(cfg, device) as pool:
            resized = size(pool, composed, cfg, device, sizing) if composed else []
        sized = fixed + resized if args.tasks else filtering_order(fixed + resized, args.seed)
        write_tasks(sized, args.out / "candidates.parquet")
        log(f"{len(sized)} sized candidates written to {args.out / 'candidates.parquet'}")
        return {"counts": counts, "candidates": len(sized)}
    pool = pool_run(fixed, composed, cfg, device, args.seed, sizing, shuffle=not args.tasks)
    log(f"pool: {len(pool['tasks'])} candidates in {pool['filter_s']:.0f} s")
    # written now: a time limit hit in the noise or naive part does not lose the pool's run
    write_verdicts(pool["verdicts"], args.out / "pool-verdicts.parquet")
    write_tasks(pool["tasks"], args.out / "candidates.parquet")  # sized: multi_gpu.py reuses it
    measured = eager_medians(pool["by_task"])
    preferred = [t for t in fixed if t.id in measured] + [
        t for t in pool["tasks"] if t.id in measured
    ]
    noise_tasks = list({t.id: t for t in preferred}.values())[: args.noise]
    alone = alone_medians(noise_tasks, cfg, device) if noise_tasks else []
    judge_off = None
    if args.compare_judge:
        fresh = cfg.cache_dir and tempfile.mkdtemp(prefix="compile-cache-", dir=args.out)
        off_cfg = cfg.model_copy(update={"judge": False, "cache_dir": fresh or cfg.cache_dir})
        log("the same set again with filters.judge off")
        judge_off = pool_run(pool["tasks"], [], off_cfg, device, args.seed, sizing, shuffle=False)
    subset = naive_subset(pool["tasks"], final_reasons(pool["verdicts"]), args.naive, args.seed)
    log(f"noise: {len(noise_tasks)} tasks timed alone; naive harness next")
    naive = naive_run(subset, cfg, device, args.naive_budget_s)
    summary = summarise(args, counts, cfg, device, pool, naive, alone)
    if judge_off is not None:
        summary["judge_comparison"] = judge_comparison(pool, judge_off)
    summary["benchmark_wall_s"] = round(time.perf_counter() - begin, 1)
    (args.out / "throughput.json").write_text(json.dumps(summary, indent=2))
    print(table(summary))
    if judge_off is not None:
        print(judge_table(summary["judge_comparison"]))
    print(f"\nwall {summary['benchmark_wall_s']:.0f} s; details in {args.out / 'throughput.json'}")
    return summary


if __name__ == "__main__":
    main()
