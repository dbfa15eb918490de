"""Pool mechanics: device resolution, worker counts, recycling, fallback, progress, shutdown."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pytest
import torch

from opsynth.config import FiltersConfig
from opsynth.filters import calibrate, compile_cache, privilege, sandbox
from opsynth.filters.pool import PoolError, WorkerPool, resolve_device, worker_count
from opsynth.filters.pool_setup import smallest_memory_gib
from opsynth.filters.samples import task_source
from opsynth.record import Task

CACHE = Path(__file__).resolve().parent.parent / ".cache" / "test-compile"


def config(**overrides: object) -> FiltersConfig:
    values: dict[str, object] = {
        "workers": 1,
        "cache_dir": str(CACHE),
        "task_timeout_s": 60.0,
        "grace_s": 10.0,
        "window_ms_cpu": (0.0, 60000.0),
    }
    values.update(overrides)
    return FiltersConfig(**values)


def constant_task(value: int) -> Task:
    """Rejected at the degenerate stage: cheap, and never reaches torch.compile."""
    return Task(
        ops=[f"c{value}"], data_source="torch#1", code=task_source(f"return x * 0 + {value}")
    )


def test_resolve_device() -> None:
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="auto, cpu or cuda"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            resolve_device("cuda")


def test_worker_count() -> None:
    cfg = FiltersConfig()
    assert worker_count(cfg.model_copy(update={"workers": 3}), "cpu", 64, 0) == 3
    assert worker_count(cfg, "cpu", 2, 0) == 1
    assert worker_count(cfg, "cpu", 16, 0) == 16 // cfg.cores_per_worker
    assert worker_count(cfg, "cuda", 16, 1) == 16  # one core each: compile parallelism
    assert worker_count(cfg, "cuda", 64, 1) == cfg.max_workers_per_gpu
    assert worker_count(cfg, "cuda", 32, 2) == 32
    assert worker_count(cfg, "cuda", 256, 8) == 8 * cfg.max_workers_per_gpu
    assert worker_count(cfg, "cuda", 4, 8) == 8  # at least one worker per GPU


def test_a_derived_worker_count_fits_the_gpus_memory() -> None:
    """Sixteen workers of sized tasks (up to 8 GiB each) fit a 141 GB GPU, nine an 80 GB one;
    a set count or an unknown memory is not bounded, and a tiny GPU still gets one."""
    cfg = FiltersConfig()
    assert worker_count(cfg, "cuda", 16, 1, gpu_gib=139.8) == 16
    assert worker_count(cfg, "cuda", 16, 1, gpu_gib=79.6) == 9
    assert worker_count(cfg, "cuda", 64, 2, gpu_gib=39.4) == 2 * 4
    assert worker_count(cfg, "cuda", 16, 1, gpu_gib=4.0) == 1
    assert worker_count(cfg, "cuda", 16, 1, gpu_gib=None) == 16
    assert worker_count(cfg.model_copy(update={"workers": 12}), "cuda", 16, 1, 79.6) == 12
    uncapped = cfg.model_copy(update={"gib_per_gpu_worker": 0.0})
    assert worker_count(uncapped, "cuda", 16, 1, gpu_gib=79.6) == 16


def test_the_gpus_memory_is_read_from_nvidia_smis_table(monkeypatch) -> None:
    """By UUID always, by index only in PCI order (nvidia-smi's), else the smallest GPU."""
    table = "0, GPU-aaa, 81559\n1, GPU-bbb, 40960\n"
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    assert smallest_memory_gib(table, ["GPU-aaa"]) == 81559 / 1024
    assert smallest_memory_gib(table, ["0"]) == 40  # CUDA's order may not be nvidia-smi's
    assert smallest_memory_gib(table, ["GPU-zzz"]) == 40  # not listed: the smallest
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert smallest_memory_gib(table, ["0"]) == 81559 / 1024
    assert smallest_memory_gib(table, ["0", "1"]) == 40
    assert smallest_memory_gib("No devices were found\n", ["0"]) is None
    assert smallest_memory_gib("", []) is None


def test_workers_are_recycled_and_results_keep_order() -> None:
    tasks = [constant_task(v) for v in range(1, 4)]
    seen: list[tuple[int, int]] = []
    before = time.time()
    with WorkerPool(config(recycle_after=2), "cpu") as pool:
        started = dict(pool.stats)
        results = pool.evaluate(
            tasks + tasks[:2], progress=lambda done, total: seen.append((done, total))
        )
        stats = dict(pool.stats)
        procs = [w.proc for w in pool._workers if w is not None]
    assert list(results) == [t.id for t in tasks]  # duplicates evaluated once, input order kept
    assert all(rows[-1].reason == "constant_output" for rows in results.values())
    assert seen[-1] == (3, 3) and len(seen) == 3
    assert stats["candidates"] == 3
    assert before < stats["first_result_at"] <= stats["last_result_at"] <= time.time()
    assert stats["workers_replaced"] >= 1 and stats["workers_started"] >= 2
    assert all(p.poll() is not None for p in procs)  # close() leaves no worker behind
    idle = WorkerPool(config(), "cpu")
    assert idle.evaluate([]) == {}
    assert idle.stats["workers_started"] == 0  # nothing to do starts nothing
    # when the start began and how long until every worker was ready (torch imported)
    assert before <= started["started_at"] <= before + 5
    assert started["start_s"] > 0.5 and idle.stats["start_s"] is None


def test_without_bwrap_untrusted_code_runs_only_when_unsafe_is_allowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sandbox, "BWRAP", "/nonexistent/bwrap")
    for refused in (config(sandbox="auto"), config(sandbox="bwrap"), config(sandbox="rlimits")):
        with pytest.raises(PoolError, match="--unsafe") as caught:
            WorkerPool(refused.model_copy(update={"allow_unsafe": False}), "cpu").start()
        assert "\n" not in str(caught.value)  # one line the CLI can print as it is
    with WorkerPool(config(sandbox="auto", allow_unsafe=True), "cpu") as pool:
        assert pool.stats["sandbox"] == "rlimits"
        assert "not installed" in pool.stats["sandbox_fallback_reason"]
        results = pool.evaluate([constant_task(7)])
    assert next(iter(results.values()))[-1].reason == "constant_output"
    with pytest.raises(PoolError, match="bwrap"):
        WorkerPool(config(sandbox="bwrap", allow_unsafe=True), "cpu").start()


