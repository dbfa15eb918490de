"""Coarse Prefect tasks shared by the ``regenerate`` and ``audit`` flows.

Each task's output is a content-addressed file under ``<run>/work/``: a task whose file exists
returns it instead of recomputing, which is what makes a killed run resume to the same
dataset. Import this module only after ``flows.prefect_env.configure_prefect``.
"""

from __future__ import annotations

import contextlib
import platform
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import task
from prefect.cache_policies import NO_CACHE

import opsynth
from opsynth.config import FiltersConfig, RunConfig
from opsynth.deadline import JobLatency
from opsynth.funnel import funnel_rows
from opsynth.record import Task, Verdict, utc_now
from opsynth.stage import apply_filters
from opsynth.store import (
    COMPLETE,
    SHORT,
    RunDir,
    digest,
    read_tasks,
    read_verdicts,
    write_tasks,
    write_verdicts,
)
from opsynth.verdicts import group_by_task, outcome, passed_all

if TYPE_CHECKING:
    from opsynth.filters.pool import Ticket

Progress = Callable[[str, int, int], None]


def noop_progress(stage: str, done: int, total: int) -> None:
    return None


class WorkLedger:
    """Counts which stage outputs were reused and which were computed in this invocation, and
    the wall seconds each stage took in it (``timed``), for run.json's per-stage table."""

    def __init__(self) -> None:
        self.reused: dict[str, int] = {}
        self.computed: dict[str, int] = {}
        self.seconds: dict[str, float] = {}

    def note(self, stage: str, reused: bool) -> None:
        bucket = self.reused if reused else self.computed
        bucket[stage] = bucket.get(stage, 0) + 1

    @contextlib.contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - start
            self.seconds[stage] = round(self.seconds.get(stage, 0.0) + spent, 3)


@task(name="seeds", cache_policy=NO_CACHE)
def seeds_stage(run: RunDir, cfg: RunConfig, ledger: WorkLedger) -> list[Task]:
    """The validated catalogue of ``seeds.libraries``, extracted once per config and library
    versions into the user cache and copied to ``<run>/catalogue/``; its seeds are what every
    composer draws from."""
    from opsynth.synth.catalog.report import ensure_catalogue

    reused = ensure_catalogue(run.root, cfg.seeds)
    ledger.note("seeds", reused)
    return read_tasks(run.path("catalogue") / "seeds.parquet")


@task(name="compose", cache_policy=NO_CACHE)
def compose_stage(
    run: RunDir,
    cfg: RunConfig,
    seeds: list[Task],
    round_index: int,
    n: int,
    ledger: WorkLedger,
    produced: list[list[str]] | None = None,
    mix: dict[str, float] | None = None,
):
    """Candidates and their compose verdicts from ``cfg.compose.composer``, avoiding the op
    sequences ``produced`` in earlier rounds, drawing sources from ``mix`` when given (a later
    round's sources still short of their quota) instead of ``compose.mix``. A result with
    unanswered requests is not stored, so a re-run asks again; the LLM reply cache
    (``compose.llm.cache_dir`` or ``<run>/llm-cache``) makes the answered ones free."""
    from opsynth.synth.compose import COMPOSER_VERSION
    from opsynth.synth.composers import ComposeResult, run_composer

    produced = sorted(list(ops) for ops in produced or [])
    compose = cfg.compose if mix is None else cfg.compose.model_copy(update={"mix": mix})
    # with the composer's version: a composer that now writes other tasks composes afresh
    key = digest(
        compose.work_dump(), [s.id for s in seeds], round_index, n, produced, COMPOSER_VERSION
    )
    path = run.work_path(f"compose-r{round_index}", key)
    verdicts_path = run.work_path(f"compose-verdicts-r{round_index}", key)
    if path.exists() and verdicts_path.exists():
        ledger.note("compose", True)
        return ComposeResult(read_tasks(path), read_verdicts(verdicts_path))
    result = run_composer(
        seeds,
        compose,
        n,
        round_index=round_index,
        config_hash=cfg.config_hash(),
        produced=produced,
        cache_dir=Path(cfg.compose.llm.cache_dir or run.path("llm-cache")),
    )
    if result.complete:
        write_verdicts(result.verdicts, verdicts_path)
        write_tasks(result.tasks, path)
    ledger.note("compose", False)
    return result


