"""The ``regenerate`` Prefect flow: seeds -> compose -> static -> decontam -> execution
filters -> dedup -> export, in rounds until the target is met, then publish when
``publish.repo_id`` is set.

Prefect tasks are coarse (a stage, or a shard of candidates), never one per candidate; see
``flows.stages``. Import this module only after ``flows.prefect_env.configure_prefect``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from prefect import flow

from opsynth.config import RunConfig
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
from opsynth.record import Task, Verdict, utc_now
from opsynth.store import RunDir
from opsynth.synth.composers import summary as compose_summary
from opsynth.verdicts import adopt_sized, group_by_task, passed_all


@flow(name="regenerate", log_prints=False)
def regenerate(
    out: str,
    cfg: RunConfig,
    device: str,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Produce ``cfg.target`` accepted tasks in ``out``; resumable at any point."""
    from opsynth.ast_dedup.dedup import dedup

    run = RunDir.create(Path(out))
    ledger = WorkLedger()
    progress = progress or noop_progress
    started = utc_now()
    pool = LazyPool(cfg, device)
    manifest = run.read_manifest()
    manifest.update(
        {
            "status": "running",
            "config": cfg.model_dump(mode="json"),
            "config_hash": cfg.config_hash(),
            "device": device,
            "started_at": started,
            "versions": versions(),
        }
    )
    run.write_manifest(manifest)

    progress("seeds", 0, 1)
    seeds = seeds_stage(run, cfg, ledger)
    progress("seeds", 1, 1)
    candidates: list[Task] = []
    verdicts: list[Verdict] = []
    seen: set[str] = set()
    accepted: list[Task] = []
    dedup_verdicts: list[Verdict] = []
    pool_stats: dict[str, Any] = {}
    try:
        for round_index in range(cfg.max_rounds):
            need = cfg.target - len(accepted)
            if need <= 0:
                break
            wanted = math.ceil(need * cfg.compose.oversample)
            produced = [t.ops for t in candidates]
            progress(f"compose round {round_index}", 0, wanted)
            drawn = compose_stage(run, cfg, seeds, round_index, wanted, ledger, produced)
            progress(f"compose round {round_index}", wanted, wanted)
            fresh = {t.id for t in drawn.tasks} - seen
            seen |= fresh
            candidates += [t for t in drawn.tasks if t.id in fresh]
            verdicts += [v for v in drawn.verdicts if v.task_id in fresh]
            composed = [t for t in drawn.kept() if t.id in fresh]
            if cfg.sizing.enabled and composed:
                sized = size_stage(run, cfg, composed, device, pool, ledger, progress)
                composed, candidates, verdicts = adopt_sized(composed, sized, candidates, verdicts)
            verdicts += screen(run, cfg, composed, device, pool, ledger, progress)
            by_task = group_by_task(verdicts)
            passed = [t for t in candidates if passed_all(t.id, by_task)]
            deduped = dedup(passed, cfg.dedup)
            dedup_verdicts = deduped.verdicts
            accepted = deduped.kept
    finally:
        pool_stats = pool.close()

    manifest.update(
        export(run, cfg, seeds, candidates, verdicts + dedup_verdicts, accepted, cfg.target)
    )
    manifest.update(
        {
            "work": {"reused": ledger.reused, "computed": ledger.computed},
            "filters_runtime": pool_stats,
            "compose": compose_summary(verdicts),
        }
    )
    run.write_manifest(manifest)
    if cfg.publish.repo_id and manifest["status"] == "complete":
        manifest["publish"] = publish_stage(run, cfg)
        run.write_manifest(manifest)
    return manifest
