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
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from opsynth.config import FiltersConfig
from opsynth.filters import compile_cache, privilege, protocol, reasons, sandbox
from opsynth.filters import harness as harnesses
from opsynth.filters.pool_retry import RetryAlone
from opsynth.record import Task, Verdict

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]


class Job(Protocol):
    """What a worker evaluates: a Task, or any object with an id and code (and files)."""

    id: str
    code: str


# Consecutive worker start failures after which the pool gives up instead of retrying forever.
MAX_START_FAILURES = 3
# Largest protocol line accepted from a worker (a verdict row is a few KB).
MAX_LINE_BYTES = 16 << 20
# Seconds a retired worker gets to exit on its own before it is killed.
RETIRE_S = 10.0
# The sizing probe: build and run the model, then time it; nothing else.
MEASURE_STAGES = ("eager", "runtime")
# A sizing probe's check settings: eager and the timed runs only, no window.
MEASURE_OVERRIDES: dict[str, Any] = {"stages": list(MEASURE_STAGES), "window_ms": [0.0, 1e300]}


def measure_overrides(warmup_runs: int, timed_runs: int) -> dict[str, Any]:
    """A sizing probe's check settings with its own run counts: a probe needs far less
    precision than a verdict, and each timed run holds the GPU exclusively."""
    return {**MEASURE_OVERRIDES, "warmup_runs": warmup_runs, "timed_runs": timed_runs}


# The trusted compile-cache warm-up: a cold precompiled header plus a few compiles.
WARMUP_TIMEOUT_S = 300.0
# Host-wide (per user) dir of per-GPU timing locks, shared by every pool on the host.
LOCK_DIR = os.path.join(tempfile.gettempdir(), f"opsynth-gpu-locks-{os.getuid()}")
UNSAFE_HINT = (
    "install bubblewrap (and libseccomp2), or allow unsandboxed execution with --unsafe "
    "(filters.allow_unsafe = true)"
)


@dataclass(eq=False)
class Ticket:
    """A queued batch: its jobs by id, what its check settings change from the pool's (the
    pool's own are known once it has started), and the verdicts gathered so far (filled by
    whichever call drives the pool)."""

    jobs: dict[str, Job]
    overrides: dict[str, Any]
    progress: Progress | None = None
    results: dict[str, list[Verdict]] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return len(self.results) >= len(self.jobs)


class PoolError(RuntimeError):
    """The pool cannot run candidates at all (no worker starts)."""


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a GPU, else ``cpu``. Only asks torch whether CUDA is
    available; the orchestrator never creates a context or runs candidate code. The one device
    resolver: the CLI's (``flows.cli_common``) adds only its one-line errors and remote
    clusters."""
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, not {device!r}")
    if device == "cpu":
        return "cpu"
    import torch

    available = torch.cuda.is_available()
    if device == "cuda" and not available:
        raise ValueError("device 'cuda' requested but torch sees no CUDA device; use cpu or auto")
    return "cuda" if available else "cpu"


def isolation_problem(cfg: FiltersConfig) -> str:
    """Why untrusted code could not run sandboxed under ``cfg`` (a one-line refusal naming
    the way out), found without starting anything; "" when it can, or unsafe is allowed.
    The pool's start-up probe has the last word."""
    if cfg.allow_unsafe:
        return ""
    if cfg.sandbox == "rlimits":
        return f"sandbox 'rlimits' runs untrusted code unisolated; {UNSAFE_HINT}"
    why = "bwrap is not installed" if not sandbox.bwrap_available() else ""
    why = why or privilege.seccomp_problem()
    return f"the bwrap sandbox is unusable here: {why}; {UNSAFE_HINT}" if why else ""


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "opsynth")


def host_cores() -> int:
    return len(os.sched_getaffinity(0)) or 1


