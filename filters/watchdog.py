"""The worker's watch over a running candidate (``filters.worker``): its report pipe, its clock
and its processes, threads, resident memory and output size while it runs; then every process
it started killed and reaped, and the temp dirs emptied for the next one.

Why a census of processes rather than the child's pid alone: a candidate can fork, orphan
processes (re-parented to the worker, a subreaper) and start threads, and all of them count
against its limits and die with it. The census leaves out the prestarted child
(``filters.children``), which is the worker's and has run nothing of the candidate's.

Standard library only, like the worker.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opsynth.filters.childio import MAX_CHILD_LINE_BYTES, drain, exit_failure, proc_stat
from opsynth.filters.children import REAP_S, Children

# How often the parent checks the child's clock, processes, memory and output (seconds).
POLL_S = 0.02
# Outside a private PID namespace the census scans every process on the host; do it less often.
HOST_CENSUS_S = 0.1
# How long the kill after a candidate spares the waiting child before killing everything.
SPARE_KILL_S = 2.0


@dataclass
class Supervised:
    """How a supervised job ended: the merged payload of the child's ``info``-like events, the
    failure (reason, detail) if it did not finish, what the child reported past ``done`` (its
    audit, if anything), and the seconds it took to prepare the audit's baseline."""

    payload: dict[str, Any] = field(default_factory=dict)
    failure: tuple[str, str] | None = None
    leftover: bytes = b""
    prepare_s: float = 0.0


