"""The host's CPU use over a benchmark phase, sampled from /proc/stat.

Why: a filter phase that leaves the GPU half idle is bound either by the GPU lock's
serialisation or by the CPU (compiles of 16 candidates at once on 16 cores); the GPU's
counters (``gpu_usage``) cannot tell these apart, the host's busy share can. Linux only,
standard library; elsewhere the sampler records nothing.
"""

from __future__ import annotations

import statistics
import threading

# /proc/stat's cpu columns that count as idle: idle and iowait; the rest is busy.
IDLE_COLUMNS = (3, 4)


def cpu_times(line: str) -> tuple[int, int] | None:
    """(busy, total) jiffies from /proc/stat's aggregate ``cpu`` line; None for other lines.
    guest time is already inside user, so the first eight columns are the total."""
    parts = line.split()
    if not parts or parts[0] != "cpu":
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


def read_times(path: str = "/proc/stat") -> tuple[int, int] | None:
    try:
        with open(path) as fh:
            return cpu_times(fh.readline())
    except OSError:
        return None


class CpuSampler:
    """``with CpuSampler() as c: ...`` then ``c.summary()``: the share of all cores busy in
    each ``every_s`` interval, summarised, and ``c.overall`` over the whole phase."""

    def __init__(self, every_s: float = 0.5) -> None:
        self.every_s = every_s
        self.shares: list[float] = []
        self.overall: float | None = None
        self._first: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CpuSampler:
        self._first = read_times()
        if self._first is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        last = read_times()
        if self._first is not None and last is not None:
            self.overall = busy_share(self._first, last)

    def _run(self) -> None:
        previous = self._first
        while not self._stop.wait(self.every_s):
            now = read_times()
            if previous is not None and now is not None:
                share = busy_share(previous, now)
                if share is not None:
                    self.shares.append(share)
            previous = now

    def summary(self) -> dict[str, float] | None:
        found = summarise(self.shares)
        if found is not None and self.overall is not None:
            found["busy_overall_pct"] = round(self.overall * 100, 1)
        return found
