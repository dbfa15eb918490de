"""Peak resident memory of this process's descendants (the sandboxed workers and their
candidate children), sampled from /proc on a background thread. Linux only; torch-free."""

from __future__ import annotations

import os
import threading


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    return children


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def descendants_rss(root: int) -> list[int]:
    """RSS of every process below ``root`` (not ``root`` itself)."""
    children = _children_map()
    stack, sizes = list(children.get(root, [])), []
    while stack:
        pid = stack.pop()
        sizes.append(_rss_bytes(pid))
        stack.extend(children.get(pid, []))
    return sizes


class MemorySampler:
    """``with MemorySampler() as m: ...`` then ``m.peak_total`` (sum over descendants at the
    worst moment) and ``m.peak_process`` (the largest single process), in bytes."""

    def __init__(self, every_s: float = 0.5) -> None:
        self.every_s = every_s
        self.peak_total = 0
        self.peak_process = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        root = os.getpid()
        while not self._stop.is_set():
            sizes = descendants_rss(root)
            self.samples += 1
            self.peak_total = max(self.peak_total, sum(sizes))
            self.peak_process = max([self.peak_process, *sizes])
            self._stop.wait(self.every_s)
