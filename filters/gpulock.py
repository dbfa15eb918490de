"""A host-wide reader-writer lock per GPU, so timed runs never share the GPU with other work.

GPUs time-slice between processes: a kernel being timed while another worker's forward or
input draw runs on the same GPU reads up to 4x slow (measured on an H200 with 12 workers).
Every GPU section of a candidate therefore holds the GPU's lock *shared* (any number of them
overlap, as untimed work may), and a timed section holds it *exclusive*.

Writer preference, two ways (``batch_timers``):

- *Timers in batches* (the default). A third file, the gate, is held shared by every timer
  from the moment it asks until it is done; a shared section first waits until it can take
  the gate exclusively, i.e. until no timer is waiting or timing. Timers that queue while one
  is draining the GPU or timing therefore all run, one after another, before the next
  untimed section starts: the forwards already in flight drain once per batch of timers, not
  once per timer. Each worker's timed section follows an untimed warm-up, so a batch holds
  at most one timer per worker and shared sections cannot starve. On an H200 with 16
  workers the same 250 candidates filtered in 120 s batched and 125 s alternating (one run
  each, so within run-to-run spread); timers there arrive about three times a second.
- *Turnstile.* A reader passes through the turnstile (exclusive, held only while taking its
  shared lock) and a timer holds it while it waits, so once a timer queues, new readers queue
  behind it; timers and readers then alternate, and every timer waits for its own drain.

A section inside a section of the same process takes no lock of its own: the outer one already
covers it (two ``flock`` descriptions of one file conflict even within a process, so taking
the lock again could wait on itself). A timed section inside an untimed one is refused: it
would wait for its own shared hold to drain.
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
# The section this process holds now (None, "shared" or "exclusive"), for nesting.
_holding: str | None = None


def waited_s() -> float:
    return _waited_s


def exclusive_s() -> float:
    return _exclusive_s


def held() -> str | None:
    """The section this process holds now: None, "shared" or "exclusive"."""
    return _holding


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
def gpu_section(
    lock_dir: str, ident: str, *, exclusive: bool, batch_timers: bool = True
) -> Iterator[None]:
    """Hold GPU ``ident``'s lock in ``lock_dir``: exclusive for timing, else shared. No-op
    without a lock dir (a lone process has nobody to exclude)."""
    global _waited_s, _exclusive_s, _holding
    if not lock_dir or _holding == "exclusive" or (_holding and not exclusive):
        yield  # nothing to exclude, or the section already held covers this one
        return
    if _holding:
        raise RuntimeError("a timed GPU section cannot start inside an untimed one")
    asked = time.perf_counter()
    # the file that gives a waiting timer priority: the gate, or the turnstile
    priority = _open(lock_dir, f"gpu-{ident}.{'gate' if batch_timers else 'turnstile'}")
    lock = _open(lock_dir, f"gpu-{ident}.lock")
    mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    try:
        if not batch_timers:
            with _held(priority, fcntl.LOCK_EX):
                fcntl.flock(lock, mode)
        else:
            if exclusive:
                fcntl.flock(priority, fcntl.LOCK_SH)  # held until this section ends
            else:
                with _held(priority, fcntl.LOCK_EX):  # passes once no timer waits or times
                    pass
            fcntl.flock(lock, mode)
        _waited_s += time.perf_counter() - asked
        held = time.perf_counter()
        _holding = "exclusive" if exclusive else "shared"
        try:
            yield
        finally:
            _holding = None
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(priority, fcntl.LOCK_UN)
            if exclusive:
                _exclusive_s += time.perf_counter() - held
    finally:
        os.close(lock)
        os.close(priority)
