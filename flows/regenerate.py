"""The ``regenerate`` Prefect flow: seeds -> compose -> static -> decontam -> execution
filters -> dedup -> export, in rounds until the target is met, then publish when
``publish.repo_id`` is set.

Prefect tasks are coarse (a stage, or a shard of candidates), never one per candidate; see
``flows.stages``. Import this module only after ``flows.prefect_env.configure_prefect``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from prefect import flow

from opsynth.config import RunConfig
from opsynth.deadline import ChunkClock
from opsynth.flows.size_screen import STAGE as SIZE_FILTER
from opsynth.flows.size_screen import ChunkStopped, finished, journaled, size_and_screen
from opsynth.flows.stages import (
    LazyPool,
    Progress,
    WorkLedger,
    compose_stage,
    export,
    noop_progress,
    publish_stage,
    screen,
    seeds_stage,
    size_stage,
    versions,
)
from opsynth.quota import apportion, by_source, filled, in_quota_order, round_plan, shortfall
from opsynth.rechecked import read_rechecked
from opsynth.record import Task, Verdict, utc_now
from opsynth.store import COMPLETE, RUNNING, STOPPED, RunDir
from opsynth.synth.composers import summary as compose_summary
from opsynth.synth.sampling import TRANSFORMERS, effective_mix, split_seeds
from opsynth.verdicts import adopt_sized, group_by_task, passed_all


@flow(name="regenerate", log_prints=False)
def regenerate(
    out: str,
    cfg: RunConfig,
    device: str,
    progress: Progress | None = None,
    stop_at: float | None = None,
) -> dict[str, Any]:
    """Produce ``cfg.target`` accepted tasks in ``out``; resumable at any point.

    A round's candidates are sized and filtered ``cfg.chunk_size`` at a time, each chunk's
    work written when it is done, so a run stopped anywhere resumes from its last finished
    chunk rather than from the start of the round's sizing, and a round stops composing work
    for the filters once the target is met (the rest of its candidates are left unscreened).
    With ``stop_at`` (seconds since the epoch) no candidate starts that would not end by it
    (on the other paths no chunk, ``opsynth.deadline``): the run writes what it has with
    status ``stopped``, a chunk it left keeping its finished jobs in its journal
    (``flows.size_screen.Journal``), as a run killed mid-chunk does."""
    from opsynth.ast_dedup.dedup import KeyCache, dedup

    run = RunDir.create(Path(out))
    ledger = WorkLedger()
    progress = progress or noop_progress
    started = utc_now()
    pool = LazyPool(cfg, device)
    manifest = run.read_manifest()
    manifest.update(
        {
            "status": RUNNING,
            "config": cfg.model_dump(mode="json"),
            "config_hash": cfg.config_hash(),
            "device": device,
            "started_at": started,
            "versions": versions(),
        }
    )
    run.write_manifest(manifest)

    progress("seeds", 0, 1)
    with ledger.timed("seeds"):
        seeds = seeds_stage(run, cfg, ledger)
    progress("seeds", 1, 1)
    candidates: list[Task] = []
    verdicts: list[Verdict] = []
    seen: set[str] = set()
    accepted: list[Task] = []
    dedup_verdicts: list[Verdict] = []
    dedup_cache = KeyCache()  # each chunk dedups all accepted so far: parse each task once
    pool_stats: dict[str, Any] = {}
    screened: set[str] = set()  # candidates that went through the filters (by final id)
    unscreened: set[str] = set()
    clock = ChunkClock(stop_at)
    quota = apportion(cfg.target, source_mix(cfg, seeds))
    try:
        for round_index in range(cfg.max_rounds):
            need = cfg.target - filled(accepted, quota)
            if need <= 0 or clock.stopped:
                break
            # the first round draws the configured mix, later ones the sources still short
            mix, wanted = None, math.ceil(need * cfg.compose.oversample)
            if round_index > 0:
                done = [t for t in candidates if t.id in screened]
                plan = round_plan(
                    shortfall(accepted, quota),
                    done,
                    accepted,
                    cfg.compose.oversample,
                    unused_standalone(seeds, candidates),
                )
                if not plan:
                    break
                mix = {source: float(n) for source, n in plan.items()}
                wanted = sum(plan.values())
            produced = [t.ops for t in candidates]
            progress(f"compose round {round_index}", 0, wanted)
            with ledger.timed("compose"):
                drawn = compose_stage(
                    run, cfg, seeds, round_index, wanted, ledger, produced, mix=mix
                )
            progress(f"compose round {round_index}", wanted, wanted)
            fresh = {t.id for t in drawn.tasks} - seen
            seen |= fresh
            candidates += [t for t in drawn.tasks if t.id in fresh]
            verdicts += [v for v in drawn.verdicts if v.task_id in fresh]
            composed = [t for t in drawn.kept() if t.id in fresh]
            for start in range(0, len(composed), cfg.chunk_size):
                chunk = composed[start : start + cfg.chunk_size]
                met = filled(accepted, quota) >= cfg.target
                in_time = clock.allows_next(time.time(), stops_mid_chunk=pipelined(cfg))
                # a chunk already on disk is only read: the time limit never skips it
                if met or not (
                    in_time
                    or pipelined(cfg)
                    and finished(run, cfg, chunk, device, {t.id for t in candidates})
                ):
                    unscreened |= {t.id for t in composed[start:]}
                    break
                began, computed = time.time(), sum(ledger.computed.values())
                pool_start = pool.start_seconds()
                # the next chunk's first jobs may start on workers this chunk's tail leaves idle
                ahead = composed[start + cfg.chunk_size : start + 2 * cfg.chunk_size]
                try:
                    chunk, candidates, verdicts = size_and_filter(
                        run,
                        cfg,
                        chunk,
                        device,
                        pool,
                        ledger,
                        progress,
                        candidates,
                        verdicts,
                        stop_at,
                        ahead,
                    )
                except ChunkStopped as stopped:  # its finished jobs are journaled
                    clock.left = stopped.left
                    clock.stopped = True
                    unscreened |= {t.id for t in composed[start:]}
                    break
                # the pool's start, paid once, says nothing about the next chunk
                spent = time.time() - began - (pool.start_seconds() - pool_start)
                clock.record(spent, computed=sum(ledger.computed.values()) > computed)
                screened |= {t.id for t in chunk}
                by_task = group_by_task(verdicts)
                # the round's later chunks hold only their compose verdict so far
                passed = [t for t in candidates if t.id in screened and passed_all(t.id, by_task)]
                with ledger.timed("dedup"):
                    deduped = dedup(passed, cfg.dedup, dedup_cache)
                dedup_verdicts = deduped.verdicts
                accepted = deduped.kept
    finally:
        with ledger.timed("pool_close"):
            pool_stats = pool.close()
    composed_summary = compose_summary(verdicts)
    # composed once the target was met: never screened, so neither accepted nor rejected
    candidates = [t for t in candidates if t.id not in unscreened]
    verdicts = [v for v in verdicts if v.task_id not in unscreened]
    # rows a release re-check rejected (``opsynth.rechecked``) leave the accepted set only
    # here, so the rounds, and every chunk's work, stay as they were: rows past the target
    # fill their places
    dropped = read_rechecked(run)
    verdicts += [v for t in accepted if (v := dropped.get(t.id)) is not None]
    accepted = [t for t in accepted if t.id not in dropped]

    with ledger.timed("export"):
        ordered = in_quota_order(accepted, quota)
        exported = export(
            run, cfg, seeds, candidates, verdicts + dedup_verdicts, ordered, cfg.target
        )
    manifest.update(exported)
    manifest["rechecked_dropped"] = len(dropped)
    manifest["quota"] = {
        "wanted": quota,
        "accepted": dict(by_source(accepted)),
        "exported": dict(by_source(ordered[: cfg.target])),
    }
    if clock.stopped and exported["status"] != COMPLETE:
        manifest["status"] = STOPPED
    manifest.update(
        {
            "work": {"reused": ledger.reused, "computed": ledger.computed},
            "unscreened": len(unscreened),
            # settled jobs of a chunk left part-done, in its journal until the chunk ends
            "journaled_jobs": len(journaled(run)),
            # this invocation's wall seconds per stage; size and filter (size_filter when
            # pipelined) include the pool's start (``pool_start``) where it was first needed
            "stage_seconds": {**ledger.seconds, "pool_start": pool_stats.get("start_s")},
            "filters_runtime": pool_stats,
            "compose": composed_summary,
        }
    )
    manifest["invocations"] = [*manifest.get("invocations", []), invocation(manifest, clock)]
    run.write_manifest(manifest)
    if cfg.publish.repo_id and manifest["status"] == COMPLETE:
        manifest["publish"] = publish_stage(run, cfg)
        run.write_manifest(manifest)
    return manifest


def source_mix(cfg: RunConfig, seeds: list[Task]) -> dict[str, float]:
    """The configured mix over the sources these seeds can supply (``synth.sampling``)."""
    chainable, standalone = split_seeds(seeds)
    return effective_mix(cfg.compose.mix, chains=bool(chainable), standalone=bool(standalone))


def unused_standalone(seeds: list[Task], candidates: list[Task]) -> dict[str, int]:
    """Transformers seeds no candidate has used yet: each is composed at most once."""
    produced = {tuple(t.ops) for t in candidates}
    _, standalone = split_seeds(seeds)
    return {TRANSFORMERS: sum(tuple(s.ops) not in produced for s in standalone)}


def invocation(manifest: dict[str, Any], clock: ChunkClock) -> dict[str, Any]:
    """This invocation's line of run.json's ``invocations``: a run resumed over several
    invocations (hosts, batch jobs) keeps each one's wall time, work and versions."""
    keys = (
        "started_at",
        "finished_at",
        "status",
        "device",
        "versions",
        "work",
        "stage_seconds",
        "journaled_jobs",
    )
    line = {k: manifest.get(k) for k in keys}
    line["counts"] = dict(manifest.get("counts", {}))
    line["chunks_computed_s"] = [round(s, 3) for s in clock.computed_s]
    if clock.stop_at is not None:
        line["stop_at"] = clock.stop_at
    if clock.left:
        line["left_mid_chunk"] = dict(clock.left)
    return line