@pytest.mark.skipif(not sandbox.bwrap_available(), reason="bubblewrap is not installed")
def test_bwrap_is_used_when_available() -> None:
    with WorkerPool(config(sandbox="bwrap"), "cpu") as pool:
        assert pool.stats["sandbox"] == "bwrap"
        assert pool.stats["device"] == "cpu" and pool.stats["device_name"]
        assert pool.stats["torch_version"] == torch.__version__
        factors = pool.calibrate()
    assert set(factors) == set(calibrate.BENCHMARKS)
    assert all(ms > 0 for ms in factors.values())


def test_speed_factor_is_a_geometric_mean() -> None:
    local = {"a": 1.0, "b": 2.0, "c": 5.0}
    reference = {"a": 2.0, "b": 8.0}
    assert calibrate.speed_factor(local, reference) == pytest.approx(math.sqrt(2.0 * 4.0))
    with pytest.raises(ValueError):
        calibrate.speed_factor(local, {"z": 1.0})


def test_worker_environment_is_an_allow_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-should-not-leak")
    paths = sandbox.Paths("/c", "/l", "/w")
    env = sandbox.worker_env(paths=paths, kind="bwrap", threads=3, cuda_visible="1")
    assert "OPENAI_API_KEY" not in env
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["OMP_NUM_THREADS"] == "3"
    assert env["TORCHINDUCTOR_COMPILE_THREADS"] == "1"
    # compile caches private to the candidate, under the temp dir wiped between candidates;
    # the trusted layer named where the sandbox binds it (read-only)
    assert env["TORCHINDUCTOR_CACHE_DIR"].startswith(f"{sandbox.SANDBOX_TMP}/")
    assert env["TRITON_CACHE_DIR"].startswith(f"{sandbox.SANDBOX_TMP}/")
    assert env[compile_cache.TRUSTED_ENV] == sandbox.SANDBOX_CACHE
    fallback = sandbox.worker_env(paths=paths, kind="rlimits", threads=1, cuda_visible=None)
    assert fallback["TORCHINDUCTOR_CACHE_DIR"].startswith(f"{paths.tmp_dir}/")
    assert fallback[compile_cache.TRUSTED_ENV] == "/c"
    assert fallback["CUDA_VISIBLE_DEVICES"] == ""


