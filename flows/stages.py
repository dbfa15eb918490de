"""Coarse Prefect tasks shared by the ``regenerate`` and ``audit`` flows.

Each task's output is a content-addressed file under ``<run>/work/``: a task whose file exists
returns it instead of recomputing, which is what makes a killed run resume to the same
dataset. Import this module only after ``flows.prefect_env.configure_prefect``.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

import opsynth
from opsynth.config import RunConfig
from opsynth.funnel import funnel_rows
from opsynth.record import Task, Verdict, utc_now
from opsynth.stage import apply_filters
from opsynth.store import (
    RunDir,
    digest,
    read_tasks,
    read_verdicts,
    write_tasks,
    write_verdicts,
)

Progress = Callable[[str, int, int], None]


def noop_progress(stage: str, done: int, total: int) -> None:
    return None


class WorkLedger:
    """Counts which stage outputs were reused and which were computed in this invocation."""

    def __init__(self) -> None:
        self.reused: dict[str, int] = {}
        self.computed: dict[str, int] = {}

    def note(self, stage: str, reused: bool) -> None:
        bucket = self.reused if reused else self.computed
        bucket[stage] = bucket.get(stage, 0) + 1


@task(name="seeds", cache_policy=NO_CACHE)
def seeds_stage(run: RunDir, cfg: RunConfig, ledger: WorkLedger) -> list[Task]:
    from synth import __version__ as synth_version
    from synth.seeds import get_library, seed_tasks

    path = run.work_path("seeds", digest(cfg.seeds.model_dump(mode="json"), synth_version))
    if path.exists():
        ledger.note("seeds", True)
        return read_tasks(path)
    specs = [spec for name in cfg.seeds.libraries for spec in get_library(name).specs()]
    seeds = seed_tasks(specs)
    write_tasks(seeds, path)
    ledger.note("seeds", False)
    return seeds


@task(name="compose", cache_policy=NO_CACHE)
def compose_stage(
    run: RunDir, cfg: RunConfig, seeds: list[Task], round_index: int, n: int, ledger: WorkLedger
) -> list[Task]:
    from synth.compose import compose

    key = digest(cfg.compose.model_dump(mode="json"), [s.id for s in seeds], round_index, n)
    path = run.work_path(f"compose-r{round_index}", key)
    if path.exists():
        ledger.note("compose", True)
        return read_tasks(path)
    tasks = compose(seeds, cfg.compose, n=n, round_index=round_index, config_hash=cfg.config_hash())
    write_tasks(tasks, path)
    ledger.note("compose", False)
    return tasks


@task(name="prefilter", cache_policy=NO_CACHE)
def prefilter_stage(
    run: RunDir, cfg: RunConfig, tasks: list[Task], ledger: WorkLedger
) -> list[Verdict]:
    """Static checks and decontamination: pure, orchestrator-side, no candidate code runs."""
    from ast_dedup.decontam import Decontaminator
    from filters.static_check import StaticCheck

    key = digest(cfg.decontam.model_dump(mode="json"), sorted(t.id for t in tasks))
    path = run.work_path("prefilter", key)
    if path.exists():
        ledger.note("prefilter", True)
        return read_verdicts(path)
    result = apply_filters(tasks, [StaticCheck(), Decontaminator(cfg.decontam)])
    write_verdicts(result.verdicts, path)
    ledger.note("prefilter", False)
    return result.verdicts


class LazyPool:
    """Starts the sandboxed worker pool only when a shard actually needs computing, so a
    fully cached re-run starts no worker at all."""

    def __init__(self, cfg: RunConfig, device: str) -> None:
        self.cfg, self.device, self.pool = cfg, device, None

    def get(self):
        if self.pool is None:
            from filters.pool import WorkerPool

            self.pool = WorkerPool(self.cfg.filters, self.device)
            self.pool.__enter__()
        return self.pool

    def close(self) -> dict[str, Any]:
        if self.pool is None:
            return {}
        stats = dict(self.pool.stats)
        self.pool.__exit__(None, None, None)
        self.pool = None
        return stats


@task(name="filter-shard", cache_policy=NO_CACHE)
def filter_shard_stage(
    run: RunDir,
    cfg: RunConfig,
    shard: list[Task],
    device: str,
    pool: LazyPool,
    ledger: WorkLedger,
    progress: Progress,
) -> list[Verdict]:
    key = digest(cfg.filters.model_dump(mode="json"), device, sorted(t.id for t in shard))
    path = run.work_path("filter", key)
    if path.exists():
        ledger.note("filter-shard", True)
        progress("filter", len(shard), len(shard))
        return read_verdicts(path)
    results = pool.get().evaluate(shard, progress=lambda d, t: progress("filter", d, t))
    verdicts = [v for t in shard for v in results[t.id]]
    write_verdicts(verdicts, path)
    ledger.note("filter-shard", False)
    return verdicts


def passed_all(task_id: str, verdicts_by_task: dict[str, list[Verdict]]) -> bool:
    found = verdicts_by_task.get(task_id, [])
    return bool(found) and all(v.passed for v in found)


def group_by_task(verdicts: list[Verdict]) -> dict[str, list[Verdict]]:
    grouped: dict[str, list[Verdict]] = {}
    for v in verdicts:
        grouped.setdefault(v.task_id, []).append(v)
    return grouped


def annotate(task: Task, verdicts: list[Verdict]) -> Task:
    """Copy the key measurements onto the accepted row so a dataset user needn't join."""
    summary: dict[str, Any] = {}
    for v in verdicts:
        if v.stage in ("runtime", "compile", "decontam", "dedup"):
            summary[v.stage] = v.measures
        if v.device:
            summary["device"] = v.device
        if v.torch_version:
            summary["torch_version"] = v.torch_version
    task.meta = {**task.meta, "filters": summary}
    return task


