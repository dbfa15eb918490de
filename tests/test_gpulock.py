"""The per-GPU reader-writer lock: shared sections overlap, a timed (exclusive) section has the
GPU alone, and a waiting timer is not starved by readers that arrive after it. Each section is
a separate process (as candidates are); the test orders them with events, not sleeps. Both
writer-preference protocols are covered; timers queued together run as one batch only with
``batch_timers``."""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
from pathlib import Path

import pytest

from opsynth.filters.gpulock import gpu_section

CTX = mp.get_context("spawn")


def _section(lock_dir: str, name: str, exclusive: bool, batch: bool, release, log) -> None:
    """Events carry the host's monotonic clock, read while the lock is held: queue order
    across processes says nothing about the order things happened in."""
    log.put(("asking", name, time.monotonic()))
    with gpu_section(lock_dir, "gpu0", exclusive=exclusive, batch_timers=batch):
        log.put(("in", name, time.monotonic()))
        release.wait(30)
        log.put(("out", name, time.monotonic()))


class Sections:
    def __init__(self, lock_dir: Path, batch: bool = True) -> None:
        self.lock_dir, self.log, self.procs = str(lock_dir), CTX.Queue(), {}
        self.batch = batch
        self.events: dict[tuple[str, str], float] = {}
        self.release: dict[str, object] = {}

    def start(self, name: str, exclusive: bool) -> None:
        self.release[name] = CTX.Event()
        args = (self.lock_dir, name, exclusive, self.batch, self.release[name], self.log)
        self.procs[name] = CTX.Process(target=_section, args=args)
        self.procs[name].start()

    def wait_for(self, kind: str, name: str, timeout: float = 30.0) -> bool:
        """Read the log until (kind, name) arrives; False if it does not within ``timeout``."""
        while (kind, name) not in self.events:
            try:
                event_kind, event_name, at = self.log.get(timeout=timeout)
            except queue.Empty:
                return False
            self.events[(event_kind, event_name)] = at
        return True

    def finish(self) -> dict[tuple[str, str], float]:
        for event in self.release.values():
            event.set()
        for name in self.procs:
            self.wait_for("out", name)
        for proc in self.procs.values():
            proc.join(30)
        return self.events


BOTH = pytest.mark.parametrize("batch", [True, False], ids=["batched", "turnstile"])


@BOTH
def test_readers_overlap_and_writer_waits_for_them(tmp_path: Path, batch: bool) -> None:
    s = Sections(tmp_path, batch)
    s.start("reader1", False)
    assert s.wait_for("in", "reader1")
    s.start("reader2", False)
    assert s.wait_for("in", "reader2")  # shared sections overlap
    s.start("timer", True)
    assert s.wait_for("asking", "timer")
    assert not s.wait_for("in", "timer", timeout=1.0)  # readers still hold the GPU
    s.release["reader1"].set()
    s.release["reader2"].set()
    assert s.wait_for("in", "timer")
    events = s.finish()
    assert events[("in", "timer")] >= events[("out", "reader2")]


@BOTH
def test_waiting_timer_goes_before_later_readers(tmp_path: Path, batch: bool) -> None:
    s = Sections(tmp_path, batch)
    s.start("reader1", False)
    assert s.wait_for("in", "reader1")
    s.start("timer", True)
    assert s.wait_for("asking", "timer")
    assert not s.wait_for("in", "timer", timeout=1.0)
    s.start("late_reader", False)
    assert s.wait_for("asking", "late_reader")
    # with plain flock the late reader would join reader1 and starve the timer
    assert not s.wait_for("in", "late_reader", timeout=1.0)
    s.release["reader1"].set()
    assert s.wait_for("in", "timer")
    assert not s.wait_for("in", "late_reader", timeout=0.5)  # the timer has the GPU alone
    events = s.finish()
    assert events[("in", "late_reader")] >= events[("out", "timer")]


def test_timers_queued_together_run_before_any_waiting_reader(tmp_path: Path) -> None:
    """Two timers queue behind a reader, a reader queues between them: both timers time (one
    at a time) before the waiting reader starts, so the GPU drains once for the two."""
    s = Sections(tmp_path, batch=True)
    s.start("reader1", False)
    assert s.wait_for("in", "reader1")
    s.start("timer1", True)
    assert s.wait_for("asking", "timer1")
    s.start("late_reader", False)
    assert s.wait_for("asking", "late_reader")
    s.start("timer2", True)
    assert s.wait_for("asking", "timer2")
    assert not s.wait_for("in", "timer1", timeout=1.0)
    s.release["reader1"].set()
    first = "timer1" if s.wait_for("in", "timer1", timeout=5.0) else "timer2"
    second = "timer2" if first == "timer1" else "timer1"
    assert s.wait_for("in", first)
    assert not s.wait_for("in", second, timeout=0.5)  # timers one at a time
    s.release[first].set()
    assert s.wait_for("in", second)
    assert not s.wait_for("in", "late_reader", timeout=0.5)  # still the timers' turn
    s.release[second].set()
    assert s.wait_for("in", "late_reader")
    events = s.finish()
    assert events[("in", "late_reader")] >= events[("out", "timer1")]
    assert events[("in", "late_reader")] >= events[("out", "timer2")]


def test_no_lock_dir_is_a_no_op() -> None:
    with gpu_section("", "gpu0", exclusive=True), gpu_section("", "gpu0", exclusive=True):
        pass


def test_waiting_time_is_counted_in_this_process(tmp_path: Path) -> None:
    """``waited_s`` grows by the time spent queueing behind a timer, and not by time held."""
    import threading

    from opsynth.filters.gpulock import waited_s

    s = Sections(tmp_path)
    s.start("timer", exclusive=True)
    assert s.wait_for("in", "timer")
    before = waited_s()
    threading.Timer(0.5, s.release["timer"].set).start()
    with gpu_section(str(tmp_path), "gpu0", exclusive=False):
        queued = waited_s() - before
        time.sleep(0.3)
    s.finish()
    assert 0.4 <= queued < 5.0
    assert waited_s() - before == queued


def test_exclusive_holding_time_is_counted_and_shared_is_not(tmp_path: Path) -> None:
    """``exclusive_s`` grows by the time a timed section held the GPU, never by shared ones."""
    from opsynth.filters.gpulock import exclusive_s

    before = exclusive_s()
    with gpu_section(str(tmp_path), "gpu0", exclusive=False):
        time.sleep(0.2)
    assert exclusive_s() == before
    with gpu_section(str(tmp_path), "gpu0", exclusive=True):
        time.sleep(0.3)
    assert 0.3 <= exclusive_s() - before < 5.0


def test_a_section_inside_a_section_is_covered_by_the_outer_one(tmp_path: Path) -> None:
    """Shared in shared and anything in exclusive take no second lock (which could wait on the
    process's own hold); a timed section inside an untimed one is refused, not deadlocked."""
    lock_dir = str(tmp_path)
    with gpu_section(lock_dir, "gpu0", exclusive=False):
        with gpu_section(lock_dir, "gpu0", exclusive=False):
            pass
        with (
            pytest.raises(RuntimeError, match="inside an untimed one"),
            gpu_section(lock_dir, "gpu0", exclusive=True),
        ):
            pass
    with gpu_section(lock_dir, "gpu0", exclusive=True):
        with gpu_section(lock_dir, "gpu0", exclusive=False):
            pass
        with gpu_section(lock_dir, "gpu0", exclusive=True):
            pass
    # all released: another process's timer gets the GPU at once
    s = Sections(tmp_path)
    s.start("timer", True)
    assert s.wait_for("in", "timer", timeout=10.0)
    s.finish()
