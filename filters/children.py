"""The worker's children as the worker holds them (``filters.worker``): forking one, handing
it a job, and the two that wait for a next job, the prestarted child (``--prestart``) and the
child kept after its candidate passed the audit.

Why every waiting child is checked before it is handed a job: the running candidate cannot get
at it (it is non-dumpable and holds none of the running child's fds), but it can kill or stop
it. So a waiting child that is gone, stopped, or does not accept its job within
``HANDSHAKE_S`` is discarded and the job goes to a freshly forked one.

Standard library only, like the worker.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import time
from collections.abc import Callable
from typing import Any

from opsynth.filters.child_main import ACCEPTED
from opsynth.filters.childio import state, write_all

# Seconds to wait for killed processes to be reaped before giving up on this worker.
REAP_S = 10.0
# A waiting child accepts its job within this, or it is discarded for a fresh one.
HANDSHAKE_S = 10.0

# What a forked child runs: (its go fd, its report fd, the parent's ends of its pipes). It
# never returns.
ChildBody = Callable[[int, int, list[int]], None]


class Child:
    """A forked child as the parent sees it: its pid and the parent's ends of its two pipes
    (the job it is sent, the reports it writes)."""

    def __init__(self, pid: int, go_fd: int, report_fd: int, registry: set[int]) -> None:
        self.pid = pid
        self.go_fd = go_fd
        self.report_fd = report_fd
        self.reaped = False
        self.served = 0  # candidates this process has taken
        self._registry = registry
        registry.update((go_fd, report_fd))

    def close(self) -> None:
        for fd in (self.go_fd, self.report_fd):
            if fd in self._registry:
                self._registry.discard(fd)
                with contextlib.suppress(OSError):
                    os.close(fd)


class Children:
    """The worker's children: the one a job goes to, and those waiting for a next job. ``body``
    is what a forked child runs; ``prestart`` forks the next child as soon as one takes its
    job, so that its CUDA context is ready when the next candidate comes."""

    def __init__(self, body: ChildBody, prestart: bool) -> None:
        self.body = body
        self.prestart = prestart
        # The prestarted child, waiting for its job; and the parent-side fds of all children,
        # which every new child closes.
        self.spare: Child | None = None
        # The child kept after its candidate passed the audit, waiting for the next job.
        self.kept: Child | None = None
        self.fds: set[int] = set()
        # How the last child started: prestarted, fresh (none was waiting), replaced (the
        # waiting one was gone or stopped), refused (it exited instead of accepting the job:
        # its CUDA init had failed) or unresponsive (alive, but no answer within HANDSHAKE_S).
        self.last_child = ""
        self._refusal = ""

    def start(self, job: dict[str, Any]) -> tuple[Child, bytes | None]:
        """Hand ``job`` to the prestarted child, else a fresh fork; fork the next spare."""
        child, spare, self.spare = self.spare, True, None
        self.last_child = "prestarted"
        if child is None or not waiting(child):
            self.last_child = "fresh" if child is None else "replaced"
            discard(child)
            child, spare = self.fork(), False
        started = self._hand_over(child, job, refusable=spare)
        if started is None and spare:
            self.last_child = self._refusal
            discard(child)
            child = self.fork()
            started = self._hand_over(child, job, refusable=False)
        if self.prestart:
            with contextlib.suppress(OSError):  # no fork to spare (a process limit): go without
                self.spare = self.fork()
        return child, started

    def reuse_kept(self, job: dict[str, Any]) -> tuple[Child | None, bytes | None]:
        """Hand ``job`` to the child kept from the last candidate, if there is one and it
        takes it; its context is ready, and the spare stays spare."""
        child, self.kept = self.kept, None
        if child is None:
            return None, None
        if waiting(child):
            started = self._hand_over(child, job, refusable=False)
            if started is not None:
                self.last_child = "reused"
                return child, started
        discard(child)
        return None, None

    def release(self) -> int:
        """Kill the processes waiting for a next candidate (the prestarted spare, the child
        kept for reuse): on CUDA each holds a context and the kept one its cached memory, which
        a candidate retried alone must not share the device with. The next candidate forks
        afresh. How many there were."""
        count = (self.spare is not None) + (self.kept is not None)
        self.discard_spare()
        kept, self.kept = self.kept, None
        discard(kept)
        return count

    def discard_spare(self) -> None:
        spare, self.spare = self.spare, None
        discard(spare)

    def fork(self) -> Child:
        """Fork a child that waits for its job; on CUDA it creates its context meanwhile. It
        compiles nothing before its job (the audit's baseline included): until then it shares
        the worker's temp dir, compile cache and all, with the candidate running now, which
        could plant there what such a compile would load."""
        go_read, go_write = os.pipe()
        report_read, report_write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            self.body(go_read, report_write, [go_write, report_read])
        os.close(go_read)
        os.close(report_write)
        return Child(pid, go_write, report_read, self.fds)

    def _hand_over(self, child: Child, job: dict[str, Any], *, refusable: bool) -> bytes | None:
        """Send ``job``; wait for the child to accept it. The bytes it reported after
        accepting, or None if it did not: it is gone or exited (``_refusal`` "refused") or
        gave no answer in time ("unresponsive")."""
        self._refusal = "refused"
        try:
            write_all(child.go_fd, (json.dumps({**job, "refusable": refusable}) + "\n").encode())
        except OSError:
            return None
        received = b""
        deadline = time.monotonic() + HANDSHAKE_S
        while len(received) < len(ACCEPTED):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([child.report_fd], [], [], left)[0]:
                self._refusal = "unresponsive"
                return None
            chunk = os.read(child.report_fd, 1 << 16)
            if not chunk:
                return None
            received += chunk
        if not received.startswith(ACCEPTED):
            return None
        return received[len(ACCEPTED) :]


def waiting(child: Child) -> bool:
    """The waiting child is alive and not stopped (a candidate could have done either)."""
    try:
        if os.waitpid(child.pid, os.WNOHANG)[0]:
            child.reaped = True
            return False
    except ChildProcessError:
        child.reaped = True
        return False
    return state(child.pid) not in ("", "T", "t", "Z", "X")


def discard(child: Child | None) -> None:
    """Close ``child``'s pipes, kill it and reap it (for up to ``REAP_S``)."""
    if child is None:
        return
    child.close()
    if not child.reaped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + REAP_S
        while time.monotonic() < deadline:
            try:
                if os.waitpid(child.pid, os.WNOHANG)[0]:
                    break
            except ChildProcessError:
                break
            time.sleep(0.005)
        child.reaped = True