@task(name="prefilter", cache_policy=NO_CACHE)
def prefilter_stage(
    run: RunDir, cfg: RunConfig, tasks: list[Task], ledger: WorkLedger
) -> list[Verdict]:
    """Static checks and decontamination: pure, orchestrator-side, no candidate code runs."""
    modules = frozenset(cfg.filters.task_modules)
    key = digest(cfg.decontam.work_dump(), sorted(modules), sorted(t.id for t in tasks))
    path = run.work_path("prefilter", key)
    if path.exists():
        ledger.note("prefilter", True)
        return read_verdicts(path)
    result = apply_filters(tasks, prefilters(cfg))
    write_verdicts(result.verdicts, path)
    ledger.note("prefilter", False)
    return result.verdicts


def prefilters(cfg: RunConfig) -> list[Any]:
    """The pre-execution chain, cheapest first: static checks, then decontamination (its
    index loads here, once per chain)."""
    from opsynth.ast_dedup.decontam import Decontaminator
    from opsynth.filters.static_check import StaticCheck

    return [StaticCheck(frozenset(cfg.filters.task_modules)), Decontaminator(cfg.decontam)]


class LazyPool:
    """Starts the sandboxed worker pool only when a shard actually needs computing, so a
    fully cached re-run starts no worker at all."""

    def __init__(self, cfg: RunConfig, device: str) -> None:
        self.cfg, self.device, self.pool = cfg, device, None
        self.queued: dict[tuple[str, ...], Ticket] = {}
        # the task runner's pools (``runner.kind`` not local), by engine worker: their latest
        # stats, as the shards they ran brought them back
        self.engines: dict[str, dict[str, Any]] = {}
        # the next pipelined chunk's first jobs, started early (``flows.size_screen.Prefetch``)
        self.prefetch: Any = None
        # how long pipelined jobs take to come back, across chunks: when the last may start
        self.latency = JobLatency()

    def queue(self, shards: list[list[Task]], progress: Progress) -> None:
        """Queue these shards' candidates on the pool now: workers then go from one shard to
        the next instead of idling at each shard's end while its slowest candidate runs.
        Each shard's verdicts are still collected, and written, shard by shard."""
        counts = {"done": 0, "total": sum(len(shard) for shard in shards)}

        def one_more(done: int, total: int) -> None:
            counts["done"] += 1
            progress("filter", counts["done"], counts["total"])

        for shard in shards:
            self.queued[tuple(t.id for t in shard)] = self.get().submit(shard, one_more)

    def evaluate(self, shard: list[Task], progress: Progress) -> dict[str, list[Verdict]]:
        ticket = self.queued.pop(tuple(t.id for t in shard), None)
        if ticket is None:
            return self.get().evaluate(shard, progress=lambda d, t: progress("filter", d, t))
        return self.get().wait(ticket)

    def get(self):
        if self.pool is None:
            from opsynth.filters.pool import WorkerPool

            self.pool = WorkerPool(self.cfg.filters, self.device)
            self.pool.__enter__()
        return self.pool

    def start_seconds(self) -> float:
        """How long the in-process pool took to start; 0 while none has started."""
        return float(self.pool.stats.get("start_s") or 0.0) if self.pool is not None else 0.0

    def note_engine(self, stats: dict[str, Any]) -> None:
        """A remote shard's pool stats (``filters.process_pool.engine_stats``)."""
        if stats.get("engine"):
            self.engines[str(stats["engine"])] = stats

    def close(self) -> dict[str, Any]:
        """The run's pool stats: the in-process pool's, else the engine pools' summed
        (``engines`` holds each one's), so run.json names the device either way."""
        if self.pool is None:
            return engines_summary(list(self.engines.values()))
        stats = dict(self.pool.stats)
        self.pool.__exit__(None, None, None)
        self.pool = None
        return stats


# Engine pool stats that add up across pools; the rest are taken from the first pool.
SUMMED = ("candidates", "workers", "workers_started", "workers_replaced", "retried_alone")


def engines_summary(engines: list[dict[str, Any]]) -> dict[str, Any]:
    """One stats dict for a run's engine pools: counts summed, descriptions (device name,
    versions, sandbox) from the first, every pool's own under ``engines``; {} for none."""
    if not engines:
        return {}
    first = engines[0]
    keys = ("device", "device_name", "torch_version", "cuda_version", "sandbox", "compile_cache")
    summary: dict[str, Any] = {k: first[k] for k in keys if k in first}
    for key in SUMMED:
        summary[key] = sum(int(e.get(key) or 0) for e in engines)
    summary["engines"] = engines
    return summary


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
    path = shard_path(run, cfg, shard, device)
    if path.exists():
        ledger.note("filter-shard", True)
        progress("filter", len(shard), len(shard))
        return read_verdicts(path)
    results = pool.evaluate(shard, progress)
    verdicts = [v for t in shard for v in results[t.id]]
    write_verdicts(verdicts, path)
    ledger.note("filter-shard", False)
    return verdicts