def worker_count(cfg: FiltersConfig, device: str, cores: int, gpus: int) -> int:
    """``cfg.workers``, or derived: host cores / cores_per_worker (cores_per_gpu_worker on
    CUDA), and on CUDA at most ``max_workers_per_gpu`` per GPU but at least one per GPU."""
    if cfg.workers:
        return cfg.workers
    if device == "cuda" and gpus:
        by_cores = max(1, cores // cfg.cores_per_gpu_worker)
        return gpus * max(1, min(cfg.max_workers_per_gpu, by_cores // gpus))
    return max(1, cores // cfg.cores_per_worker)


def visible_gpus() -> list[str]:
    """GPU ids this process may use, in CUDA order (honours CUDA_VISIBLE_DEVICES)."""
    import torch

    count = torch.cuda.device_count()
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None and env.strip():
        ids = [x.strip() for x in env.split(",") if x.strip()]
        return ids[:count]
    return [str(i) for i in range(count)]


def check_settings(
    cfg: FiltersConfig, device: str, *, threads: int, lock_dir: str
) -> dict[str, Any]:
    """The JSON settings a worker and its checks get for every candidate."""
    window = cfg.window_ms(device)
    return {
        "device": device,
        "task_timeout_s": cfg.task_timeout_s,
        "memory_limit_bytes": int(cfg.memory_limit_gb * 2**30),
        "max_processes": cfg.max_processes,
        "output_limit_bytes": cfg.output_limit_kb * 1024,
        "file_size_limit_bytes": cfg.file_size_limit_mb << 20,
        "threads": threads,
        "warmup_runs": cfg.warmup_runs,
        "timed_runs": cfg.timed_runs,
        "window_ms": list(window),
        "speed_factor": cfg.device_speed_factor,
        "compile_atol": cfg.compile_atol,
        "compile_rtol": cfg.compile_rtol,
        "input_draws": cfg.input_draws,
        "distinct_rtol": cfg.distinct_rtol,
        "determinism_atol": cfg.determinism_atol,
        "determinism_rtol": cfg.determinism_rtol,
        "lock_dir": lock_dir,
        "batch_timers": cfg.batch_timers,
        "candidates_per_process": cfg.candidates_per_process(device),
        **({} if cfg.judge else {"stages": list(reasons.STAGES)}),
    }


@dataclass
class _Worker:
    slot: int
    gpu: str | None
    kind: str
    proc: subprocess.Popen[bytes]
    to_fd: int
    from_fd: int
    directory: str
    started_at: float
    state: str = "starting"  # starting -> idle <-> busy -> gone
    info: dict[str, Any] = field(default_factory=dict)
    buffer: bytearray = field(default_factory=bytearray)
    served: int = 0
    task: Job | None = None
    ticket: Ticket | None = None
    deadline: float = 0.0
    stage: str = reasons.STAGES[0]
    stages: tuple[str, ...] = reasons.STAGES
    harness: harnesses.Harness = harnesses.FILTERS
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    child_pid: int | None = None

    @property
    def log_path(self) -> str:
        return os.path.join(self.directory, "worker.log")


class WorkerPool(RetryAlone):
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
        self._workers: list[_Worker | None] = []
        self._retiring: list[tuple[_Worker, float]] = []
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
            count = worker_count(self.cfg, self.device, host_cores(), len(self._gpus))
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

    def _start_with_fallback(self) -> None:
        try:
            self._start_all()
        except PoolError as exc:
            if not (self._kind == "bwrap" and self.cfg.sandbox == "auto"):
                raise
            if not self.cfg.allow_unsafe:
                raise PoolError(f"workers do not start under bwrap: {exc}; {UNSAFE_HINT}") from exc
            log.warning("workers do not start under bwrap (%s); falling back to rlimits", exc)
            self.stats["sandbox_fallback_reason"] = str(exc)
            self._kill_all()
            self._kind = "rlimits"
            self.stats["sandbox"] = "rlimits"
            self._shared_dirs("rlimits")
            self._configure()
            self._start_all()

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

    def _choose_sandbox(self) -> str:
        """bwrap when it works here; rlimits (no isolation of files, network or processes)
        only when the user asked for it or allowed it: untrusted code is never run unsandboxed
        by default."""
        if self.cfg.sandbox == "rlimits":
            refused = isolation_problem(self.cfg)
            if refused:
                raise PoolError(refused)
            kind = "rlimits"
        else:
            self._shared_dirs("bwrap")  # the probe runs with the dirs the workers will have
            why = sandbox.probe_bwrap(
                paths=self._paths(self._root or "/"),
                device=self.device,
                tmp_bytes=self._tmp_bytes(),
                identity=self._identity,
            )
            if why and (self.cfg.sandbox == "bwrap" or not self.cfg.allow_unsafe):
                raise PoolError(f"the bwrap sandbox is unusable here: {why}; {UNSAFE_HINT}")
            if why:
                log.warning("bwrap unusable (%s); workers run with rlimits only", why)
                self.stats["sandbox_fallback_reason"] = why
            kind = "rlimits" if why else "bwrap"
        self.stats["sandbox"] = kind
        return kind

    def _shared_dirs(self, kind: str) -> None:
        """The GPU lock dir the workers of ``kind`` share, owned by the uid the sandbox runs
        as, and (until ``_trusted_layer``) an empty compile-cache layer for the probe.
        Made once per kind: the probe already made the ones its workers use."""
        if self._dirs_for == kind:
            return
        self._dirs_for = kind
        self._identity = (
            privilege.sandbox_identity(self.cfg.sandbox_uid) if kind == "bwrap" else None
        )
        locks = LOCK_DIR
        if self._identity is not None:
            locks = os.path.join(tempfile.gettempdir(), f"opsynth-gpu-locks-{self._identity.uid}")
        privilege.owned_dir(locks, self._identity)
        self._lock_dir = locks
        if not self._paths_cache:  # the probe reads no cache; the layer comes after it
            self._paths_cache = compile_cache.empty_dir(self._cache_base)

    @property
    def _cache_base(self) -> str:
        return self.cfg.cache_dir or default_cache_dir()

    def _trusted_layer(self) -> None:
        """Build the trusted compile-cache layer for this device and library versions if the
        host has none yet (``filters.compile_cache``): a sandboxed warm-up of opsynth's own
        compiles, before any candidate runs. Without it candidates still compile, slower."""
        began = time.monotonic()
        assert self._root is not None
        workdir = os.path.join(self._root, "warm-up")
        os.makedirs(workdir, exist_ok=True)

        def warm(staging: str) -> str:
            return sandbox.run_warmup(
                kind=self._kind,
                paths=sandbox.Paths(cache_dir=staging, lock_dir=self._lock_dir, worker_dir=workdir),
                device=self.device,
                tmp_bytes=self._tmp_bytes(),
                identity=self._identity,
                cuda_visible=self._gpus[0] if self._gpus else None,
                timeout_s=WARMUP_TIMEOUT_S,
            )

        def prepare(staging: str) -> None:
            privilege.owned_dir(staging, self._identity)

        self._paths_cache, problem = compile_cache.ensure_layer(
            self._cache_base, self.device, warm, prepare
        )
        if problem:
            log.warning("no trusted compile cache (%s); candidates compile without one", problem)
        self.stats["compile_cache"] = f"empty: {problem}" if problem else "trusted"
        self.stats["compile_cache_s"] = round(time.monotonic() - began, 3)

    def _configure(self) -> None:
        _, lock_dir = sandbox.visible_paths(self._paths(""), self._kind)
        self._settings = check_settings(
            self.cfg, self.device, threads=self._threads, lock_dir=lock_dir
        )

    def _start_all(self) -> None:
        self._start_failures = 0
        for slot in range(len(self._workers)):
            self._workers[slot] = self._spawn(slot)
        while any(w is not None and w.state == "starting" for w in self._workers):
            self._pump(0.5)
            self._check_deadlines()
            self._refill()

    def _kill_all(self) -> None:
        for worker in self._workers:
            if worker is not None:
                self._kill(worker)
        for worker, _ in self._retiring:
            self._kill(worker)
        self._retiring = []
        self._workers = [None] * len(self._workers)

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

    def wait(self, ticket: Ticket, *, retry: bool = True) -> dict[str, list[Verdict]]:
        """Drive the pool until ``ticket``'s batch is done (from the thread that owns the pool,
        see the module doc); then retry alone what ``retry_alone`` names, unless ``retry`` is
        false: the caller then gathers such batches for one ``retry_alone`` call. Per task id,
        in the batch's order."""
        with self._lock:
            if ticket.jobs:
                self.start()
                self._drive([ticket], len(self._workers))
                if retry:
                    self._retry_alone([ticket])
            return {task_id: ticket.results[task_id] for task_id in ticket.jobs}

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
    ) -> None:
        """Feed queued jobs to idle workers (``only``'s, or any batch's in queue order), at most
        ``parallel`` candidates running at once, until every one of ``tickets`` is done. With
        ``release``, nothing starts before every worker is idle and has let go of its waiting
        processes."""
        while not all(ticket.done for ticket in tickets):
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

    # ------------------------------------------------------------------ workers

    def _paths(self, directory: str) -> sandbox.Paths:
        return sandbox.Paths(
            cache_dir=self._paths_cache, lock_dir=self._lock_dir, worker_dir=directory
        )

    def _tmp_bytes(self) -> int:
        return self.cfg.tmp_size_mb << 20

    def _spawn(self, slot: int) -> _Worker:
        assert self._root is not None
        self._serial += 1
        directory = os.path.join(self._root, f"w{self._serial}")
        os.makedirs(os.path.join(directory, "tmp"), exist_ok=True)
        gpu = self._gpus[slot % len(self._gpus)] if self._gpus else None
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        paths = self._paths(directory)
        try:
            launch = sandbox.launch_command(
                kind=self._kind,
                paths=paths,
                device=self.device,
                tmp_bytes=self._tmp_bytes(),
                in_fd=to_r,
                out_fd=from_w,
                prestart=self.cfg.prestart_child,
                identity=self._identity,
                packages=self._packages,
            )
        except (OSError, privilege.SeccompUnavailable):
            for fd in (to_r, to_w, from_r, from_w):
                os.close(fd)
            raise
        env = sandbox.worker_env(
            paths=paths,
            kind=self._kind,
            threads=self._threads,
            cuda_visible=gpu,
            packages=self._packages,
        )
        try:
            with open(os.path.join(directory, "worker.log"), "wb") as logfile:
                proc = subprocess.Popen(
                    launch.argv,
                    env=env,
                    cwd=directory,
                    pass_fds=(to_r, from_w, *launch.fds),
                    stdin=subprocess.DEVNULL,
                    stdout=logfile,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        finally:
            launch.close()
            os.close(to_r)
            os.close(from_w)
        self.stats["workers_started"] += 1
        return _Worker(
            slot=slot,
            gpu=gpu,
            kind=self._kind,
            proc=proc,
            to_fd=to_w,
            from_fd=from_r,
            directory=directory,
            started_at=time.monotonic(),
        )

    def _refill(self) -> None:
        """Start a replacement in every empty slot; give up after repeated start failures."""
        for slot, worker in enumerate(self._workers):
            if worker is None:
                if self._start_failures >= MAX_START_FAILURES:
                    raise PoolError(self._start_failure_detail)
                self._workers[slot] = self._spawn(slot)
                self.stats["workers_replaced"] += 1
        self._reap_retiring()

    def _dispatch(self, worker: _Worker, task: Job, ticket: Ticket) -> bool:
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

    def _send(self, worker: _Worker, message: dict[str, Any]) -> bool:
        data = (json.dumps(message) + "\n").encode()
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(worker.to_fd, view) :]
        except OSError:
            return False
        return True

    def _pump(self, timeout: float) -> None:
        """Wait up to ``timeout`` for worker output and handle every complete line."""
        live = {w.from_fd: w for w in self._workers if w is not None and w.state != "gone"}
        if not live:
            time.sleep(min(timeout, 0.05))
            return
        ready, _, _ = select.select(list(live), [], [], timeout)
        for fd in ready:
            worker = live[fd]
            for event in self._read(worker, 0):
                self._handle(worker, event)

    def _read(self, worker: _Worker, timeout: float) -> list[dict[str, Any]]:
        """Complete JSON lines available from ``worker``; EOF or garbage replaces it."""
        if worker.state == "gone":
            return []
        ready, _, _ = select.select([worker.from_fd], [], [], timeout)
        if not ready:
            return []
        chunk = os.read(worker.from_fd, 1 << 16)
        if not chunk:
            self._lost(worker, "worker_lost", self._exit_detail(worker))
            return []
        worker.buffer.extend(chunk)
        events = []
        while b"\n" in worker.buffer:
            line, _, rest = bytes(worker.buffer).partition(b"\n")
            worker.buffer[:] = rest
            try:
                event = json.loads(line)
            except ValueError:
                detail = f"worker sent a malformed line: {line[:200]!r}"
                self._lost(worker, "protocol_violation", detail)
                return events
            if isinstance(event, dict):
                events.append(event)
        if len(worker.buffer) > MAX_LINE_BYTES:
            self._lost(worker, "worker_lost", "worker sent an oversized line")
        return events

    def _handle(self, worker: _Worker, event: dict[str, Any]) -> None:
        """Act on one line from ``worker``. Everything in it is untrusted (the worker shares
        the candidate's sandbox): a line that breaks the protocol is the candidate's
        ``protocol_violation``, and its worker is replaced."""
        problem = self._event_problem(worker, event)
        if not problem:
            try:
                self._apply(worker, event)
                return
            except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as exc:
                problem = f"{type(exc).__name__}: {exc}"[:500]
        if worker.state == "starting":
            self._start_failed(worker, f"protocol violation: {problem}")
        else:
            self._lost(worker, "protocol_violation", problem)

    def _event_problem(self, worker: _Worker, event: dict[str, Any]) -> str:
        """Why ``event`` is not a line this worker may send now; "" when it is."""
        kind = event.get("event")
        if worker.task is None or event.get("task_id") != worker.task.id:
            return ""  # not about the running candidate: ignored by ``_apply``
        done = len(worker.verdicts)
        expected = worker.stages[done] if done < len(worker.stages) else None
        if kind == "verdict":
            return protocol.row_problem(event.get("verdict"), expected, worker.harness)
        if kind == "started" and not isinstance(event.get("pid"), int):
            return "'started' without an integer pid"
        if kind == "stage" and event.get("stage") not in worker.stages:
            return f"unknown stage {event.get('stage')!r}"
        if kind == "result":
            rows = event.get("verdicts")
            if not isinstance(rows, list) or len(rows) > len(worker.stages):
                return "'verdicts' must be a list with at most one row per stage"
            for stage, row in zip(worker.stages, rows, strict=False):
                problem = protocol.row_problem(row, stage, worker.harness)
                if problem:
                    return problem
            prepare_s = event.get("prepare_s") or 0.0
            if not isinstance(prepare_s, (int, float)) or not 0 <= prepare_s < 1e6:
                return f"'prepare_s' out of range: {prepare_s!r}"[:200]
        return ""

    def _apply(self, worker: _Worker, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "ready":
            if event.get("error"):
                self._start_failed(worker, str(event["error"]))
                return
            worker.info = event
            worker.state = "idle"
            self._start_failures = 0
            for key in ("device_name", "torch_version", "cuda_version"):
                self.stats[key] = event.get(key) or self.stats.get(key)
            if isinstance(event.get("preimported"), int):
                self.stats["preimported"] = event["preimported"]
            if isinstance(event.get("vec_isa"), int):
                self.stats["vec_isa"] = event["vec_isa"]
            return
        if kind == "released":
            if worker.state == "releasing":
                worker.state = "idle"
                self.stats["retry_released"] += int(event.get("count") or 0)
            return
        if worker.task is None or event.get("task_id") != worker.task.id:
            return
        if kind == "stage":
            worker.stage = str(event.get("stage", worker.stage))
        elif kind == "verdict":
            worker.verdicts.append(event["verdict"])
        elif kind == "started":
            worker.child_pid = int(event.get("pid") or 0) or None
        elif kind == "result":
            child = f"child_{event.get('child')}"
            if child in self.stats:
                self.stats[child] += 1
            if event.get("retired"):
                _count_retirement(self.stats["child_retired"], str(event["retired"]))
            self.stats["audit_prepare_s"] += float(event.get("prepare_s") or 0.0)
            self._finish(worker, list(event.get("verdicts") or []))
            worker.served += 1
            worker.state = "idle"
            if event.get("replace") or worker.served >= self.cfg.recycle_after:
                self._replace(worker)

    def _finish(self, worker: _Worker, rows: list[dict[str, Any]]) -> None:
        assert worker.task is not None and worker.ticket is not None
        task_id, ticket = worker.task.id, worker.ticket
        worker.task = worker.ticket = None
        self.stats["candidates"] += 1
        self.stats["last_result_at"] = time.time()
        self.stats["first_result_at"] = (
            self.stats["first_result_at"] or self.stats["last_result_at"]
        )
        device = f"{self.device}:{worker.info.get('device_name', '')}"
        torch_version = str(worker.info.get("torch_version", ""))
        verdicts = [
            Verdict(
                task_id=task_id,
                stage=str(row.get("stage", "")),
                passed=bool(row.get("passed")),
                reason=str(row.get("reason", "")),
                detail=str(row.get("detail", ""))[:2000],
                measures=dict(row.get("measures") or {}),
                device=device,
                torch_version=torch_version,
                elapsed_s=float(row.get("elapsed_s") or 0.0),
            )
            for row in rows
        ]
        self._finished.append((ticket, task_id, verdicts))

    def _lost(self, worker: _Worker, reason: str, detail: str) -> None:
        """The worker is gone or hung: its candidate gets ``reason`` at the running stage."""
        if worker.state == "starting":
            self._start_failed(worker, detail)
            return
        if worker.task is not None:
            rows = list(worker.verdicts)
            if not rows or rows[-1].get("passed"):
                stage = worker.stage
                if rows and rows[-1].get("stage") == stage and len(rows) < len(worker.stages):
                    stage = worker.stages[len(rows)]
                rows.append({"stage": stage, "passed": False, "reason": reason, "detail": detail})
            self._finish(worker, rows)
        self._replace(worker)

    def _start_failed(self, worker: _Worker, detail: str) -> None:
        self._start_failures += 1
        tail = _tail(worker.log_path)
        self._start_failure_detail = f"worker failed to start ({worker.kind}): {detail}" + (
            f"; log: {tail}" if tail else ""
        )
        log.warning(self._start_failure_detail)
        self._replace(worker)
        if self._start_failures >= MAX_START_FAILURES:
            raise PoolError(self._start_failure_detail)

    def _replace(self, worker: _Worker) -> None:
        """Retire ``worker``; ``_refill`` starts its replacement."""
        if worker.state == "gone":
            return
        self._retire(worker)
        if 0 <= worker.slot < len(self._workers) and self._workers[worker.slot] is worker:
            self._workers[worker.slot] = None

    def _retire(self, worker: _Worker) -> None:
        if worker.state == "gone":
            return
        if worker.state == "idle":
            self._send(worker, {"op": "exit"})
        else:
            self._kill(worker)
        worker.state = "gone"
        for fd in (worker.to_fd, worker.from_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._retiring.append((worker, time.monotonic()))

    def _kill(self, worker: _Worker) -> None:
        """Kill the worker's process group (bwrap: its namespace goes with it) and, outside
        bwrap, the candidate's own session, which a worker's death does not reach."""
        if worker.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(worker.proc.pid, signal.SIGKILL)
        if worker.kind != "bwrap" and worker.child_pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(worker.child_pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.proc.wait(timeout=5)

    def _reap_retiring(self) -> None:
        now = time.monotonic()
        keep = []
        for worker, since in self._retiring:
            if worker.proc.poll() is not None:
                continue
            if now - since > RETIRE_S:
                self._kill(worker)
                continue
            keep.append((worker, since))
        self._retiring = keep

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for worker in list(self._workers):
            if worker is None or worker.state == "gone":
                continue
            if worker.state == "starting" and now - worker.started_at > self.cfg.start_timeout_s:
                self._start_failed(
                    worker, f"not ready within start_timeout_s={self.cfg.start_timeout_s:g}"
                )
            elif worker.state == "busy" and now > worker.deadline:
                limit = self.cfg.task_timeout_s + self.cfg.grace_s
                self._lost(worker, "timeout", f"worker did not answer within {limit:g} s")
            elif worker.proc.poll() is not None and worker.state != "busy":
                self._lost(worker, "worker_lost", self._exit_detail(worker))

    def _exit_detail(self, worker: _Worker) -> str:
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.proc.wait(timeout=1)
        code = worker.proc.returncode
        if code is None:
            return "worker closed its pipe"
        if code < 0:
            return f"worker killed by {_signal_name(-code)}"
        return f"worker exited with status {code}"


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


def _tail(path: str, limit: int = 1500) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - limit))
            return fh.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _count_retirement(counts: dict[str, int], finding: str, distinct: int = 20) -> None:
    """Count a retired process under its audit finding, numbers masked so that findings of
    one kind add up; past ``distinct`` kinds the rest count as "other"."""
    key = re.sub(r"\b\d+\b", "N", finding)[:120]
    if key not in counts and len(counts) >= distinct:
        key = "other"
    counts[key] = counts.get(key, 0) + 1
