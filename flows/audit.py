"""The ``audit`` Prefect flow: any existing Ops-6K-shaped task set through the same stages as
``regenerate`` (static, decontam, sandboxed filters, dedup), each task checked as given (no
sizing), resumable the same way: ``cfg.chunk_size`` tasks at a time, each chunk's work written
when it is done, the jobs a stopped or killed chunk settled kept in its journal
(``flows.size_screen``), and with ``stop_at`` no task started that would not end by then."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import flow

from opsynth.config import RunConfig
from opsynth.deadline import ChunkClock
from opsynth.flows.regenerate import invocation
from opsynth.flows.size_screen import ChunkStopped, finished, journaled, size_and_screen
from opsynth.flows.stages import (
    LazyPool,
    Progress,
    WorkLedger,
    export,
    noop_progress,
    screen,
    versions,
)
from opsynth.rechecked import carried_verdicts
from opsynth.record import Task, Verdict, utc_now
from opsynth.store import RUNNING, STOPPED, RunDir, digest, read_tasks
from opsynth.verdicts import group_by_task, passed_all


@flow(name="audit", log_prints=False)
def audit(
    out: str,
    cfg: RunConfig,
    tasks_file: str,
    device: str,
    source: str,
    progress: Progress | None = None,
    stop_at: float | None = None,
    reuse: str | None = None,
) -> dict[str, Any]:
    """Audit the tasks in ``tasks_file`` (parquet). A path, not the rows, is the parameter:
    Prefect sends a flow's parameters with every task it submits to Dask, and a full
    Ops-6K is ~10 MB of code per shard. Stopped by ``stop_at`` (seconds since the epoch), it
    exports the chunks it finished with status ``stopped``; a re-run resumes. ``reuse``: an
    earlier audit with the same config and device whose verdicts on the tasks it checked are
    taken as they are (``opsynth.rechecked.carried_verdicts``); dedup covers every task."""
    from opsynth.ast_dedup.dedup import dedup

    run = RunDir.create(Path(out))
    tasks = read_tasks(Path(tasks_file))
    ledger = WorkLedger()
    progress = progress or noop_progress
    checks = as_given(cfg)
    pool = LazyPool(checks, device)
    # the same task can occur twice in a set (Ops-6K has exact duplicate rows): screen once
    unique = list({t.id: t for t in tasks}.values())
    input_digest = digest([t.id for t in unique])
    carried_ids, carried = set(), []
    if reuse is not None:
        from opsynth.rundata import load_run  # polars: only to read an earlier audit

        prior = load_run(Path(reuse), partial=True)
        ids = [t.id for t in unique]
        carried_ids, carried = carried_verdicts(prior, ids, cfg.config_hash(), device)
    manifest = run.read_manifest()
    same_audit = (input_digest, cfg.config_hash(), reuse)
    made = (manifest.get("input_digest"), manifest.get("config_hash"), manifest.get("reused_from"))
    if made != same_audit:
        manifest = {}  # another audit was here: its invocation lines do not describe this one
    manifest.update(
        {
            "kind": "audit",
            "source": source,
            "input_digest": input_digest,
            "input_rows": len(tasks),
            "status": RUNNING,
            "config": cfg.model_dump(mode="json"),
            "config_hash": cfg.config_hash(),
            "device": device,
            "started_at": utc_now(),
            "versions": versions(),
            "reused_from": reuse,
            "reused_rows": len(carried_ids),
        }
    )
    run.write_manifest(manifest)
    clock = ChunkClock(stop_at)
    screened: list[Task] = [t for t in unique if t.id in carried_ids]
    verdicts: list[Verdict] = list(carried)
    fresh = [t for t in unique if t.id not in carried_ids]
    try:
        for start in range(0, len(fresh), cfg.chunk_size):
            chunk = fresh[start : start + cfg.chunk_size]
            ahead = fresh[start + cfg.chunk_size : start + 2 * cfg.chunk_size]
            began, pool_start = time.time(), pool.start_seconds()
            computed = sum(ledger.computed.values())
            try:
                rows = audit_chunk(run, checks, chunk, device, pool, ledger, progress, clock, ahead)
            except ChunkStopped as stopped:  # its finished jobs are journaled
                clock.left = stopped.left
                clock.stopped = True
                break
            if rows is None:
                break
            spent = time.time() - began - (pool.start_seconds() - pool_start)
            clock.record(spent, computed=sum(ledger.computed.values()) > computed)
            screened += chunk
            verdicts += rows
    finally:
        pool_stats = pool.close()
    by_task = group_by_task(verdicts)
    place = {t.id: i for i, t in enumerate(unique)}
    screened.sort(key=lambda t: place[t.id])  # dedup keeps the first of near duplicates
    passed = [t for t in screened if passed_all(t.id, by_task)]
    deduped = dedup(passed, cfg.dedup)
    manifest.update(export(run, cfg, [], screened, verdicts + deduped.verdicts, deduped.kept, None))
    if len(screened) < len(unique):
        manifest["status"] = STOPPED
    manifest.update(
        {
            "unique_rows": len(unique),
            "work": {"reused": ledger.reused, "computed": ledger.computed},
            "journaled_jobs": len(journaled(run)),
            "stage_seconds": {**ledger.seconds, "pool_start": pool_stats.get("start_s")},
            "filters_runtime": pool_stats,
        }
    )
    manifest["invocations"] = [*manifest.get("invocations", []), invocation(manifest, clock)]
    run.write_manifest(manifest)
    return manifest


def as_given(cfg: RunConfig) -> RunConfig:
    """The audit's settings: the config's own, with sizing off, so that every task is checked
    at the size it was published with rather than re-sized."""
    return cfg.with_section("sizing", enabled=False)


def audit_chunk(
    run: RunDir,
    cfg: RunConfig,
    chunk: list[Task],
    device: str,
    pool: LazyPool,
    ledger: WorkLedger,
    progress: Progress,
    clock: ChunkClock,
    ahead: list[Task],
) -> list[Verdict] | None:
    """One chunk's verdicts, or None when the time limit leaves no room to start it. On the
    in-process pool its tasks go through the pipeline that journals each settled job and
    starts none past the limit; on another runner its shards are scattered and the chunk
    starts only if the longest chunk so far would end in time. A chunk on disk is only read."""
    local = cfg.runner.kind == "local"
    in_time = clock.allows_next(time.time(), stops_mid_chunk=local)
    if local:
        if not (in_time or finished(run, cfg, chunk, device, set())):
            return None
        with ledger.timed("filter"):
            _, rows = size_and_screen(
                run, cfg, chunk, device, pool, ledger, progress, set(), clock.stop_at, ahead
            )
        return rows
    if not in_time:
        return None
    with ledger.timed("filter"):
        return screen(run, cfg, chunk, device, pool, ledger, progress)
