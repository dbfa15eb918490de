"""Runs the screen stage (static, decontam, sandboxed filter shards) over a few tiny tasks in a
Prefect flow on the runner given on the command line and prints the verdicts and the work
ledger as JSON; with ``size``, the size stage's probes instead, and whether the orchestrator's
own pool started; with ``both``, sizing and then the screen in one flow; with ``pipelined``,
one chunk of sizable and plain tasks through both paths of ``flows.regenerate.size_and_filter``
(two stages, then pipelined, in two run folders on one pool). A script, so that Prefect is
configured for its own run directory before it is imported (tests/test_runner_dask.py runs it
once per runner, tests/test_size_screen.py in ``pipelined`` mode).

    python tests/runner_screen.py OUT local|dask [screen|size|both|pipelined]
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from opsynth.config import RunConfig
from opsynth.filters.samples import task_source
from opsynth.flows.prefect_env import configure_prefect
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


def wide(name: str, body: str, batch: int = 4, header: str = "") -> Task:
    """A task with a ``batch_size`` knob over rows of 4096: a grown batch measures clearly
    slower, beyond timing noise."""
    return Task(
        ops=[name],
        data_source="torch#1",
        code=task_source(
            body,
            header=f"{header}batch_size = {batch}\n",
            inputs="[torch.randn(batch_size, 4096)]",
        ),
    )


def sizable() -> list[Task]:
    """Three tasks with a ``batch_size`` knob (two shards of probes) and one without."""
    found = [wide(f"s{n}", "return torch.relu(x) + 1", n) for n in (4, 8, 16)]
    return found + [Task(ops=["plain"], data_source="torch#1", code=task_source("return x + 1"))]


def forbidden() -> Task:
    """A sizable task the static check rejects (it reaches for ``open``)."""
    return Task(
        ops=["forbidden"],
        data_source="torch#1",
        code=task_source(
            "return x if open else x",
            header="batch_size = 4\n",
            inputs="[torch.randn(batch_size, 64)]",
        ),
    )


def twins() -> list[Task]:
    """One task composed at two batch sizes, which both grow to ``max_value`` (256 in
    ``both_paths``): the same code, which only the first of them may keep."""
    return [wide("twin", "return torch.relu(x) + 1", n) for n in (4, 8)]


def forgers() -> list[Task]:
    """Sizable tasks whose final module rewrites the sizing claim its process is about to
    report (found through ``gc``, which the test's config lets tasks import): one chooses a
    size it never measured, one empties the claim."""
    forge = (
        "import gc\n"
        "for found in gc.get_objects():\n"
        "    if isinstance(found, dict) and 'chosen' in found and 'steps' in found:\n"
        "        {}\n"
    )
    actions = ("found['chosen'] = 3", "found.clear()")
    return [
        wide(f"forger{n}", f"return torch.relu(x) + {n}", header=forge.format(action))
        for n, action in enumerate(actions)
    ]


def poisoner() -> Task:
    """A sizable task whose larger sizes raise a CUDA error (as a kernel indexing past 2**31
    elements would), which leaves a real process's context unusable."""
    raises = 'raise RuntimeError("CUDA error: illegal memory access")'
    return wide(
        "poisoner",
        f"if x.shape[0] > 4:\n            {raises}\n        return torch.relu(x) + 1",
    )


def hanger() -> Task:
    """A sizable task whose larger sizes never return: its inline job is killed before it
    claims a size."""
    return wide(
        "hanger", "while x.shape[0] > 4:\n            x = x + 0\n        return torch.relu(x) + 1"
    )


def both_paths(out: str, cfg: RunConfig, progress) -> dict:
    """The same chunk through the two-stage, the pipelined and the inline path on one pool:
    per path, the chunk's final tasks (id, sizing steps or None), every task's verdict rows
    and the jobs the pool ran; then the forgers, the poisoner and the hanger through the inline
    path."""
    from opsynth.flows.regenerate import size_and_filter
    from opsynth.flows.stages import LazyPool, WorkLedger
    from opsynth.store import RunDir
    from opsynth.verdicts import group_by_task

    chunk = sizable() + [forbidden()] + twins() + tasks()
    cfg = cfg.with_section("sizing", max_value=256)
    cfg = cfg.with_section("filters", task_modules=[*cfg.filters.task_modules, "gc"])
    pool = LazyPool(cfg, "cpu")
    own: list = []  # pools a path started for itself
    result: dict = {}
    paths = (
        ("two_stage", False, False, chunk),
        ("pipelined", True, False, chunk),
        ("inline", True, True, chunk),
        ("forged", True, True, [*forgers(), poisoner()]),
        ("hung", True, True, [hanger()]),
    )
    try:
        for path, pipelined, inline, tasks_in in paths:
            run_cfg = cfg.with_section("sizing", pipelined=pipelined, inline=inline)
            on = pool
            if path == "hung":  # killed soon, whether sizing inline or probing
                run_cfg = run_cfg.with_section("sizing", inline_timeout_s=1.0)
                run_cfg = run_cfg.with_section("filters", task_timeout_s=10.0)
                # a probe's job takes its limit from the pool's config, as in a run, whose
                # pool is built from the run's config: so this path has a pool of its own
                on = LazyPool(run_cfg, "cpu")
                own.append(on)
            run = RunDir.create(Path(out) / path)
            ledger = WorkLedger()
            jobs = on.pool.stats["candidates"] if on.pool else 0
            started = time.perf_counter()
            final, _, verdicts = size_and_filter(
                run, run_cfg, tasks_in, "cpu", on, ledger, progress, list(tasks_in), []
            )
            rows = group_by_task(verdicts)
            result[path] = {
                "final": [[t.id, t.meta.get("sizing")] for t in final],
                "verdicts": {
                    t.id: [(v.stage, v.passed, v.reason) for v in rows.get(t.id, [])] for t in final
                },
                "details": {t.id: rows[t.id][-1].detail for t in final if rows.get(t.id)},
                "stages_timed": sorted(ledger.seconds),
                "jobs": on.pool.stats["candidates"] - jobs,
                "seconds": round(time.perf_counter() - started, 1),
            }
        result["too_fast"] = too_fast(out, cfg, pool, progress)
        result["resumed"] = resumed(out, cfg, chunk, progress)
        result["retried"] = retried_together(out, cfg, progress)
        # before the paths that use the pool after it: the pool keeps working once cancelled
        result["abandoned"] = abandoned(out, cfg, pool, progress)
        result["ahead"] = ahead_of_time(out, cfg, pool, progress)
        result["as_given"] = as_given(out, cfg, pool, progress)
    finally:
        for started_pool in [pool, *own]:
            started_pool.close()
    return result


def too_fast(out: str, cfg: RunConfig, pool, progress) -> dict:
    """The sizable tasks under a window whose lower edge (1 s) no size up to ``max_value``
    reaches, through the two-stage, the pipelined and the inline path: per path, every task's
    verdict rows (stage, passed, reason) and the jobs the pool ran."""
    from opsynth.flows.regenerate import size_and_filter
    from opsynth.flows.stages import WorkLedger
    from opsynth.store import RunDir
    from opsynth.verdicts import group_by_task

    chunk = sizable()[:3]
    cfg = cfg.with_section("filters", window_ms_cpu=(1000.0, 2000.0))
    found: dict = {}
    paths = (("two_stage", False, False), ("pipelined", True, False), ("inline", True, True))
    for path, pipelined, inline in paths:
        run_cfg = cfg.with_section("sizing", pipelined=pipelined, inline=inline)
        jobs = pool.pool.stats["candidates"] if pool.pool else 0
        final, _, verdicts = size_and_filter(
            RunDir.create(Path(out) / f"too_fast_{path}"),
            run_cfg,
            chunk,
            "cpu",
            pool,
            WorkLedger(),
            progress,
            list(chunk),
            [],
        )
        rows = group_by_task(verdicts)
        found[path] = {
            "verdicts": [[(v.stage, v.passed, v.reason) for v in rows[t.id]] for t in final],
            "details": [rows[t.id][-1].detail for t in final],
            "jobs": pool.pool.stats["candidates"] - jobs,
        }
    return found


def ahead_of_time(out: str, cfg: RunConfig, pool, progress) -> dict:
    """Two chunks inline on one pool, the second's first jobs started while the first's last
    ones run (``flows.size_screen.Prefetch``): the second chunk's result, the jobs both ran
    and how many of them the second took over from the first."""
    from opsynth.flows.regenerate import size_and_filter
    from opsynth.flows.size_screen import AHEAD_SUFFIX, STAGE
    from opsynth.flows.stages import WorkLedger
    from opsynth.store import RunDir
    from opsynth.verdicts import group_by_task

    run_cfg = cfg.with_section("sizing", pipelined=True, inline=True)
    run, ledger = RunDir.create(Path(out) / "ahead"), WorkLedger()
    first, second = tasks(), sizable() + twins()
    jobs = pool.pool.stats["candidates"]
    _, candidates, verdicts = size_and_filter(
        run, run_cfg, first, "cpu", pool, ledger, progress, first + second, [], None, second
    )
    final, _, verdicts = size_and_filter(
        run, run_cfg, second, "cpu", pool, ledger, progress, candidates, verdicts
    )
    rows = group_by_task(verdicts)
    return {
        "final": [[t.id, t.meta.get("sizing")] for t in final],
        "verdicts": {
            t.id: [(v.stage, v.passed, v.reason) for v in rows.get(t.id, [])] for t in final
        },
        "jobs": pool.pool.stats["candidates"] - jobs,
        "taken_over": ledger.computed.get(STAGE + AHEAD_SUFFIX, 0),
    }


def as_given(out: str, cfg: RunConfig, pool, progress) -> dict:
    """The chunk's tasks that the two-stage path leaves unsized (no size constant, rejected
    statically, or a twin whose sized code the other took) as an audit checks them, sizing
    off, pipelined in two chunks on one pool (the second's first jobs started ahead): their
    verdicts and the jobs the pool ran."""
    from opsynth.flows.audit import as_given as audit_settings
    from opsynth.flows.size_screen import AHEAD_SUFFIX, AS_GIVEN, size_and_screen
    from opsynth.flows.stages import WorkLedger
    from opsynth.store import RunDir

    run_cfg = audit_settings(cfg.with_section("sizing", pipelined=True))
    run, ledger = RunDir.create(Path(out) / "as_given"), WorkLedger()
    first, second = [sizable()[3], forbidden()], [twins()[1], *tasks()]
    jobs = pool.pool.stats["candidates"]
    rows = size_and_screen(run, run_cfg, first, "cpu", pool, ledger, progress, set(), None, second)[
        1
    ]
    rows += size_and_screen(run, run_cfg, second, "cpu", pool, ledger, progress, set())[1]
    verdicts: dict[str, list] = {}
    for v in rows:
        verdicts.setdefault(v.task_id, []).append((v.stage, v.passed, v.reason))
    return {
        "verdicts": verdicts,
        "jobs": pool.pool.stats["candidates"] - jobs,
        "taken_over": ledger.computed.get(AS_GIVEN + AHEAD_SUFFIX, 0),
    }


def abandoned(out: str, cfg: RunConfig, pool, progress) -> dict:
    """A quick task and one whose forward never returns, checked as given with a time limit
    fifteen seconds away and two seconds' overrun allowed: how long the chunk took to stop,
    against the job's own timeout, what the journal kept and what the pool cancelled."""
    from opsynth.deadline import JobLatency
    from opsynth.flows.audit import as_given as audit_settings
    from opsynth.flows.size_screen import JOURNAL_SUFFIX, ChunkStopped, Journal, size_and_screen
    from opsynth.flows.stages import WorkLedger
    from opsynth.store import RunDir

    run_cfg = audit_settings(cfg.with_section("sizing", pipelined=True))
    run = RunDir.create(Path(out) / "abandoned")
    stuck = task_source("while x.numel() > 0:\n            x = x + 0\n        return x")
    chunk = [tasks()[4], Task(ops=["stuck"], data_source="torch#1", code=stuck)]
    kept, pool.latency = pool.latency, JobLatency(overrun_s=2.0)
    cancelled = pool.get().stats["cancelled"]
    started, stopped = time.time(), ""
    try:
        size_and_screen(
            run, run_cfg, chunk, "cpu", pool, WorkLedger(), progress, set(), started + 15
        )
    except ChunkStopped as exc:
        stopped = str(exc)
    finally:
        pool.latency = kept
    [journal] = (run.root / "work").glob(f"*{JOURNAL_SUFFIX}")
    return {
        "stopped": stopped,
        "seconds": round(time.time() - started, 1),
        "job_timeout_s": run_cfg.filters.task_timeout_s + run_cfg.filters.grace_s,
        "journaled": [task_id for job in Journal(journal).done.values() for task_id in job],
        "quick_id": chunk[0].id,
        "cancelled": pool.pool.stats["cancelled"] - cancelled,
    }


def oom_task(tag: str) -> Task:
    """Out of memory in its first forward, whoever else runs; the message states what the
    process held and asked for (2 GiB in all), as torch's does."""
    message = (
        "CUDA out of memory. Tried to allocate 1.00 GiB. Including non-PyTorch memory, "
        "this process has 1.00 GiB memory in use."
    )
    forward = f"raise torch.OutOfMemoryError({message!r})"
    return Task(ops=[tag], data_source="torch#1", code=task_source(forward))


def retried_together(out: str, cfg: RunConfig, progress) -> dict:
    """Two tasks that run out of memory and three cheap ones, inline on a pool of two workers
    that notes each dispatch (task id, candidates already running) and each ``retry_alone``
    call (how many batches it was given), and lets retried tasks whose stated needs fit
    100 GiB share a wave, as a GPU pool's would; then one of each again, past the time
    limit's cutoff once a job has come back."""
    from opsynth.deadline import JobLatency
    from opsynth.filters.pool import WorkerPool
    from opsynth.flows.size_screen import JOURNAL_SUFFIX, ChunkStopped, Journal, size_and_screen
    from opsynth.flows.stages import LazyPool, WorkLedger
    from opsynth.store import RunDir
    from opsynth.verdicts import group_by_task

    class Watched(WorkerPool):
        log: list = []
        retry_calls: list = []

        def _dispatch(self, worker, task, ticket):
            running = sum(1 for w in self._workers if w is not None and w.state == "busy")
            self.log.append((task.id, running))
            return super()._dispatch(worker, task, ticket)

        def retry_alone(self, tickets):
            self.retry_calls.append(len(tickets))
            return super().retry_alone(tickets)

        def _retry_budget_gib(self) -> float:
            return 100.0

    class LateOnceAJobCameBack(JobLatency):
        """A clock-free cutoff: the limit until a job's latency is known, then long past."""

        def cutoff(self, stop_at: float | None) -> float | None:
            return 0.0 if self.seconds else stop_at

    run_cfg = cfg.with_section("sizing", pipelined=True, inline=True)
    run_cfg = run_cfg.with_section("filters", workers=2)
    ooms, others = [oom_task("a"), oom_task("b")], tasks()[:3]
    chunk = [ooms[0], *others, ooms[1]]
    lazy = LazyPool(run_cfg, "cpu")
    with Watched(run_cfg.filters, "cpu") as pool:
        lazy.pool = pool
        run = RunDir.create(Path(out) / "retried")
        _, rows = size_and_screen(run, run_cfg, chunk, "cpu", lazy, WorkLedger(), progress, set())
        stats, calls, log = dict(pool.stats), list(pool.retry_calls), list(pool.log)
        # again (one of each kind), with the time limit's cutoff passed once a job has come
        # back: the set-aside job is not retried (nor journaled) and the chunk stops
        lazy.latency = LateOnceAJobCameBack()
        late = RunDir.create(Path(out) / "retried_late")
        pair = [ooms[0], others[0]]
        try:
            size_and_screen(
                late, run_cfg, pair, "cpu", lazy, WorkLedger(), progress, set(), time.time() + 3600
            )
            stopped = ""
        except ChunkStopped as stop:
            stopped = str(stop)
        [journal] = (late.root / "work").glob(f"*{JOURNAL_SUFFIX}")
        late_journaled = sorted(
            {task_id for results in Journal(journal).done.values() for task_id in results}
        )
    last = {task_id: found[-1] for task_id, found in group_by_task(rows).items()}
    return {
        "ooms": [t.id for t in ooms],
        "others": [t.id for t in others],
        "log": log,
        "retry_calls": calls,
        "retried_alone": stats["retried_alone"],
        "late_retry_calls": pool.retry_calls[len(calls) :],
        "late_stopped": stopped,
        "late_journaled": late_journaled,
        "last": {
            task_id: [row.reason, row.measures.get("first_run")] for task_id, row in last.items()
        },
    }


class Interrupted(Exception):
    """The run is stopped mid-chunk, as a kill would stop it."""


def resumed(out: str, cfg: RunConfig, chunk: list[Task], progress) -> dict:
    """The chunk inline with a time limit a minute away but jobs known to take an hour (none
    starts), with a time limit two seconds away (it stops by itself), then again,
    interrupted once three more jobs are journaled (the pool closed, as a killed run's would
    be), then resumed on a fresh pool from the chunk's journal: what ran and what the journal
    held at each step, what the last pool ran, and the result."""
    from opsynth.deadline import JobLatency
    from opsynth.flows.regenerate import size_and_filter
    from opsynth.flows.size_screen import JOBS_SUFFIX, JOURNAL_SUFFIX, STAGE, ChunkStopped, Journal
    from opsynth.flows.stages import LazyPool, WorkLedger, prefilter_stage
    from opsynth.store import RunDir
    from opsynth.verdicts import group_by_task

    run_cfg = cfg.with_section("sizing", pipelined=True, inline=True)
    run = RunDir.create(Path(out) / "resumed")
    held_limited = 0

    def journaled() -> int:
        found = list((run.root / "work").glob(f"*{JOURNAL_SUFFIX}"))
        return len(Journal(found[0]).done) if found else 0

    def interrupting(stage: str, done: int, total: int) -> None:
        progress(stage, done, total)
        if stage == "size_filter" and journaled() >= held_limited + 3:
            raise Interrupted

    def chunk_run(pool, ledger, report, stop_at=None):
        return size_and_filter(
            run, run_cfg, chunk, "cpu", pool, ledger, report, list(chunk), [], stop_at
        )

    first = LazyPool(run_cfg, "cpu")
    first.get()  # started, and the chunk prefiltered: the limit is about candidates alone
    prefilter_stage(run, run_cfg, chunk, WorkLedger())
    try:
        # jobs known to take an hour: with a minute left, none starts, none runs
        first.latency = JobLatency([3600.0])
        try:
            chunk_run(first, WorkLedger(), progress, time.time() + 60.0)
            raise AssertionError("a job started that could not end by the time limit")
        except ChunkStopped:
            ran_reserved, held_reserved = first.pool.stats["candidates"], journaled()
        first.latency = JobLatency()
        try:
            chunk_run(first, WorkLedger(), progress, time.time() + 2.0)
            raise AssertionError("the chunk did not stop at its time limit")
        except ChunkStopped:
            ran_limited, held_limited = first.pool.stats["candidates"], journaled()
        chunk_run(first, WorkLedger(), interrupting)
        raise AssertionError("the chunk was not interrupted")
    except Interrupted:
        pass
    finally:
        ran_first = first.close()["candidates"]
    [journal] = (run.root / "work").glob(f"*{JOURNAL_SUFFIX}")
    held = journaled()
    second, ledger = LazyPool(run_cfg, "cpu"), WorkLedger()
    try:
        final, _, verdicts = chunk_run(second, ledger, progress)
    finally:
        ran_second = second.close()["candidates"]
    rows = group_by_task(verdicts)
    return {
        "ran_reserved": ran_reserved,
        "journaled_reserved": held_reserved,
        "ran_limited": ran_limited,
        "journaled_limited": held_limited,
        "ran_first": ran_first,
        "journaled": held,
        "replayed": ledger.reused.get(STAGE + JOBS_SUFFIX, 0),
        "ran_second": ran_second,
        "journal_left": journal.exists(),
        "final": [[t.id, t.meta.get("sizing")] for t in final],
        "verdicts": {
            t.id: [(v.stage, v.passed, v.reason) for v in rows.get(t.id, [])] for t in final
        },
    }


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
        allow_unsafe=True,
        # No lower edge: the twin filtered as composed runs near 0.1 ms here, and on a busy
        # 2-core host one path read it inside the window, the other below it.
        window_ms_cpu=(0.0, 1000.0),
    )
    # Probes time as many runs as verdicts: a median of 3 on a busy 2-core host once read 8
    # rows as slow as 256 do in a process that sizes inline (no page faults there), so the
    # paths' choices differed by noise alone.
    cfg = cfg.with_section(
        "sizing", max_steps=1, max_value=4096, probe_warmup_runs=3, probe_timed_runs=10
    )
    return cfg.with_section("runner", kind=kind, workers=2)


