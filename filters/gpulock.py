"""A host-wide reader-writer lock per GPU, so timed runs never share the GPU with other work.

GPUs time-slice between processes: a kernel being timed while another worker's forward or
input draw runs on the same GPU reads up to 4x slow (measured on an H200 with 12 workers).
Every GPU section of a candidate therefore holds the GPU's lock *shared* (any number of them
overlap, as untimed work may), and a timed section holds it *exclusive*.

Writer preference: with plain ``flock`` a steady stream of shared holders could keep a timer
waiting for ever. A second file, the turnstile, fixes that: a reader passes through it
(exclusive, held only while taking its shared lock) and a writer holds it while it waits, so
once a timer queues, new readers queue behind it and the timer waits only for the sections
already running (a few forwards). Locks die with their process, so a killed candidate never
leaves one held. Standard library only: this runs inside the sandboxed worker.

Sections must not nest: two ``flock`` descriptions of one file conflict even within a process.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator

# Seconds this process has spent waiting for GPU locks, and holding one exclusively; the checks
# report both per stage, so a stage slowed by queueing for the GPU is told apart from one slowed
# by its own work, and the GPU's serialised time is known.
_waited_s = 0.0
_exclusive_s = 0.0


def waited_s() -> float:
    return _waited_s


def exclusive_s() -> float:
    return _exclusive_s


def _open(lock_dir: str, name: str) -> int:
    return os.open(os.path.join(lock_dir, name), os.O_RDWR | os.O_CREAT, 0o666)


@contextlib.contextmanager
def _held(fd: int, mode: int) -> Iterator[None]:
    fcntl.flock(fd, mode)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


@contextlib.contextmanager
def gpu_section(lock_dir: str, ident: str, *, exclusive: bool) -> Iterator[None]:
    """Hold GPU ``ident``'s lock in ``lock_dir``: exclusive for timing, else shared. No-op
    without a lock dir (a lone process has nobody to exclude)."""
    global _waited_s, _exclusive_s
    if not lock_dir:
        yield
        return
    asked = time.perf_counter()
    turnstile = _open(lock_dir, f"gpu-{ident}.turnstile")
    lock = _open(lock_dir, f"gpu-{ident}.lock")
    try:
        with _held(turnstile, fcntl.LOCK_EX):
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        _waited_s += time.perf_counter() - asked
        held = time.perf_counter()
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            if exclusive:
                _exclusive_s += time.perf_counter() - held
    finally:
        os.close(lock)
        os.close(turnstile)
