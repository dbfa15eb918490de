"""The worker pool's worker processes from start to end (a ``WorkerPool`` mixin,
``filters.pool``): spawning one in its sandbox, refilling empty slots, retiring, killing and
reaping, and the deadlines that replace a worker that does not start or does not answer.

Why a worker is retired rather than reused after a failure: it shares its sandbox with the
candidate it ran, so once that candidate broke the protocol, hung or crashed it, nothing it
says is trusted again; its slot gets a fresh one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from typing import Any

from opsynth.config import FiltersConfig
from opsynth.filters import privilege, sandbox
from opsynth.filters.pool_types import PoolError, WorkerProcess, log_path

# Logged under the pool's name: the module its users know (``filters.pool``).
log = logging.getLogger("opsynth.filters.pool")

# Consecutive worker start failures after which the pool gives up instead of retrying forever.
MAX_START_FAILURES = 3
# Seconds a retired worker gets to exit on its own before it is killed.
RETIRE_S = 10.0


class WorkerLifecycle:
    """Start, replace and end the pool's workers. Uses the pool's sandbox (``_paths``,
    ``_tmp_bytes``) and its event handling (``_pump``, ``_send``, ``_lost``)."""

    cfg: FiltersConfig
    device: str
    stats: dict[str, Any]
    _workers: list[WorkerProcess | None]
    _retiring: list[tuple[WorkerProcess, float]]
    _root: str | None
    _kind: str
    _gpus: list[str]
    _threads: int
    _identity: privilege.Identity | None
    _packages: tuple[str, ...]
    _start_failures: int
    _start_failure_detail: str
    _serial: int

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
                kill(worker)
        for worker, _ in self._retiring:
            kill(worker)
        self._retiring = []
        self._workers = [None] * len(self._workers)

    def _spawn(self, slot: int) -> WorkerProcess:
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
            with open(log_path(directory), "wb") as logfile:
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
        return WorkerProcess(
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

    def _start_failed(self, worker: WorkerProcess, detail: str) -> None:
        self._start_failures += 1
        tail = _tail(worker.log_path)
        self._start_failure_detail = f"worker failed to start ({worker.kind}): {detail}" + (
            f"; log: {tail}" if tail else ""
        )
        log.warning(self._start_failure_detail)
        self._replace(worker)
        if self._start_failures >= MAX_START_FAILURES:
            raise PoolError(self._start_failure_detail)

    def _replace(self, worker: WorkerProcess) -> None:
        """Retire ``worker``; ``_refill`` starts its replacement."""
        if worker.state == "gone":
            return
        self._retire(worker)
        if 0 <= worker.slot < len(self._workers) and self._workers[worker.slot] is worker:
            self._workers[worker.slot] = None

    def _retire(self, worker: WorkerProcess) -> None:
        if worker.state == "gone":
            return
        if worker.state == "idle":
            self._send(worker, {"op": "exit"})
        else:
            kill(worker)
        worker.state = "gone"
        for fd in (worker.to_fd, worker.from_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._retiring.append((worker, time.monotonic()))

    def _reap_retiring(self) -> None:
        now = time.monotonic()
        keep = []
        for worker, since in self._retiring:
            if worker.proc.poll() is not None:
                continue
            if now - since > RETIRE_S:
                kill(worker)
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
                self._lost(worker, "worker_lost", exit_detail(worker))


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


def kill(worker: WorkerProcess) -> None:
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


def exit_detail(worker: WorkerProcess) -> str:
    with contextlib.suppress(subprocess.TimeoutExpired):
        worker.proc.wait(timeout=1)
    code = worker.proc.returncode
    if code is None:
        return "worker closed its pipe"
    if code < 0:
        return f"worker killed by {_signal_name(-code)}"
    return f"worker exited with status {code}"
