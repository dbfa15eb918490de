"""Orchestrator side of the sandboxed worker pool: start, feed, watch and replace workers.

The orchestrator never runs candidate code. It starts ``workers`` sandboxed worker processes
(``filters.sandbox``), sends each a candidate at a time as a JSON line over a private pipe, and
collects the verdict rows the worker streams back. A worker that dies (a candidate killed it),
stops answering within ``task_timeout_s + grace_s``, reports a CUDA error, or has served
``recycle_after`` candidates is replaced; the candidate it was running gets a verdict for the
stage it was in (``worker_lost`` / ``timeout``). Everything runs on the calling thread with one
``select`` loop, one call at a time (a lock serialises callers). Batches can be queued ahead
with ``submit`` from any thread; whichever call is driving the pool hands their candidates to
workers that its own batch leaves idle, so consecutive shards do not each end with idle workers
waiting for the shard's slowest candidate. bwrap's ``--die-with-parent``
ties each worker to the thread that started it (Linux's parent-death signal is per thread):
use a pool from threads that outlive it, e.g. the main thread or a long-lived executor's.

Here: ``WorkerPool``, its start and close, its batches and the loop that drives them. Its
other concerns are mixins of their own: the sandbox and the shared dirs
(``filters.pool_sandbox``), the worker processes' lifecycle (``filters.pool_workers``), the
protocol with them (``filters.pool_events``) and out-of-memory re-runs
(``filters.pool_retry``); what is settled before a worker starts (the device, the worker
count, the check settings) is ``filters.pool_setup``, the records they share
``filters.pool_types``.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

from opsynth.config import FiltersConfig
from opsynth.filters import harness as harnesses
from opsynth.filters import privilege, sandbox
from opsynth.filters.pool_events import WorkerEvents
from opsynth.filters.pool_retry import RetryAlone
from opsynth.filters.pool_sandbox import SandboxChoice
from opsynth.filters.pool_setup import (
    LOCK_DIR,
    MEASURE_OVERRIDES,
    check_settings,
    gpu_memory_gib,
    host_cores,
    isolation_problem,
    job_stages,
    measure_overrides,
    resolve_device,
    visible_gpus,
    worker_count,
)
from opsynth.filters.pool_types import Job, PoolError, Progress, Ticket, WorkerProcess
from opsynth.filters.pool_workers import WorkerLifecycle
from opsynth.record import Task, Verdict

# The pool's names as its users import them (``from opsynth.filters.pool import ...``).
__all__ = [
    "LOCK_DIR",
    "MEASURE_OVERRIDES",
    "Job",
    "PoolError",
    "Progress",
    "Ticket",
    "WorkerPool",
    "check_settings",
    "host_cores",
    "isolation_problem",
    "job_stages",
    "measure_overrides",
    "resolve_device",
    "visible_gpus",
    "worker_count",
]


class WorkerPool(RetryAlone, SandboxChoice, WorkerLifecycle, WorkerEvents):
    """A pool of sandboxed warm workers; use as a context manager.

    ``evaluate(tasks)`` runs every task through the execution stages on the workers
    concurrently and returns, per task id, the verdict rows in stage order up to and including
    the first failure. ``stats`` describes the sandbox, device, versions and worker churn.
    """

    def __init__(
        self, cfg: FiltersConfig, device: str = "auto", gpus: list[str] | None = None
    ) -> None:
        """``gpus``: the GPU ids to spread workers over; None = every visible GPU."""
        self.cfg = cfg
        self.device = resolve_device(device)
        self._given_gpus = gpus
        self.stats: dict[str, Any] = {
            "sandbox": None,
            "device": self.device,
            "device_name": None,
            "torch_version": None,
            "cuda_version": None,
            "workers": 0,
            "workers_started": 0,
            # The smallest GPU's memory, GiB (nvidia-smi), where it bounded a derived worker
            # count (``filters.gib_per_gpu_worker``); None otherwise.
            "gpu_gib": None,
            # When start() began (epoch seconds) and how long it took until every worker was
            # ready: lined up with the verdicts' times, where a run's start-up went.
            "started_at": None,
            "start_s": None,
            "workers_replaced": 0,
            # Modules a worker imported before forking candidates, as the trusted compile
            # layer named them (filters.compile_cache.preimport); 0 without a layer.
            "preimported": 0,
            # Vector instruction sets a worker took from the trusted layer's record instead of
            # probing them per candidate (filters.compile_cache.adopt_vec_isa); -1 = probed.
            "vec_isa": -1,
            "candidates": 0,
            # When the first and the latest candidate finished (epoch seconds): with several
            # pools on one run, whether one ran on after the others had nothing left.
            "first_result_at": None,
            "last_result_at": None,
            "retried_alone": 0,
            "retried_alone_s": 0.0,
            # Running jobs stopped because their caller gave up on them (``cancel``, at a
            # time limit): their workers were replaced.
            "cancelled": 0,
            # Waiting processes (prestarted or kept, each with its CUDA context) killed so that
            # a retried task had the device to itself.
            "retry_released": 0,
            # How each candidate's process was started (filters.worker, ``last_child``).
            "child_prestarted": 0,
            "child_fresh": 0,
            "child_replaced": 0,
            "child_refused": 0,
            "child_unresponsive": 0,
            "child_reused": 0,
            # Seconds candidates waited for their process's audit baseline (the tiny compile a
            # reusable process does first).
            "audit_prepare_s": 0.0,
            # Processes that could have taken a further candidate (candidates_per_process_*) but
            # were retired, by the audit's first finding with numbers masked.
            "child_retired": {},
        }
        self._workers: list[WorkerProcess | None] = []
        self._retiring: list[tuple[WorkerProcess, float]] = []
        self._root: str | None = None
        self._kind = "rlimits"
        self._gpus: list[str] = []
        self._threads = 1
        self._settings: dict[str, Any] = {}
        self._paths_cache = ""
        self._lock_dir = LOCK_DIR
        self._identity: privilege.Identity | None = None
        # What the workers' sandbox binds: the filters, the evaluator and, once the workers
        # start, every harness registered by then (``filters.harness``).
        self._packages = sandbox.SANDBOX_PACKAGES
        self._dirs_for = ""  # the sandbox kind the shared dirs were made for
        self._start_failures = 0
        self._start_failure_detail = ""
        self._serial = 0
        self._finished: list[tuple[Ticket, str, list[Verdict]]] = []
        # Queued (batch, job) pairs, FIFO; any thread may queue, only the driving call takes.
        self._queue: deque[tuple[Ticket, Job]] = deque()
        self._queue_lock = threading.Lock()
        # One caller at a time: the pool already runs a call's tasks concurrently.
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> WorkerPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Choose the sandbox, start every worker and wait until all are ready."""
        with self._lock:
            if self._root is None:
                self._start()

    def _start(self) -> None:
        self._root = tempfile.mkdtemp(prefix="opsynth-pool-")
        self.stats["started_at"] = time.time()  # unrounded: compared with other clocks
        began = time.monotonic()
        try:
            gpus = self._given_gpus if self._given_gpus is not None else visible_gpus()
            self._gpus = gpus if self.device == "cuda" else []
            if self._gpus and not self.cfg.workers and self.cfg.gib_per_gpu_worker:
                self.stats["gpu_gib"] = gpu_memory_gib(self._gpus)  # it bounds the count
            count = worker_count(
                self.cfg, self.device, host_cores(), len(self._gpus), self.stats["gpu_gib"]
            )
            self._threads = max(1, host_cores() // count)
            self._kind = self._choose_sandbox()
            self._packages = harnesses.packages(sandbox.SANDBOX_PACKAGES)
            self._shared_dirs(self._kind)
            self._trusted_layer()
            self._configure()
            self._workers = [None] * count
            self.stats["workers"] = count
            self._start_with_fallback()
            self.stats["start_s"] = round(time.monotonic() - began, 3)
        except BaseException:
            self._close()
            raise

    def close(self) -> None:
        """Ask workers to exit, kill the ones that do not, remove the pool's temp dir."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        for worker in self._workers:
            if worker is not None:
                if worker.task is not None and worker.ticket is not None:
                    # a queued-ahead batch's candidate, cut short: run again if it is waited for
                    with self._queue_lock:
                        self._queue.appendleft((worker.ticket, worker.task))
                    worker.task = worker.ticket = None
                self._retire(worker)
        deadline = time.monotonic() + 2.0
        for worker, _ in self._retiring:
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        self._kill_all()
        self._workers = []
        if self._root:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    # ------------------------------------------------------------------ public API

    def evaluate(
        self, tasks: Iterable[Task], progress: Progress | None = None
    ) -> dict[str, list[Verdict]]:
        """Verdict rows per task id (execution stages in order, up to the first failure).
        Tasks with the same id are evaluated once. ``progress(done, total)`` is called after
        each finished task. Calls from several threads are serialised."""
        return self.wait(self.submit(tasks, progress))

    def submit(
        self,
        jobs: Iterable[Job],
        progress: Progress | None = None,
        overrides: dict[str, Any] | None = None,
    ) -> Ticket:
        """Queue a batch without waiting (any thread); ``wait`` returns its verdicts. A call
        already driving the pool starts these jobs on workers its own batch leaves idle."""
        unique: dict[str, Job] = {}
        for job in jobs:
            unique.setdefault(job.id, job)
        ticket = Ticket(unique, dict(overrides or {}), progress)
        with self._queue_lock:
            self._queue.extend((ticket, job) for job in unique.values())
        return ticket

    def wait(
        self, ticket: Ticket, *, retry: bool = True, until: float | None = None
    ) -> dict[str, list[Verdict]]:
        """Drive the pool until ``ticket``'s batch is done (from the thread that owns the pool,
        see the module doc); then retry alone what ``retry_alone`` names, unless ``retry`` is
        false: the caller then gathers such batches for one ``retry_alone`` call. Per task id,
        in the batch's order. ``until`` (seconds since the epoch): stop driving then, done or
        not; ``ticket.done`` says which, and the verdicts so far are returned (a caller that
        gives up on the rest withdraws them with ``cancel``)."""
        with self._lock:
            if ticket.jobs:
                self.start()
                self._drive([ticket], len(self._workers), until=until)
                if retry and ticket.done:
                    self._retry_alone([ticket])
            return {t: ticket.results[t] for t in ticket.jobs if t in ticket.results}

    def cancel(self, tickets: list[Ticket]) -> int:
        """Withdraw these batches' queued jobs and stop their running ones (each such worker is
        killed and replaced), so that a caller that stops waiting, at a time limit, leaves
        nothing of theirs on the pool. How many running jobs were stopped."""
        with self._lock:
            with self._queue_lock:
                kept = [item for item in self._queue if not any(item[0] is t for t in tickets)]
                self._queue.clear()
                self._queue.extend(kept)
            stopped = 0
            for worker in list(self._workers):
                if worker is not None and any(worker.ticket is t for t in tickets):
                    worker.task = worker.ticket = None
                    self._replace(worker)
                    stopped += 1
            self.stats["cancelled"] += stopped
            return stopped

    def retry_alone(self, tickets: list[Ticket]) -> None:
        """Retry alone, together, the finished batches' tasks whose verdict ``retry_alone``
        names (``filters.pool_retry``); their results are updated in place."""
        with self._lock:
            self._retry_alone(tickets)

    def measure(
        self, tasks: Iterable[Task], overrides: dict[str, Any] | None = None
    ) -> dict[str, list[Verdict]]:
        """Run only eager and the timed runs (no window, no compile): the sizing probe
        (``overrides``: ``measure_overrides``' run counts, else the filters'). The ``runtime``
        row's ``eager_ms_median``/``scaled_ms`` are the measurement; these rows are not
        filter verdicts."""
        return self.wait(self.submit(tasks, None, overrides or MEASURE_OVERRIDES))

    def run_harness(
        self,
        jobs: Iterable[Job],
        harness: str,
        overrides: dict[str, Any],
        progress: Progress | None = None,
    ) -> dict[str, list[Verdict]]:
        """Run another registered sandboxed harness (``filters.harness``) over jobs: anything
        with an ``id``, the ``code`` written to candidate.py and ``files`` (relative path ->
        text) written beside it. ``overrides`` replace this pool's check settings for these
        jobs. An unknown harness or stage list fails here, not in every worker."""
        found = harnesses.lookup(harness)
        started = self._root is not None
        if started and found.package not in self._packages:
            raise ValueError(
                f"harness {harness!r} was registered after this pool started: its package "
                f"{found.package!r} is not in the workers' sandbox; start the pool after"
            )
        overrides = {
            "stages": list(found.stages),
            **overrides,
            "harness": harness,
            "harness_spec": found.to_json(),
        }
        harnesses.stages_of(overrides, found)
        return self.wait(self.submit(jobs, progress, overrides))

    def _drive(
        self,
        tickets: list[Ticket],
        parallel: int,
        only: list[Ticket] | None = None,
        release: bool = False,
        until: float | None = None,
    ) -> None:
        """Feed queued jobs to idle workers (``only``'s, or any batch's in queue order), at most
        ``parallel`` candidates running at once, until every one of ``tickets`` is done (or
        ``until``, seconds since the epoch, has come). With ``release``, nothing starts before
        every worker is idle and has let go of its waiting processes."""
        while not all(ticket.done for ticket in tickets):
            if until is not None and time.time() >= until:
                return
            busy = sum(1 for w in self._workers if w is not None and w.state == "busy")
            if release and not any(
                w is None or w.state in ("busy", "starting") for w in self._workers
            ):
                self._release_idle()
                release = False
            for worker in self._workers:
                if release or busy >= parallel:
                    break
                if worker is None or worker.state != "idle":
                    continue
                item = self._take(only)
                if item is None:
                    break
                if not self._dispatch(worker, item[1], item[0]):
                    with self._queue_lock:
                        self._queue.appendleft(item)
                    continue
                busy += 1
            self._pump(0.5)
            self._check_deadlines()
            self._refill()
            finished, self._finished = self._finished, []
            for owner, task_id, verdicts in finished:
                owner.results[task_id] = verdicts
                if owner.progress is not None:
                    owner.progress(len(owner.results), len(owner.jobs))
            if any(not t.done and not self._pending(t) for t in tickets):
                raise PoolError("a batch's candidates are neither queued nor running")

    def _pending(self, ticket: Ticket) -> bool:
        """Whether any of ``ticket``'s jobs is queued or running (else waiting is forever)."""
        if any(w is not None and w.ticket is ticket for w in self._workers):
            return True
        with self._queue_lock:
            return any(owner is ticket for owner, _ in self._queue)

    def _take(self, only: list[Ticket] | None) -> tuple[Ticket, Job] | None:
        with self._queue_lock:
            if only is None:
                return self._queue.popleft() if self._queue else None
            for item in self._queue:
                if any(item[0] is ticket for ticket in only):
                    self._queue.remove(item)
                    return item
        return None

    def calibrate(self) -> dict[str, float]:
        """Run ``filters.calibrate.calibration_benchmark`` on this pool's device, in a worker."""
        with self._lock:
            return self._calibrate()

    def _calibrate(self) -> dict[str, float]:
        self.start()
        while True:
            worker = next((w for w in self._workers if w is not None and w.state == "idle"), None)
            if worker is not None:
                break
            self._pump(0.5)
            self._check_deadlines()
            self._refill()
        worker.state = "calibrating"
        self._send(worker, {"op": "calibrate", "settings": self._settings})
        deadline = time.monotonic() + self.cfg.task_timeout_s + self.cfg.grace_s
        while time.monotonic() < deadline:
            for event in self._read(worker, 0.5):
                if event.get("event") == "calibration":
                    worker.state = "idle"
                    if event.get("error"):
                        raise PoolError(f"calibration failed: {event['error']}")
                    return {str(k): float(v) for k, v in event.get("results", {}).items()}
            if worker.state == "gone":
                break
        self._replace(worker)
        raise PoolError("calibration did not finish")

    # ------------------------------------------------------------------ dispatch

    def _dispatch(self, worker: WorkerProcess, task: Job, ticket: Ticket) -> bool:
        settings = {**self._settings, **ticket.overrides}
        worker.state = "busy"
        worker.task = task
        worker.ticket = ticket
        worker.harness = harnesses.of_settings(settings)
        worker.stages = harnesses.stages_of(settings, worker.harness)
        worker.stage = worker.stages[0]
        worker.verdicts = []
        worker.child_pid = None
        timeout = float(settings.get("task_timeout_s", self.cfg.task_timeout_s))
        worker.deadline = time.monotonic() + timeout + self.cfg.grace_s
        message = {
            "op": "eval",
            "task_id": task.id,
            "code": task.code,
            "files": getattr(task, "files", None) or {},
            "settings": settings,
        }
        if self._send(worker, message):
            return True
        worker.task = worker.ticket = None  # never reached it: not the candidate's fault
        self._replace(worker)
        return False
