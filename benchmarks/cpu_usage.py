"""The host's CPU use over a benchmark phase, sampled from /proc/stat.

Why: a filter phase that leaves the GPU half idle is bound either by the GPU lock's
serialisation or by the CPU (compiles of 16 candidates at once on 16 cores); the GPU's
counters (``gpu_usage``) cannot tell these apart, the host's busy share can. Linux only,
standard library; elsewhere the sampler records nothing.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterable

# /proc/stat's cpu columns that count as idle: idle and iowait; the rest is busy.
IDLE_COLUMNS = (3, 4)


def cpu_times(line: str, name: str = "cpu") -> tuple[int, int] | None:
    """(busy, total) jiffies from /proc/stat's line ``name`` (``cpu``: all cores, ``cpuN``:
    core N); None for other lines. guest time is already inside user, so the first eight
    columns are the total."""
    parts = line.split()
    if not parts or parts[0] != name:
        return None
    try:
        values = [int(v) for v in parts[1:9]]
    except ValueError:
        return None
    idle = sum(values[i] for i in IDLE_COLUMNS if i < len(values))
    total = sum(values)
    return total - idle, total


def busy_share(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    """Busy share of all cores between two readings; None when no time passed."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else None


def summarise(shares: list[float], busy_above: float = 0.9) -> dict[str, float] | None:
    if not shares:
        return None
    return {
        "samples": len(shares),
        "busy_mean_pct": round(statistics.mean(shares) * 100, 1),
        "busy_median_pct": round(statistics.median(shares) * 100, 1),
        "saturated_share": round(sum(s > busy_above for s in shares) / len(shares), 3),
    }


def read_times(
    path: str = "/proc/stat", cpus: frozenset[int] | None = None
) -> tuple[int, int] | None:
    """(busy, total) over all cores, or summed over the cores ``cpus`` (a run pinned to a
    share of the host is judged by its own cores, not diluted by the idle rest)."""
    names = {"cpu"} if cpus is None else {f"cpu{i}" for i in cpus}
    found: list[tuple[int, int]] = []
    try:
        with open(path) as fh:
            for line in fh:
                name = line.split(maxsplit=1)[0] if line.strip() else ""
                if not name.startswith("cpu"):
                    break  # the cpu lines come first; the rest (intr, ...) is long
                times = cpu_times(line, name) if name in names else None
                if times is not None:
                    found.append(times)
    except OSError:
        return None
    if not found:
        return None
    return sum(b for b, _ in found), sum(t for _, t in found)


class CpuSampler:
    """``with CpuSampler() as c: ...`` then ``c.summary()``: the share of the cores (all, or
    ``cpus``) busy in each ``every_s`` interval, summarised, and ``c.overall`` over the whole
    phase. Each share is stamped with its interval's end (``time.time()``), so that a part of
    the phase can be summarised on its own (``summary(between=...)``)."""

    def __init__(self, every_s: float = 0.5, cpus: Iterable[int] | None = None) -> None:
        self.every_s = every_s
        self.cpus = None if cpus is None else frozenset(cpus)
        self.shares: list[float] = []
        self.stamps: list[float] = []
        self.overall: float | None = None
        self._first: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CpuSampler:
        self._first = read_times(cpus=self.cpus)
        if self._first is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        last = read_times(cpus=self.cpus)
        if self._first is not None and last is not None:
            self.overall = busy_share(self._first, last)

    def _run(self) -> None:
        previous = self._first
        while not self._stop.wait(self.every_s):
            now = read_times(cpus=self.cpus)
            if previous is not None and now is not None:
                share = busy_share(previous, now)
                if share is not None:
                    self.shares.append(share)
                    self.stamps.append(time.time())
            previous = now

    def summary(self, between: tuple[float, float] | None = None) -> dict[str, float] | None:
        """Over the whole phase, or over the samples stamped within ``between``."""
        if between is not None:
            low, high = between
            return summarise(
                [s for s, t in zip(self.shares, self.stamps, strict=True) if low <= t <= high]
            )
        found = summarise(self.shares)
        if found is not None and self.overall is not None:
            found["busy_overall_pct"] = round(self.overall * 100, 1)
        return found
