"""Runs the screen stage (static, decontam, sandboxed filter shards) over a few tiny tasks in a
Prefect flow on the runner given on the command line and prints the verdicts and the work
ledger as JSON. A script, so that Prefect is configured for its own run directory before it
is imported (tests/test_runner_dask.py runs it once per runner).

    python tests/runner_screen.py OUT local|dask
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

from filters.samples import task_source
from flows.prefect_env import configure_prefect
from opsynth.config import RunConfig
from opsynth.record import Task

CACHE = Path(__file__).resolve().parent.parent / ".cache" / "test-compile"


def tasks() -> list[Task]:
    """Cheap rejections at three different stages, none reaching torch.compile."""
    bodies = [
        "return x * 0 + 1",
        "return x * 0 + 2",
        "return x @ torch.randn(3, 5)",
        "return x + torch.rand_like(x)",
        "return torch.ones_like(x)",
    ]
    return [
        Task(ops=[f"t{i}"], data_source="torch#1", code=task_source(b))
        for i, b in enumerate(bodies)
    ]


def config(kind: str) -> RunConfig:
    cfg = RunConfig()
    cfg = cfg.with_section(
        "filters",
        workers=1,
        shard_size=2,
        cache_dir=str(CACHE),
        task_timeout_s=60.0,
        grace_s=10.0,
        sandbox="rlimits",
    )
    return cfg.with_section("runner", kind=kind, workers=2)


def main(out: str, kind: str) -> None:
    configure_prefect(Path(out).resolve() / ".prefect")
    from prefect import flow

    from flows.runners import LocalOnly, task_runner
    from flows.stages import LazyPool, WorkLedger, screen
    from opsynth.store import RunDir

    cfg = config(kind)
    lock, reports = threading.Lock(), []

    def progress(stage: str, done: int, total: int) -> None:  # holds a lock, like a progress bar
        with lock:
            reports.append(done)

    @flow(name="screen-test")
    def screen_flow(progress) -> dict:  # a flow parameter, as in regenerate
        run = RunDir.create(Path(out))
        ledger = WorkLedger()
        pool = LazyPool(cfg, "cpu")
        try:
            verdicts = screen(run, cfg, tasks(), "cpu", pool, ledger, progress)
        finally:
            pool.close()
        rows = [(v.task_id, v.stage, v.passed, v.reason) for v in verdicts]
        done = {"reused": ledger.reused, "computed": ledger.computed, "progress": len(reports)}
        return {"verdicts": rows, **done}

    engine = task_runner(cfg.runner, "cpu", cfg.filters)
    runnable = screen_flow.with_options(task_runner=engine) if engine else screen_flow
    print(json.dumps(runnable(LocalOnly(progress))))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