def screen(
    run: RunDir,
    cfg: RunConfig,
    tasks: list[Task],
    device: str,
    pool: LazyPool,
    ledger: WorkLedger,
    progress: Progress,
) -> list[Verdict]:
    """Every candidate through static checks, decontamination and the sandboxed filters."""
    verdicts = prefilter_stage(run, cfg, tasks, ledger)
    by_task = group_by_task(verdicts)
    survivors = [t for t in tasks if passed_all(t.id, by_task)]
    size = cfg.filters.shard_size
    for start in range(0, len(survivors), size):
        shard = survivors[start : start + size]
        verdicts = verdicts + filter_shard_stage(run, cfg, shard, device, pool, ledger, progress)
    return verdicts


def export(
    run: RunDir,
    cfg: RunConfig,
    seeds: list[Task],
    candidates: list[Task],
    verdicts: list[Verdict],
    accepted: list[Task],
    cap: int | None,
) -> dict[str, Any]:
    """Write the final parquet files; tasks past ``cap`` get an ``over_target`` verdict so
    even they are accounted for. Returns the manifest fields describing the outcome."""
    export_verdicts = [
        Verdict(t.id, "export", False, "over_target", f"target {cap} already met")
        for t in (accepted[cap:] if cap is not None else [])
    ]
    all_verdicts = verdicts + export_verdicts
    by_task = group_by_task(all_verdicts)
    exported = [annotate(t, by_task[t.id]) for t in accepted[:cap]]
    exported_ids = {t.id for t in exported}
    rejected = [t for t in candidates if t.id not in exported_ids]

    write_tasks(seeds, run.path("seeds.parquet"))
    write_tasks(candidates, run.path("candidates.parquet"))
    write_verdicts(all_verdicts, run.path("verdicts.parquet"))
    write_tasks(exported, run.path("accepted.parquet"))
    write_tasks(rejected, run.path("rejected.parquet"))
    complete = cap is None or len(exported) >= cap
    return {
        "status": "complete" if complete else "short",
        "finished_at": utc_now(),
        "counts": {
            "seeds": len(seeds),
            "candidates": len(candidates),
            "accepted": len(exported),
            "rejected": len(rejected),
        },
        "funnel": funnel_rows(all_verdicts),
    }


def versions() -> dict[str, str]:
    import torch

    return {
        "opsynth": opsynth.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
    }