@pytest.mark.parametrize("identity", [None, privilege.Identity(65534, 65534)])
def test_bwrap_command_hides_the_host(identity: privilege.Identity | None) -> None:
    args = sandbox.bwrap_options(
        paths=sandbox.Paths("/c", "/l", "/w"), device="cpu", tmp_bytes=1 << 20, identity=identity
    )
    binds = {args[i + 2] for i, a in enumerate(args) if a in ("--ro-bind", "--bind")}
    assert "--die-with-parent" in args
    assert args[args.index("--cap-drop") + 1] == "ALL"
    assert "/" not in binds and "/etc" not in binds and "/home" not in binds
    assert not any(b == "/root" or b.startswith("/root/.ssh") for b in binds)
    assert {sandbox.SANDBOX_CACHE, sandbox.SANDBOX_LOCKS} <= binds
    if identity is None:  # unprivileged: bwrap's own user namespace, nothing kept
        assert "--unshare-all" in args and "--cap-add" not in args
    else:  # as root: no user namespace (its uid 0 would be host root); setuid/setgid kept only
        assert "--unshare-all" not in args and "--unshare-user" not in args
        kept = {args[i + 1] for i, a in enumerate(args) if a == "--cap-add"}
        assert kept == {"CAP_SETUID", "CAP_SETGID"} and "--unshare-pid" in args
    launch = sandbox.bwrap_command(args, ["true"], identity=identity, keep_fds=(7,))
    try:  # the options travel in a descriptor: the command line names no host path
        assert launch.argv[:2] == [sandbox.BWRAP, "--args"]
        assert not set(launch.argv) & {"/c", "/l"}
        listed = os.pread(int(launch.argv[2]), 1 << 20, 0).decode().split("\0")
        assert "--seccomp" in listed
        # the trusted compile-cache layer is read-only; the lock dir is the one writable bind
        assert listed[listed.index("/c") - 1] == "--ro-bind"
        assert listed[listed.index("/l") - 1] == "--bind"
        entry = launch.argv[launch.argv.index("opsynth.filters.sandbox_entry") + 1 :]
        ids = [str(identity.uid), str(identity.gid)] if identity else ["-", "-"]
        assert entry[:5] == [*ids, "7", "-", "--"] and entry[5:] == ["true"]
    finally:
        launch.close()


def oom_task(tag: str) -> Task:
    """Runs out of memory in its first forward, whoever else is running."""
    forward = 'raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")'
    return Task(ops=[tag], data_source="torch#1", code=task_source(forward))


class WatchedPool(WorkerPool):
    """A real pool that notes how many candidates were running each time one is dispatched."""

    def _dispatch(self, worker, task, ticket):  # type: ignore[no-untyped-def]
        running = sum(1 for w in self._workers if w is not None and w.state == "busy")
        self.log.append((task.id, running))
        return super()._dispatch(worker, task, ticket)


def test_oom_is_retried_alone_and_the_first_run_is_kept() -> None:
    """An ``oom`` under concurrency may be another candidate's memory: the task runs again
    with nothing else running, not even a process waiting for a next candidate (on CUDA each
    holds a context), and that verdict stands with the first run recorded."""
    tasks = [oom_task("a"), constant_task(7), oom_task("b")]
    pool = WatchedPool(config(workers=2), "cpu")
    pool.log = []
    with pool:
        results = pool.evaluate(tasks)
        stats = dict(pool.stats)
    assert [rows[-1].reason for rows in results.values()] == ["oom", "constant_output", "oom"]
    for task in (tasks[0], tasks[2]):
        first = results[task.id][-1].measures["first_run"]
        assert first["reason"] == "oom" and first["concurrent_workers"] == 2
        assert first["retry_wave"] == 1  # a CPU pool has no memory budget: each alone
        assert "Tried to allocate" in first["detail"]
        dispatches = [running for task_id, running in pool.log if task_id == task.id]
        assert len(dispatches) == 2 and dispatches[1] == 0  # the second run had the pool alone
    assert "first_run" not in results[tasks[1].id][-1].measures
    assert stats["retried_alone"] == 2
    # Before the first retry both workers' prestarted processes go; before the second, the
    # one the first retry's worker forked meanwhile. Each retry then runs in a fresh fork.
    assert stats["retry_released"] == 3
    assert stats["child_fresh"] == 2 and stats["child_prestarted"] == 3
    with WorkerPool(config(workers=1), "cpu") as lone:
        alone = lone.evaluate(tasks[:1])
        assert lone.stats["retried_alone"] == 0  # one worker: the first run was already alone
    assert "first_run" not in alone[tasks[0].id][-1].measures


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_the_gpu_a_task_retried_alone_has_the_device_to_itself() -> None:
    """The task asks for all of the device but 4 GiB: beside eleven idle workers, each with a
    process waiting in its own CUDA context, it cannot fit; retried alone it must. Only the
    eager stage runs: the timed runs' own buffers would not fit beside it either."""
    forward = (
        "total = torch.cuda.mem_get_info()[1]\n"
        "        big = torch.empty(total - (4 << 30), dtype=torch.uint8, device=x.device)\n"
        "        return x * 2 + big[:1].float() * 0"
    )
    hungry = Task(ops=["t"], data_source="torch#1", code=task_source(forward))
    with WorkerPool(config(workers=12, task_timeout_s=120.0), "cuda") as pool:
        rows = pool.wait(pool.submit([hungry], None, {"stages": ["eager"]}))[hungry.id]
        stats = dict(pool.stats)
    assert rows[-1].measures["first_run"]["reason"] == "oom"
    assert rows[-1].measures["first_run"]["stage"] == "eager"
    assert [(r.stage, r.passed) for r in rows] == [("eager", True)], rows[-1].detail
    assert stats["retry_released"] >= 11