def shard_path(run: RunDir, cfg: RunConfig, shard: list[Task], device: str) -> Path:
    """A shard's work file: the same key whichever runner computes it."""
    key = digest(cfg.filters.work_dump(), device, sorted(t.id for t in shard))
    return run.work_path("filter", key)


@task(name="filter-shard-remote", cache_policy=NO_CACHE)
def remote_filter_shard(
    filters: FiltersConfig, device: str, shard: list[Task]
) -> tuple[list[Verdict], dict[str, Any]]:
    """One shard on a task-runner worker (Dask), on that process's warm pool; its verdicts and
    the pool's stats."""
    from opsynth.filters import process_pool

    results = process_pool.evaluate(filters, device, shard)
    return [v for t in shard for v in results[t.id]], process_pool.engine_stats()


def scatter_shards(
    run: RunDir,
    cfg: RunConfig,
    shards: list[list[Task]],
    device: str,
    pool: LazyPool,
    ledger: WorkLedger,
    progress: Progress,
) -> list[Verdict]:
    """Every shard without a work file submitted to the flow's task runner at once. Only the
    orchestrator reads and writes work files, so resuming needs no filesystem shared with the
    engine's workers; verdicts come back in shard order whatever order shards finish in."""
    from prefect.futures import as_completed

    done: dict[int, list[Verdict]] = {}
    pending = {}
    for i, shard in enumerate(shards):
        path = shard_path(run, cfg, shard, device)
        if path.exists():
            ledger.note("filter-shard", True)
            done[i] = read_verdicts(path)
            continue
        future = remote_filter_shard.submit(cfg.filters, device, shard)
        pending[future.task_run_id] = (i, future)
    for future in as_completed([f for _, f in pending.values()]):
        i, _ = pending[future.task_run_id]
        done[i], engine = future.result()
        pool.note_engine(engine)
        write_verdicts(done[i], shard_path(run, cfg, shards[i], device))
        ledger.note("filter-shard", False)
        progress("filter", 0, len(shards[i]))
        progress("filter", len(shards[i]), len(shards[i]))
    return [v for i in range(len(shards)) for v in done[i]]


def probe_overrides(cfg: RunConfig) -> dict[str, Any]:
    """A sizing probe's check settings, with ``[sizing]``'s run counts."""
    from opsynth.filters.pool import measure_overrides

    sizing = cfg.sizing
    return measure_overrides(
        sizing.probe_warmup_runs, sizing.probe_timed_runs, sizing.probe_exclusive
    )


@task(name="size", cache_policy=NO_CACHE)
def size_stage(
    run: RunDir,
    cfg: RunConfig,
    tasks: list[Task],
    device: str,
    pool: LazyPool,
    ledger: WorkLedger,
    progress: Progress,
) -> list[Task]:
    """Each task rescaled toward the runtime window's log-middle by measuring it in the
    sandboxed workers (``filters.sizing``): the in-process pool's (``runner.kind`` local), else
    the task runner's; same order, one task per input task."""
    from opsynth.filters.sizing import probe_of, size_tasks

    parts = (cfg.sizing, cfg.filters)
    key = digest(*[p.work_dump() for p in parts], device, [t.id for t in tasks])
    path = run.work_path("size", key)
    if path.exists():
        ledger.note("size", True)
        return read_tasks(path)
    done = 0

    def measure(batch: list[Task]) -> dict[str, Any]:
        nonlocal done
        if cfg.runner.kind != "local":
            rows = scatter_probes(cfg, batch, device, pool)
        else:
            rows = pool.get().measure(batch, probe_overrides(cfg))
        done += len(batch)
        progress("size", done, done)
        return {task_id: probe_of(found) for task_id, found in rows.items()}

    window = cfg.filters.window_ms(device)
    sized = size_tasks(tasks, measure, window, cfg.sizing)
    write_tasks(sized, path)
    ledger.note("size", False)
    return sized