def main(out: str, kind: str, what: str = "screen") -> None:
    configure_prefect(Path(out).resolve() / ".prefect")
    from prefect import flow

    from opsynth.flows.runners import LocalOnly, task_runner
    from opsynth.flows.stages import LazyPool, WorkLedger, screen, size_stage
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
        result: dict = {}
        if what == "pipelined":
            return both_paths(out, cfg, progress)
        try:
            if what in ("size", "both"):
                sized = size_stage(run, cfg, sizable(), "cpu", pool, ledger, progress)
                result["steps"] = [t.meta["sizing"]["steps"] for t in sized]
                # whether sizing alone started the orchestrator's own pool
                result["orchestrator_pool_started"] = pool.pool is not None
            if what in ("screen", "both"):
                before = dict(ledger.computed)
                verdicts = screen(run, cfg, tasks(), "cpu", pool, ledger, progress)
                result["verdicts"] = [(v.task_id, v.stage, v.passed, v.reason) for v in verdicts]
                computed = {k: n - before.get(k, 0) for k, n in ledger.computed.items()}
                result["computed"] = {k: n for k, n in computed.items() if n}
                result["reused"] = ledger.reused
                result["progress"] = len(reports)
        finally:
            result["pool_stats"] = pool.close()
        return result

    engine = task_runner(cfg.runner, "cpu", cfg.filters)
    runnable = screen_flow.with_options(task_runner=engine) if engine else screen_flow
    print(json.dumps(runnable(LocalOnly(progress))))


if __name__ == "__main__":
    main(*sys.argv[1:4])