def test_queued_batches_start_on_workers_the_driving_batch_leaves_idle() -> None:
    """A shard queued with ``submit`` while another is being collected starts on the idle
    worker at once, not after the first shard's slowest candidate; each batch still gets
    exactly its own verdicts."""
    slow = Task(
        ops=["slow"],
        data_source="torch#1",
        code=task_source("return x * 0 + 1", init="import time; time.sleep(6)"),
    )
    quick = [constant_task(v) for v in (2, 3)]
    pool = WatchedPool(config(workers=2), "cpu")
    pool.log = []
    with pool:
        first = pool.submit([slow])
        second = pool.submit(quick)
        got_first = pool.wait(first)
        ahead = len(second.results)  # finished while the first batch was being collected
        got_second = pool.wait(second)
    assert list(got_first) == [slow.id] and list(got_second) == [t.id for t in quick]
    assert got_first[slow.id][-1].reason == "constant_output"
    assert all(rows[-1].reason == "constant_output" for rows in got_second.values())
    assert pool.log[:2] == [(slow.id, 0), (quick[0].id, 1)]  # dispatched side by side
    assert ahead >= 1  # the quick ones ran during the slow one's six seconds


def test_a_queued_batch_cut_short_by_close_runs_again_when_waited_for() -> None:
    """Closing the pool kills candidates that a queued-ahead batch had running; waiting for
    that batch later (the pool restarts) still gives every candidate its verdict."""
    slow = Task(
        ops=["slow2"],
        data_source="torch#1",
        code=task_source("return x * 0 + 1", init="import time; time.sleep(4)"),
    )
    pool = WorkerPool(config(workers=2), "cpu")
    with pool:
        first = pool.submit([constant_task(5)])
        ahead = pool.submit([slow])
        pool.wait(first)  # the slow candidate was dispatched alongside, and is still running
        assert not ahead.done
    got = pool.wait(ahead)  # after close: restarts the pool and runs the candidate again
    pool.close()
    assert got[slow.id][-1].reason == "constant_output"


@pytest.mark.skipif(not sandbox.bwrap_available(), reason="bubblewrap is not installed")
def test_a_harness_registered_from_another_package_runs_in_the_same_sandbox() -> None:
    from plugin_harness import HARNESS

    from opsynth.evaluator.score import Job
    from opsynth.filters import harness

    assert harness.lookup("plugin") is HARNESS
    with pytest.raises(ValueError, match="unknown harness 'nope'"):
        harness.lookup("nope")
    with WorkerPool(config(sandbox="bwrap"), "cpu") as pool:
        jobs = [Job("a", "ok ok"), Job("b", "ok plugin_refused"), Job("c", "ok incorrect")]
        results = pool.run_harness(jobs, "plugin", {})
    assert [(v.stage, v.reason) for v in results["a"]] == [("first", "ok"), ("second", "ok")]
    assert [v.reason for v in results["b"]] == ["ok", "plugin_refused"]
    # the evaluator's codes are the evaluator's: from this harness they break the protocol
    assert [v.reason for v in results["c"]] == ["ok", "protocol_violation"]
    if os.geteuid() == 0:
        assert results["a"][0].measures["uid"] == config().sandbox_uid
