"""The pool's re-runs of tasks whose verdict may only say that their neighbours held the memory.

A ``WorkerPool`` mixin (``filters.pool``): ``retry_alone`` takes any number of batches, so a
caller that waits for one-job batches (the pipelined sizing, ``flows.size_screen``) can gather
a chunk's ``oom`` verdicts and retry them together. Each retry first drains the pool and lets
go of every waiting process (each holds a CUDA context), so one retry per batch would idle the
whole pool once per ``oom``; gathered, the tasks share waves planned by ``filters.retry`` and
the pool drains once per wave.
"""

from __future__ import annotations

import time
from typing import Any

from opsynth.filters import retry


class RetryAlone:
    """Re-run, with nothing else running, the tasks ``cfg.retry_alone`` names. Uses the
    pool's queue, workers and driving loop (``_queue``, ``_drive``, ``_send``, ``_pump``,
    ``_replace``, ``_lost``)."""

    cfg: Any
    device: str
    stats: dict[str, Any]
    _workers: list[Any]

    def _retry_alone(self, tickets: list[Any]) -> None:
        """Run again, with nothing else running, the tasks of ``tickets`` whose verdict may only
        say that other workers' candidates held the device's memory (``retry_alone``). Tasks
        whose measured needs fit the device together share a wave (``filters.retry``); one that
        fails the same way in a shared wave runs once more truly alone. The last run's verdict
        stands, and its last row keeps what the first run said. A one-worker pool ran them
        alone already."""
        retried = set(self.cfg.retry_alone)
        again = {
            f"{n}/{task_id}": (ticket, task_id)
            for n, ticket in enumerate(tickets)
            for task_id in ticket.jobs
            if ticket.results.get(task_id) and ticket.results[task_id][-1].reason in retried
        }
        if not again or len(self._workers) < 2:
            return
        self.stats["retried_alone"] += len(again)
        start = time.monotonic()
        first = {key: ticket.results[task_id][-1] for key, (ticket, task_id) in again.items()}
        needs = {key: retry.memory_need_gib(row.detail) for key, row in first.items()}
        shared: dict[str, int] = {}
        for wave in retry.retry_waves(needs, self._retry_budget_gib()):
            self._run_wave([again[key] for key in wave])
            shared.update(dict.fromkeys(wave, len(wave)))
        for key, size in list(shared.items()):
            ticket, task_id = again[key]
            if size > 1 and ticket.results[task_id][-1].reason in retried:
                self._run_wave([again[key]])
                shared[key] = 1
        self.stats["retried_alone_s"] += round(time.monotonic() - start, 3)
        for key, size in shared.items():
            ticket, task_id = again[key]
            row = first[key]
            ticket.results[task_id][-1].measures["first_run"] = {
                "stage": row.stage,
                "reason": row.reason,
                "detail": row.detail[:300],
                "concurrent_workers": len(self._workers),
                "retry_wave": size,
            }

    def _run_wave(self, members: list[tuple[Any, str]]) -> None:
        """The (batch, task id) ``members`` side by side, each under its batch's settings,
        with nothing else dispatched until they are done; their verdicts replace the batches'."""
        owned: dict[int, tuple[Any, Any]] = {}  # id(owner) -> (owner, its part of the wave)
        for ticket, task_id in members:  # a wave's batch of each owner's kind (filters.pool's)
            _, part = owned.setdefault(id(ticket), (ticket, type(ticket)({}, ticket.overrides)))
            part.jobs[task_id] = ticket.jobs[task_id]
        parts = [part for _, part in owned.values()]
        with self._queue_lock:
            self._queue.extendleft(
                (part, job) for part in reversed(parts) for job in reversed(part.jobs.values())
            )
        self._drive(parts, len(members), only=parts, release=True)
        for owner, part in owned.values():
            owner.results.update(part.results)

    def _retry_budget_gib(self) -> float | None:
        """Device memory the retried tasks' measured needs may fill at once; None on CPU."""
        sizes = [
            int(w.info.get("memory_bytes") or 0)
            for w in self._workers
            if w is not None and w.info.get("memory_bytes")
        ]
        if self.device != "cuda" or not sizes:
            return None
        return min(sizes) / 2**30 * self.cfg.retry_memory_fraction

    def _release_idle(self) -> None:
        """Have every idle worker kill its waiting processes (``filters.worker`` ``release``):
        a prestarted or kept process holds a CUDA context, so a task "retried alone" next to
        idle workers still found a large share of the device taken (benchmarks/RESULTS.md). A
        worker that does not answer within ``grace_s`` is replaced."""
        releasing = [w for w in self._workers if w is not None and w.state == "idle"]
        for worker in releasing:
            if self._send(worker, {"op": "release"}):
                worker.state = "releasing"
            else:
                self._replace(worker)
        deadline = time.monotonic() + self.cfg.grace_s
        while time.monotonic() < deadline and any(w.state == "releasing" for w in releasing):
            self._pump(0.5)
        for worker in releasing:
            if worker.state == "releasing":
                self._lost(worker, "worker_lost", "worker did not release its waiting processes")
