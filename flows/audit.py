"""The ``audit`` Prefect flow: any existing Ops-6K-shaped task set through the same stages as
``regenerate`` (static, decontam, sandboxed filters, dedup), resumable the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow

from opsynth.config import RunConfig
from opsynth.flows.stages import (
    LazyPool,
    Progress,
    WorkLedger,
    export,
    noop_progress,
    screen,
    versions,
)
from opsynth.record import utc_now
from opsynth.store import RUNNING, RunDir, read_tasks
from opsynth.verdicts import group_by_task, passed_all


@flow(name="audit", log_prints=False)
def audit(
    out: str,
    cfg: RunConfig,
    tasks_file: str,
    device: str,
    source: str,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Audit the tasks in ``tasks_file`` (parquet). A path, not the rows, is the parameter:
    Prefect sends a flow's parameters with every task it submits to Dask, and a full
    Ops-6K is ~10 MB of code per shard."""
    from opsynth.ast_dedup.dedup import dedup

    run = RunDir.create(Path(out))
    tasks = read_tasks(Path(tasks_file))
    ledger = WorkLedger()
    progress = progress or noop_progress
    pool = LazyPool(cfg, device)
    # the same task can occur twice in a set (Ops-6K has exact duplicate rows): screen once
    unique = list({t.id: t for t in tasks}.values())
    manifest = {
        "kind": "audit",
        "source": source,
        "input_rows": len(tasks),
        "status": RUNNING,
        "config": cfg.model_dump(mode="json"),
        "config_hash": cfg.config_hash(),
        "device": device,
        "started_at": utc_now(),
        "versions": versions(),
    }
    run.write_manifest(manifest)
    try:
        verdicts = screen(run, cfg, unique, device, pool, ledger, progress)
    finally:
        pool_stats = pool.close()
    by_task = group_by_task(verdicts)
    passed = [t for t in unique if passed_all(t.id, by_task)]
    deduped = dedup(passed, cfg.dedup)
    manifest.update(export(run, cfg, [], unique, verdicts + deduped.verdicts, deduped.kept, None))
    manifest.update(
        {
            "work": {"reused": ledger.reused, "computed": ledger.computed},
            "filters_runtime": pool_stats,
        }
    )
    run.write_manifest(manifest)
    return manifest
