"""Filter shards on a local 2-worker Dask cluster (prefect-dask) give the local runner's
verdicts, and their work files resume under any runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opsynth.config import RunConfig, RunnerConfig
from opsynth.flows.runners import plan_workers

pytest.importorskip("prefect_dask")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "runner_screen.py"


def screen(out: Path, kind: str, what: str = "screen") -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), kind, what],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_runner_is_not_part_of_the_config_hash() -> None:
    base = RunConfig()
    assert base.with_section("runner", kind="dask").config_hash() == base.config_hash()


def test_plan_splits_cores_and_gpus() -> None:
    cores = list(range(16))
    plans = plan_workers(RunnerConfig(kind="dask"), "cuda", cores, ["0", "1", "2", "3"])
    assert [p["CUDA_VISIBLE_DEVICES"] for p in plans] == ["0", "1", "2", "3"]
    assert plans[1]["OPSYNTH_CPUS"] == "4,5,6,7"
    pairs = plan_workers(RunnerConfig(kind="dask", gpus_per_worker=2), "cuda", cores, list("0123"))
    assert [p["CUDA_VISIBLE_DEVICES"] for p in pairs] == ["0,1", "2,3"]
    cpu = plan_workers(RunnerConfig(kind="dask"), "cpu", [0, 1], [])
    assert cpu == [{"OPSYNTH_CPUS": "0"}, {"OPSYNTH_CPUS": "1"}]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, dict]:
    """One flow per runner (a Prefect server and, for Dask, a cluster each), sizing then
    screening, shared by the tests below."""
    root = tmp_path_factory.mktemp("runners")
    return root, screen(root / "local", "local", "both"), screen(root / "dask", "dask", "both")


@pytest.mark.slow
def test_dask_shards_match_local_and_resume(runs: tuple[Path, dict, dict]) -> None:
    root, local, dask = runs
    assert dask["verdicts"] == local["verdicts"]
    assert dask["computed"]["filter-shard"] == 3 and not dask["reused"]
    assert dask["progress"] > 0  # reported in the orchestrator
    again = screen(root / "dask", "local")  # work files are the same whichever runner
    assert again["verdicts"] == local["verdicts"]
    assert again["reused"] == {"prefilter": 1, "filter-shard": 3} and not again["computed"]


@pytest.mark.slow
def test_sizing_probes_run_on_the_cluster(runs: tuple[Path, dict, dict]) -> None:
    """Under Dask the size stage's probes go to the cluster's workers: every sizable task is
    measured and the orchestrator starts no pool of its own (it may have no GPU)."""
    _, local, dask = runs
    assert local["orchestrator_pool_started"] and not dask["orchestrator_pool_started"]
    for run in (local, dask):
        *sizable, plain = run["steps"]
        assert plain == []  # no batch_size constant: nothing to probe
        assert run["pool_stats"]["device_name"]  # what run.json records, either way
        assert [steps[0]["value"] for steps in sizable] == [4, 8, 16]
        assert all(step["ms"] and step["ms"] > 0 for steps in sizable for step in steps)


@pytest.mark.slow
def test_audit_cli_on_a_dask_cluster_matches_local(
    tmp_path: Path, prefect_api: dict[str, str]
) -> None:
    """``opsynth audit --runner dask``: the same verdicts as the local pool, one-line errors.
    The local audit is first stopped by a time limit, then resumed; run again with a time
    limit once done, it only reads its finished chunks. All runs use the session's Prefect
    server (the fixture above covers starting one)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from runner_screen import tasks

    from opsynth.store import read_verdicts, write_tasks

    source = tmp_path / "tiny.parquet"
    write_tasks(tasks(), source)
    config = tmp_path / "cpu.toml"
    config.write_text(
        'chunk_size = 2\n[filters]\nworkers = 1\nshard_size = 2\nsandbox = "rlimits"\n'
        "allow_unsafe = true\n"
        "task_timeout_s = 60.0\n"
        f'cache_dir = "{ROOT / ".cache" / "test-compile"}"\n[runner]\nworkers = 2\n'
    )

    def audit(kind: str, *limit: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "opsynth.flows.cli", "audit", "--input", str(source)]
            + ["--out", str(tmp_path / kind), "--config", str(config), "--device", "cpu"]
            + ["--runner", kind, *limit],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, **prefect_api},
            timeout=600,
        )

    # spent before its first chunk could start: it checks what it can and says how to go on
    stopped = audit("local", "--time-limit", "1")
    assert stopped.returncode == 3, stopped.stderr[-3000:]
    said = " ".join((stopped.stdout + stopped.stderr).split())  # as wrapped for the terminal
    assert "stopped at the time limit (1 s) with 0 of 5 unique tasks checked" in said, said
    assert said.endswith("re-run with the same --input to resume"), said[-2000:]
    manifest = json.loads((tmp_path / "local" / "run.json").read_text())
    assert manifest["status"] == "stopped" and manifest["counts"]["candidates"] < 5
    verdicts = {}
    for kind in ("local", "dask"):
        done = audit(kind)
        assert done.returncode == 0, done.stderr[-3000:]
        rows = read_verdicts(tmp_path / kind / "verdicts.parquet")
        verdicts[kind] = sorted((v.task_id, v.stage, v.passed, v.reason) for v in rows)
    assert verdicts["dask"] == verdicts["local"] and verdicts["local"]
    assert {v[0] for v in verdicts["local"]} == {t.id for t in tasks()}
    manifest = json.loads((tmp_path / "local" / "run.json").read_text())
    assert [i["status"] for i in manifest["invocations"]] == ["stopped", "complete"]
    # finished: a time limit never skips a chunk on disk, and nothing runs again
    again = audit("local", "--time-limit", "1")
    assert again.returncode == 0, again.stderr[-3000:]
    manifest = json.loads((tmp_path / "local" / "run.json").read_text())
    assert manifest["status"] == "complete" and manifest["journaled_jobs"] == 0
    assert manifest["work"]["computed"] == {} and manifest["work"]["reused"]["screen"] == 3
    rows = read_verdicts(tmp_path / "local" / "verdicts.parquet")
    assert sorted((v.task_id, v.stage, v.passed, v.reason) for v in rows) == verdicts["local"]
    # another input into the same directory: its history alone, the first chunk's work reused
    write_tasks(tasks()[:2], source)
    other = audit("local")
    assert other.returncode == 0, other.stderr[-3000:]
    manifest = json.loads((tmp_path / "local" / "run.json").read_text())
    assert [i["status"] for i in manifest["invocations"]] == ["complete"], manifest
    assert manifest["unique_rows"] == 2 and manifest["work"]["computed"] == {}
    bad = subprocess.run(
        [sys.executable, "-m", "opsynth.flows.cli", "audit", "--input", str(source)]
        + ["--out", str(tmp_path / "bad"), "--runner", "spark"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert bad.returncode == 2 and "--runner must be local or dask" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_dask_preload_starts_the_pool_the_first_shard_then_uses(monkeypatch) -> None:
    """A local Dask worker starts its pool as it starts (``dask_setup``), from the settings in
    its environment, and the first shard runs on that pool instead of starting another."""
    from opsynth.config import FiltersConfig
    from opsynth.filters import process_pool
    from opsynth.filters.samples import task_source
    from opsynth.record import Task

    cfg = FiltersConfig(
        workers=1,
        cache_dir=str(ROOT / ".cache" / "test-compile"),
        sandbox="rlimits",
        allow_unsafe=True,
    )
    task = Task(ops=["c"], data_source="torch#1", code=task_source("return x * 0 + 3"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv(process_pool.WARM_ENV, process_pool.warm_spec(cfg, "cpu"))
    try:
        assert process_pool.dask_setup() == (cfg, "cpu")
        assert process_pool.stats()["workers_started"] == 1  # waits for the start in progress
        results = process_pool.evaluate(cfg, "cpu", [task])
        assert results[task.id][-1].reason == "constant_output"
        stats = process_pool.stats()
        assert stats["workers_started"] == 1 and stats["candidates"] == 1  # the same pool
    finally:
        process_pool.shutdown()
    monkeypatch.delenv(process_pool.WARM_ENV)
    assert process_pool.dask_setup() is None


def test_shards_from_two_threads_overlap_on_one_pool() -> None:
    """Two engine threads run shards on the process's one pool at once: the second shard's
    candidates start on the worker the first shard's slow candidate leaves free, so their
    verdicts come while it still runs, not after it (one shard at a time). Collecting stays
    on the pool thread, so the second call returns only after the first."""
    import threading
    import time
    from datetime import datetime

    from opsynth.config import FiltersConfig
    from opsynth.filters import process_pool
    from opsynth.filters.samples import task_source
    from opsynth.record import Task

    cfg = FiltersConfig(
        workers=2,
        cache_dir=str(ROOT / ".cache" / "test-compile"),
        sandbox="rlimits",
        allow_unsafe=True,
    )

    def constant(n: int, init: str = "pass") -> Task:
        code = task_source(f"return x * 0 + {n}", init=init, header="import time")
        return Task(ops=["c"], data_source="torch#1", code=code)

    slow = constant(1, init="time.sleep(12)")
    first, second = [slow, constant(2)], [constant(3), constant(4)]
    results: dict[str, dict] = {}

    def run(name: str, shard: list[Task]) -> None:
        results[name] = process_pool.evaluate(cfg, "cpu", shard)

    try:
        process_pool.evaluate(cfg, "cpu", [constant(5)])  # the pool is up and warm
        threads = [
            threading.Thread(target=run, args=("first", first)),
            threading.Thread(target=run, args=("second", second)),
        ]
        threads[0].start()
        time.sleep(1.0)
        threads[1].start()
        for thread in threads:
            thread.join(300)
        assert set(results) == {"first", "second"}
        for name, shard in (("first", first), ("second", second)):
            assert set(results[name]) == {t.id for t in shard}
            assert all(rows[-1].reason == "constant_output" for rows in results[name].values())

        def finished(rows: list) -> datetime:
            return datetime.fromisoformat(rows[-1].created_at)

        slow_done = finished(results["first"][slow.id])
        for rows in results["second"].values():
            assert (slow_done - finished(rows)).total_seconds() >= 3
        assert process_pool.stats()["workers_started"] == 2  # one pool throughout
    finally:
        process_pool.shutdown()


@pytest.mark.slow
def test_the_engine_pools_stats_come_back_with_their_shards(runs) -> None:
    """run.json's pool stats under Dask: every engine pool that ran a shard, under its own
    name, and their sums, which count every probe and every filtered candidate."""
    _, local, dask = runs
    summary = dask["pool_stats"]
    engines = summary["engines"]
    assert 1 <= len(engines) <= 2 and len({e["engine"] for e in engines}) == len(engines)
    assert summary["candidates"] == sum(e["candidates"] for e in engines)
    assert summary["candidates"] == local["pool_stats"]["candidates"]  # the same jobs
    assert summary["sandbox"] == local["pool_stats"]["sandbox"]