class Watchdog:
    """Watches the children of one worker. ``private_pidns``: the worker has a PID namespace
    of its own, so every process in it but itself and init is the candidate's."""

    def __init__(self, children: Children, private_pidns: bool, page_size: int) -> None:
        self.children = children
        self.private_pidns = private_pidns
        self.page_size = page_size

    def supervise(
        self,
        pid: int,
        read_fd: int,
        settings: dict[str, Any],
        log_path: str,
        on_event: Callable[[dict[str, Any]], None] | None,
        initial: bytes = b"",
        may_prepare: bool = False,
    ) -> Supervised:
        """Read the child's reports until it reports ``done``, dies, crosses a limit or runs
        out of time. ``may_prepare``: the first job of a child that may take more; it first
        compiles the audit's tiny model (``filters.state_audit.prepare``) and reports
        ``prepared`` once: the candidate's time starts then. Preparing gets a timeout of its
        own, and running past it is the harness's failure, not the candidate's."""
        timeout = float(settings.get("task_timeout_s", 60.0))
        began = time.monotonic()
        deadline = began + timeout
        census_every = POLL_S if self.private_pidns else HOST_CENSUS_S
        next_census = 0.0
        result = Supervised()
        payload = result.payload
        buffer = bytearray()
        pipe_open = True
        error: str | None = None
        error_reason = "filter_error"

        def consume(chunk: bytes) -> bool:
            nonlocal error, error_reason, deadline, may_prepare
            buffer.extend(chunk)
            while b"\n" in buffer:
                line, _, rest = bytes(buffer).partition(b"\n")
                buffer[:] = rest
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(event, dict):
                    continue
                kind = event.get("event")
                if kind == "done":
                    return True
                if kind == "prepared" and may_prepare:
                    may_prepare = False
                    now = time.monotonic()
                    deadline = now + timeout
                    result.prepare_s = now - began
                elif kind == "error":
                    error = str(event.get("detail", ""))[-1500:]
                    # before ``prepared`` no candidate code has run in the process: only then
                    # is its report the harness's own failure
                    error_reason = "filter_error" if may_prepare else "harness_failed"
                elif kind in ("info", "calibration"):
                    payload.update({k: v for k, v in event.items() if k != "event"})
                elif on_event and kind != "started":  # only we say which process started
                    on_event(event)
            return False

        def failed(reason: str, detail: str) -> Supervised:
            result.failure = (reason, detail)
            return result

        if initial and consume(initial):
            result.leftover = bytes(buffer)
            return result
        while True:
            if pipe_open:
                ready, _, _ = select.select([read_fd], [], [], POLL_S)
                if ready:
                    chunk = os.read(read_fd, 1 << 16)
                    if not chunk:
                        pipe_open = False
                    elif consume(chunk):
                        result.leftover = bytes(buffer)
                        return result
            else:
                time.sleep(POLL_S)
            if len(buffer) > MAX_CHILD_LINE_BYTES:
                return failed("crashed", "the candidate wrote an oversized report line")
            done_pid, status = os.waitpid(pid, os.WNOHANG)
            if done_pid:
                if pipe_open and consume(drain(read_fd)):
                    return result
                if error is not None:
                    return failed(error_reason, f"the check harness raised: {error}")
                return failed(*exit_failure(status, log_path, settings))
            now = time.monotonic()
            if now >= next_census:
                next_census = now + census_every
                failure = self.limits(pid, log_path, settings)
                if failure:
                    return failed(*failure)
            if now > deadline and may_prepare:
                detail = "preparing the audit's baseline (a tiny torch.compile) took longer"
                return failed("filter_error", f"{detail} than task_timeout_s={timeout:g} s")
            if now > deadline:
                return failed("timeout", f"exceeded task_timeout_s={timeout:g} s")

    def census(self, pid: int) -> list[tuple[int, int, int]]:
        """(pid, threads, rss pages) of every process the candidate started (not the
        prestarted child, which is ours and has run nothing of the candidate's, nor what it
        started: the compiler its audit preparation runs, in its session, which the candidate
        cannot join)."""
        me = os.getpid()
        spare = self.children.spare.pid if self.children.spare else None
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            proc = int(name)
            if proc in (me, spare) or (self.private_pidns and proc == 1):
                continue
            stat = proc_stat(proc)
            if stat is None:
                continue
            ppid, pgrp, session, threads, rss = stat
            if spare is not None and session == spare:
                continue
            if self.private_pidns or session == pid or pgrp == pid or ppid == me:
                found.append((proc, threads, rss))
        return found

    def limits(self, pid: int, log_path: str, settings: dict[str, Any]) -> tuple[str, str] | None:
        """The limit the candidate's processes cross now (processes and threads, resident
        memory, output size), as a failure; None while they cross none."""
        procs = self.census(pid)
        tasks = sum(threads for _, threads, _ in procs)
        limit = int(settings.get("max_processes", 256))
        if tasks > limit:
            return ("resource_limit", f"{tasks} processes/threads > max_processes={limit}")
        rss = sum(pages for _, _, pages in procs) * self.page_size
        memory = int(settings.get("memory_limit_bytes", 8 << 30))
        if rss > memory:
            return (
                "resource_limit",
                f"resident memory {rss / 2**30:.2f} GiB > {memory / 2**30:.2f} GiB",
            )
        with contextlib.suppress(OSError):
            size = os.stat(log_path).st_size
            cap = int(settings.get("output_limit_bytes", 1 << 20))
            if size > cap:
                return ("output_flood", f"wrote {size} bytes to stdout/stderr > {cap}")
        return None

    def kill_all(self, pid: int) -> bool:
        """Kill every process the candidate started and reap them; False if some would not die.
        The prestarted child is spared for ``SPARE_KILL_S``; if the candidate's processes are
        not all gone by then (a fork bomb racing the census), it goes too, and in a private
        PID namespace one ``kill(-1)`` takes everything at once."""
        deadline = time.monotonic() + REAP_S
        spare_until = time.monotonic() + SPARE_KILL_S
        while True:
            if self.children.spare and time.monotonic() >= spare_until:
                self.children.discard_spare()
            if self.private_pidns and not self.children.spare:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(-1, signal.SIGKILL)  # everything in our PID namespace but us and init
            else:
                for proc, _, _ in self.census(pid):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(proc, signal.SIGKILL)
            if self._reap(pid, min(deadline, time.monotonic() + 0.5)):
                return True
            if time.monotonic() >= deadline:
                return False

    def _reap(self, pid: int, deadline: float) -> bool:
        """Reap killed processes until none of the candidate's is left (True) or ``deadline``."""
        while True:
            try:
                reaped, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return True
            if reaped:
                if self.children.spare and reaped == self.children.spare.pid:
                    self.children.spare.reaped = True
                    self.children.discard_spare()
                continue
            if self.children.spare and not self.census(pid):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)


def wipe(tmp: str, private_pidns: bool) -> None:
    """Empty the temp dirs between candidates so nothing one leaves is seen by the next."""
    dirs = [tmp] + (["/dev/shm"] if private_pidns else [])
    for directory in dirs:
        with contextlib.suppress(OSError):
            for entry in os.scandir(directory):
                if os.path.ismount(entry.path):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)
