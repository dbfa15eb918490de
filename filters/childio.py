"""Plain helpers of the worker and its children: pipes and report lines, ``/proc`` reads,
rlimits, ``prctl`` and exit statuses. Standard library only, like the worker.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import select
import signal
import time
from typing import Any

# Longest report line accepted from a child; a longer one is garbage.
MAX_CHILD_LINE_BYTES = 4 << 20
CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT}
OUTPUT_TAIL_CHARS = 500

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36


class Emitter:
    """Writes report lines; a process forked by the candidate that falls back into the harness
    exits instead of writing, so only the child itself reports."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pid = os.getpid()

    def emit(self, message: dict[str, Any]) -> None:
        if os.getpid() != self.pid:
            os._exit(0)
        write_all(self.fd, (json.dumps(message) + "\n").encode())


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def inside(root: str, relative: str) -> str:
    """``root/relative``, refusing paths that would land outside ``root``."""
    path = os.path.normpath(os.path.join(root, relative))
    if os.path.isabs(relative) or not path.startswith(root.rstrip("/") + "/"):
        raise ValueError(f"file path {relative!r} leaves the candidate's directory")
    return path


def drain(fd: int) -> bytes:
    chunks = []
    while select.select([fd], [], [], 0)[0]:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def failed_row(stage: str, reason: str, detail: str) -> dict[str, Any]:
    return {"stage": stage, "passed": False, "reason": reason, "detail": detail, "measures": {}}


def stat_fields(pid: int) -> list[bytes]:
    """The fields of /proc/PID/stat after the command name (state first); [] if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return []
    return raw[raw.rfind(b")") + 2 :].split()


def proc_stat(pid: int) -> tuple[int, int, int, int, int] | None:
    """(ppid, pgrp, session, threads, rss pages) from /proc/PID/stat."""
    fields = stat_fields(pid)
    try:
        return int(fields[1]), int(fields[2]), int(fields[3]), int(fields[17]), int(fields[21])
    except (IndexError, ValueError):
        return None


def state(pid: int) -> str:
    """The process state letter ("" if it is gone)."""
    fields = stat_fields(pid)
    return fields[0].decode() if fields else ""


def reusable_for(settings: dict[str, Any]) -> bool:
    """Whether a process that ran a job with these settings may take another: filter checks
    only (a solution for the evaluator loads compiled extensions nothing can unload)."""
    return int(settings.get("candidates_per_process", 1)) > 1 and not settings.get("harness")


def read_line(fd: int, deadline: float, pending: bytes = b"") -> bytes:
    """The first line of ``pending`` and what ``fd`` brings until ``deadline``; b"" if none
    came whole (the writer closed the pipe, or the time ran out)."""
    data = pending
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return b""
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b""
        data += chunk
        if len(data) > MAX_CHILD_LINE_BYTES:
            return b""
    return data.partition(b"\n")[0]


def read_job(fd: int) -> dict[str, Any] | None:  # pragma: no cover - child
    """The child's next job: one JSON line on its go pipe; None when the parent closed it."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return None
        data += chunk
    return json.loads(data)


def exit_failure(status: int, log_path: str, settings: dict[str, Any]) -> tuple[str, str]:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        if sig == signal.SIGXCPU:
            return ("timeout", "CPU time limit exceeded")
        if sig == signal.SIGXFSZ:
            cap = int(settings.get("output_limit_bytes", 1 << 20))
            with contextlib.suppress(OSError):
                if os.stat(log_path).st_size > cap:
                    return ("output_flood", "stdout/stderr hit the file size limit")
            return ("resource_limit", "file size limit exceeded")
        if sig == signal.SIGKILL:
            return ("resource_limit", "killed by SIGKILL (most likely the kernel's OOM killer)")
        if sig in CRASH_SIGNALS:
            return ("crashed", f"killed by {name}")
        return ("crashed", f"killed by signal {name}")
    return (
        "exited",
        f"the candidate process exited with status {os.WEXITSTATUS(status)} before reporting",
    )


def log_tail(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - OUTPUT_TAIL_CHARS))
            return fh.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def apply_limits(
    settings: dict[str, Any], device: str, reuse: bool = False
) -> None:  # pragma: no cover - child
    """rlimits for the candidate child. RLIMIT_AS only on CPU: CUDA reserves a virtual range
    far beyond physical memory, so on CUDA the parent's resident-memory watchdog is the cap.
    RLIMIT_NPROC is counted per real user and ignored for root, so the watchdog's process
    census backs it up. A process that takes several candidates counts CPU time from what it
    has used so far, and keeps its hard CPU limit open (it could never be raised again for
    the next candidate): the parent's wall-clock limit is the backstop."""
    timeout = float(settings.get("task_timeout_s", 60.0))
    threads = max(1, int(settings.get("threads", 1)))
    cpu = int(timeout * threads) + 5
    if reuse:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu += int(usage.ru_utime + usage.ru_stime)
    limits = {
        resource.RLIMIT_CORE: 0,
        resource.RLIMIT_CPU: cpu,
        resource.RLIMIT_FSIZE: int(settings.get("file_size_limit_bytes", 256 << 20)),
    }
    if device != "cuda":
        limits[resource.RLIMIT_AS] = int(settings.get("memory_limit_bytes", 8 << 30))
    if os.getuid() != 0:
        limits[resource.RLIMIT_NPROC] = user_tasks() + int(settings.get("max_processes", 256))
    for which, value in limits.items():
        _, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        elif which == resource.RLIMIT_CPU and not reuse:
            hard = value + 5  # SIGXCPU at the soft limit, SIGKILL 5 s later
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(which, (value, hard))


def user_tasks() -> int:  # pragma: no cover - child
    """Threads the current user already runs (RLIMIT_NPROC counts them all)."""
    uid = os.getuid()
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{name}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{name}/task"))
    return count


def prctl(option: int, value: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(option, value, 0, 0, 0)