@task(name="size-probes-remote", cache_policy=NO_CACHE)
def remote_probe_shard(
    filters: FiltersConfig, device: str, shard: list[Task], overrides: dict[str, Any]
) -> tuple[list[Verdict], dict[str, Any]]:
    """One shard of a sizing round's probes on a task-runner worker, on its warm pool; its
    rows and the pool's stats."""
    from opsynth.filters import process_pool

    results = process_pool.measure(filters, device, shard, overrides)
    return [v for t in shard for v in results[t.id]], process_pool.engine_stats()


def scatter_probes(
    cfg: RunConfig, batch: list[Task], device: str, pool: LazyPool
) -> dict[str, list[Verdict]]:
    """A sizing round's probes in shards, all submitted to the flow's task runner at once: on
    a cluster the GPUs that filter size as well, so the orchestrator needs no GPU, and rounds
    of thousands of probes spread over every GPU (sizing a candidate takes two or three
    probes, each a fresh process on a GPU). Per task id, in the batch's order."""
    size = cfg.filters.shard_size
    shards = [batch[start : start + size] for start in range(0, len(batch), size)]
    overrides = probe_overrides(cfg)
    futures = [remote_probe_shard.submit(cfg.filters, device, shard, overrides) for shard in shards]
    rows: list[Verdict] = []
    for future in futures:
        shard_rows, engine = future.result()
        rows += shard_rows
        pool.note_engine(engine)
    found = group_by_task(rows)
    return {t.id: found.get(t.id, []) for t in batch}


def screen(
    run: RunDir,
    cfg: RunConfig,
    tasks: list[Task],
    device: str,
    pool: LazyPool,
    ledger: WorkLedger,
    progress: Progress,
) -> list[Verdict]:
    """Every candidate through static checks, decontamination, the checks on its sizing
    record when this run sized it (``filters.sized_too_fast``) and the sandboxed filters:
    shards one after another on the in-process pool (``runner.kind`` local), else all at once
    on the flow's task runner."""
    from opsynth.filters.sized_too_fast import sized_checks

    verdicts = prefilter_stage(run, cfg, tasks, ledger)
    by_task = group_by_task(verdicts)
    survivors = [t for t in tasks if passed_all(t.id, by_task)]
    if cfg.sizing.enabled:
        window = cfg.filters.window_ms(device)
        checked = apply_filters(survivors, sized_checks(cfg.sizing.too_fast_share, window))
        verdicts, survivors = verdicts + checked.verdicts, checked.kept
    size = cfg.filters.shard_size
    shards = [survivors[start : start + size] for start in range(0, len(survivors), size)]
    if cfg.runner.kind != "local":
        return verdicts + scatter_shards(run, cfg, shards, device, pool, ledger, progress)
    pool.queue([s for s in shards if not shard_path(run, cfg, s, device).exists()], progress)
    for shard in shards:
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
    """Write the final parquet files (``opsynth.verdicts.outcome`` decides their rows).
    Returns the manifest fields describing the outcome."""
    result = outcome(candidates, verdicts, accepted, cap)
    write_tasks(seeds, run.path("seeds.parquet"))
    write_tasks(candidates, run.path("candidates.parquet"))
    write_verdicts(result.verdicts, run.path("verdicts.parquet"))
    write_tasks(result.exported, run.path("accepted.parquet"))
    write_tasks(result.rejected, run.path("rejected.parquet"))
    return {
        "status": COMPLETE if result.complete else SHORT,
        "finished_at": utc_now(),
        "counts": {
            "seeds": len(seeds),
            "candidates": len(candidates),
            "accepted": len(result.exported),
            "rejected": len(result.rejected),
        },
        "funnel": funnel_rows(result.verdicts),
    }


@task(name="publish", cache_policy=NO_CACHE)
def publish_stage(run: RunDir, cfg: RunConfig) -> dict[str, Any]:
    """Push the finished run to ``cfg.publish.repo_id`` as ``cfg.publish.version``
    (``opsynth.publish``). A failure is recorded in run.json, not raised: the dataset on disk
    is complete, and ``opsynth publish RUN`` retries the push from the kept export."""
    from opsynth.publish import PublishError, publish_run

    wanted = {"repo_id": cfg.publish.repo_id, "version": cfg.publish.version}
    try:
        pushed = publish_run(run.root).pushed
    except PublishError as exc:
        return {**wanted, "error": str(exc)}
    return {**wanted, "tag": pushed.tag, "commit": pushed.commit, "changed": pushed.changed}


def versions() -> dict[str, str]:
    import torch

    return {
        "opsynth": opsynth.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
    }