def pipelined(cfg: RunConfig) -> bool:
    """Whether chunks are sized and filtered as one pipeline (``flows.size_screen``)."""
    return cfg.sizing.enabled and cfg.sizing.pipelined and cfg.runner.kind == "local"


def size_and_filter(
    run: RunDir,
    cfg: RunConfig,
    chunk: list[Task],
    device: str,
    pool: LazyPool,
    ledger: WorkLedger,
    progress: Progress,
    candidates: list[Task],
    verdicts: list[Verdict],
    stop_at: float | None = None,
    ahead: list[Task] | None = None,
) -> tuple[list[Task], list[Task], list[Verdict]]:
    """One chunk sized (when sizing is on) and filtered: pipelined on the in-process pool
    (``flows.size_screen``), else sized in lockstep rounds on whichever runner and then
    filtered. The chunk as it ends, and the run's candidates and verdicts with the chunk's
    sized tasks in their originals' places and its new verdicts added."""
    if pipelined(cfg):
        taken = {t.id for t in candidates}
        with ledger.timed(SIZE_FILTER):
            sized, rows = size_and_screen(
                run, cfg, chunk, device, pool, ledger, progress, taken, stop_at, ahead
            )
        chunk, candidates, verdicts = adopt_sized(chunk, sized, candidates, verdicts)
        return chunk, candidates, verdicts + rows
    if cfg.sizing.enabled:
        with ledger.timed("size"):
            sized = size_stage(run, cfg, chunk, device, pool, ledger, progress)
        chunk, candidates, verdicts = adopt_sized(chunk, sized, candidates, verdicts)
    with ledger.timed("filter"):
        verdicts = verdicts + screen(run, cfg, chunk, device, pool, ledger, progress)
    return chunk, candidates, verdicts
