"""The ``audit`` Prefect flow: any existing Ops-6K-shaped task set through the same stages as
``regenerate`` (static, decontam, sandboxed filters, dedup), resumable the same way."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from prefect import flow

from flows.stages import (
    LazyPool,
    Progress,
    WorkLedger,
    export,
    group_by_task,
    noop_progress,
    passed_all,
    screen,
    versions,
)
from opsynth.config import RunConfig
from opsynth.record import Task, utc_now
from opsynth.store import RunDir


class AuditInputError(ValueError):
    """The audit input could not be read; one line with the fix."""


def load_input(source: str) -> list[Task]:
    """A local parquet file, or a Hugging Face Hub dataset id (needs network)."""
    from filters.audit import load_task_set

    path = Path(source)
    if path.exists():
        return load_task_set(path)
    if source.count("/") != 1 or source.endswith(".parquet"):
        raise AuditInputError(f"--input {source}: no such file and not a Hub dataset id ORG/NAME")
    try:
        import datasets

        rows = datasets.load_dataset(source, split="train")
    except Exception as exc:
        raise AuditInputError(
            f"--input {source}: could not load it from the Hub ({type(exc).__name__}); "
            "check the id and the network, or pass a local parquet file"
        ) from exc
    return [Task.from_row(dict(row)) for row in rows]


def sample_tasks(tasks: list[Task], sample: int | None, seed: int) -> list[Task]:
    """A seeded sample, kept in input order so reports read like the source."""
    if sample is None or sample >= len(tasks):
        return tasks
    keep = set(random.Random(seed).sample(range(len(tasks)), sample))
    return [t for i, t in enumerate(tasks) if i in keep]


@flow(name="audit", log_prints=False)
def audit(
    out: str,
    cfg: RunConfig,
    tasks: list[Task],
    device: str,
    source: str,
    progress: Progress | None = None,
) -> dict[str, Any]:
    from ast_dedup.dedup import dedup

    run = RunDir.create(Path(out))
    ledger = WorkLedger()
    progress = progress or noop_progress
    pool = LazyPool(cfg, device)
    # the same task can occur twice in a set (Ops-6K has exact duplicate rows): screen once
    unique = list({t.id: t for t in tasks}.values())
    manifest = {
        "kind": "audit",
        "source": source,
        "input_rows": len(tasks),
        "status": "running",
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
