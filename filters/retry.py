"""Planning the re-runs of tasks whose verdict may only reflect their neighbours' memory.

An ``oom`` on a GPU shared by many workers can mean that other candidates held the memory.
Re-running each such task alone is exact but serial, and with tasks sized to fill a 10 ms
window on a large GPU there are dozens per few hundred candidates. torch's CUDA out-of-memory
message states what the process held and what it asked for; their sum is a lower bound of the
task's need. Tasks whose bounds fit the device together re-run side by side in one wave (and
nothing else runs meanwhile); a task without a bound, or one that fails again in a shared
wave, runs alone. Pure functions: the pool (``filters.pool``) does the running.
"""

from __future__ import annotations

import re

_AMOUNT = r"([\d.]+) (GiB|MiB|KiB|B)\b"
_HELD = re.compile(r"this process has " + _AMOUNT)
_ASKED = re.compile(r"Tried to allocate " + _AMOUNT)
_UNIT = {"GiB": 1.0, "MiB": 1 / 1024, "KiB": 1 / 1024**2, "B": 1 / 1024**3}


def memory_need_gib(detail: str) -> float | None:
    """Held + asked (GiB) from a CUDA out-of-memory message; None when it does not say both."""
    held, asked = _HELD.search(detail), _ASKED.search(detail)
    if held is None or asked is None:
        return None
    return sum(float(m.group(1)) * _UNIT[m.group(2)] for m in (held, asked))


def retry_waves(needs: dict[str, float | None], budget_gib: float | None) -> list[list[str]]:
    """Group task ids into waves whose summed needs fit ``budget_gib``: largest first, each
    into the first wave with room (first-fit decreasing). Tasks with no known need, or all of
    them when there is no budget (a CPU pool), get a wave each."""
    if budget_gib is None or budget_gib <= 0:
        return [[task_id] for task_id in needs]
    known = sorted(
        ((need, task_id) for task_id, need in needs.items() if need is not None),
        key=lambda pair: -pair[0],
    )
    waves: list[list[str]] = []
    room: list[float] = []
    for need, task_id in known:
        for index, left in enumerate(room):
            if need <= left:
                waves[index].append(task_id)
                room[index] -= need
                break
        else:
            waves.append([task_id])
            room.append(budget_gib - need)
    return waves + [[task_id] for task_id, need in needs.items() if need is None]
