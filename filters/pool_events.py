"""The worker pool's side of the protocol (a ``WorkerPool`` mixin, ``filters.pool``): sending
a worker its requests, reading its lines, checking each one and acting on it, and turning a
candidate's rows into verdicts, or a lost worker into its candidate's failure.

Everything a worker sends is untrusted (the worker shares the candidate's sandbox): a line
that breaks the protocol (``filters.protocol``) is the candidate's ``protocol_violation``, and
its worker is replaced.
"""

from __future__ import annotations

import json
import os
import re
import select
import time
from typing import Any

from opsynth.config import FiltersConfig
from opsynth.filters import protocol
from opsynth.filters.pool_types import Ticket, WorkerProcess
from opsynth.filters.pool_workers import exit_detail
from opsynth.record import Verdict

# Above the kernel's largest pid_max (2^22): a "pid" beyond it names no process.
MAX_PID = 1 << 22

# Largest protocol line accepted from a worker (a verdict row is a few KB). Above the child's
# limit (filters.childio.MAX_CHILD_LINE_BYTES): a worker's line relays what its child
# reported, with the verdict rows around it.
MAX_WORKER_LINE_BYTES = 16 << 20


class WorkerEvents:
    """Talk with the pool's workers. Finished candidates' verdicts go to ``_finished``, for
    the driving call to hand to their batches; uses the pool's lifecycle (``_start_failed``,
    ``_replace``)."""

    cfg: FiltersConfig
    device: str
    stats: dict[str, Any]
    _workers: list[WorkerProcess | None]
    _start_failures: int
    _finished: list[tuple[Ticket, str, list[Verdict]]]

    def _send(self, worker: WorkerProcess, message: dict[str, Any]) -> bool:
        data = (json.dumps(message) + "\n").encode()
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(worker.to_fd, view) :]
        except OSError:
            return False
        return True

    def _pump(self, timeout: float) -> None:
        """Wait up to ``timeout`` for worker output and handle every complete line."""
        live = {w.from_fd: w for w in self._workers if w is not None and w.state != "gone"}
        if not live:
            time.sleep(min(timeout, 0.05))
            return
        ready, _, _ = select.select(list(live), [], [], timeout)
        for fd in ready:
            worker = live[fd]
            for event in self._read(worker, 0):
                self._handle(worker, event)

    def _read(self, worker: WorkerProcess, timeout: float) -> list[dict[str, Any]]:
        """Complete JSON lines available from ``worker``; EOF or garbage replaces it."""
        if worker.state == "gone":
            return []
        ready, _, _ = select.select([worker.from_fd], [], [], timeout)
        if not ready:
            return []
        chunk = os.read(worker.from_fd, 1 << 16)
        if not chunk:
            self._lost(worker, "worker_lost", exit_detail(worker))
            return []
        worker.buffer.extend(chunk)
        events = []
        while b"\n" in worker.buffer:
            line, _, rest = bytes(worker.buffer).partition(b"\n")
            worker.buffer[:] = rest
            try:
                event = protocol.decode_line(line)
            except ValueError:
                detail = f"worker sent a malformed line: {line[:200]!r}"
                self._lost(worker, "protocol_violation", detail)
                return events
            if isinstance(event, dict):
                events.append(event)
        if len(worker.buffer) > MAX_WORKER_LINE_BYTES:
            self._lost(worker, "worker_lost", "worker sent an oversized line")
        return events

    def _handle(self, worker: WorkerProcess, event: dict[str, Any]) -> None:
        """Act on one line from ``worker``. Everything in it is untrusted (the worker shares
        the candidate's sandbox): a line that breaks the protocol is the candidate's
        ``protocol_violation``, and its worker is replaced."""
        problem = event_problem(worker, event)
        if not problem:
            try:
                self._apply(worker, event)
                return
            except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as exc:
                problem = f"{type(exc).__name__}: {exc}"[:500]
        if worker.state == "starting":
            self._start_failed(worker, f"protocol violation: {problem}")
        else:
            self._lost(worker, "protocol_violation", problem)

    def _apply(self, worker: WorkerProcess, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "ready":
            if event.get("error"):
                self._start_failed(worker, str(event["error"]))
                return
            worker.info = event
            worker.state = "idle"
            self._start_failures = 0
            for key in ("device_name", "torch_version", "cuda_version"):
                self.stats[key] = event.get(key) or self.stats.get(key)
            if isinstance(event.get("preimported"), int):
                self.stats["preimported"] = event["preimported"]
            if isinstance(event.get("vec_isa"), int):
                self.stats["vec_isa"] = event["vec_isa"]
            return
        if kind == "released":
            if worker.state == "releasing":
                worker.state = "idle"
                self.stats["retry_released"] += int(event.get("count") or 0)
            return
        if worker.task is None or event.get("task_id") != worker.task.id:
            return
        if kind == "stage":
            worker.stage = str(event.get("stage", worker.stage))
        elif kind == "verdict":
            worker.verdicts.append(event["verdict"])
        elif kind == "started":
            worker.child_pid = int(event.get("pid") or 0) or None
        elif kind == "result":
            child = f"child_{event.get('child')}"
            if child in self.stats:
                self.stats[child] += 1
            if event.get("retired"):
                _count_retirement(self.stats["child_retired"], str(event["retired"]))
            self.stats["audit_prepare_s"] += float(event.get("prepare_s") or 0.0)
            self._finish(worker, list(event.get("verdicts") or []))
            worker.served += 1
            worker.state = "idle"
            if event.get("replace") or worker.served >= self.cfg.recycle_after:
                self._replace(worker)

    def _finish(self, worker: WorkerProcess, rows: list[dict[str, Any]]) -> None:
        assert worker.task is not None and worker.ticket is not None
        task_id, ticket = worker.task.id, worker.ticket
        worker.task = worker.ticket = None
        self.stats["candidates"] += 1
        self.stats["last_result_at"] = time.time()
        self.stats["first_result_at"] = (
            self.stats["first_result_at"] or self.stats["last_result_at"]
        )
        device = f"{self.device}:{worker.info.get('device_name', '')}"
        torch_version = str(worker.info.get("torch_version", ""))
        verdicts = [
            Verdict(
                task_id=task_id,
                stage=str(row.get("stage", "")),
                passed=bool(row.get("passed")),
                reason=str(row.get("reason", "")),
                detail=str(row.get("detail", ""))[:2000],
                measures=dict(row.get("measures") or {}),
                device=device,
                torch_version=torch_version,
                elapsed_s=float(row.get("elapsed_s") or 0.0),
            )
            for row in rows
        ]
        self._finished.append((ticket, task_id, verdicts))

    def _lost(self, worker: WorkerProcess, reason: str, detail: str) -> None:
        """The worker is gone or hung: its candidate gets ``reason`` at the running stage."""
        if worker.state == "starting":
            self._start_failed(worker, detail)
            return
        if worker.task is not None:
            rows = list(worker.verdicts)
            if not rows or rows[-1].get("passed"):
                stage = worker.stage
                if rows and rows[-1].get("stage") == stage and len(rows) < len(worker.stages):
                    stage = worker.stages[len(rows)]
                rows.append({"stage": stage, "passed": False, "reason": reason, "detail": detail})
            self._finish(worker, rows)
        self._replace(worker)


def event_problem(worker: WorkerProcess, event: dict[str, Any]) -> str:
    """Why ``event`` is not a line this worker may send now; "" when it is."""
    kind = event.get("event")
    if worker.task is None or event.get("task_id") != worker.task.id:
        return ""  # not about the running candidate: ignored by ``_apply``
    done = len(worker.verdicts)
    expected = worker.stages[done] if done < len(worker.stages) else None
    if kind == "verdict":
        return protocol.row_problem(event.get("verdict"), expected, worker.harness)
    pid = event.get("pid")
    if kind == "started" and not (type(pid) is int and 0 < pid < MAX_PID):
        return "'started' without a process id"
    if kind == "stage" and event.get("stage") not in worker.stages:
        return f"unknown stage {event.get('stage')!r}"
    if kind == "result":
        rows = event.get("verdicts")
        if not isinstance(rows, list) or len(rows) > len(worker.stages):
            return "'verdicts' must be a list with at most one row per stage"
        for stage, row in zip(worker.stages, rows, strict=False):
            problem = protocol.row_problem(row, stage, worker.harness)
            if problem:
                return problem
        prepare_s = event.get("prepare_s") or 0.0
        if not isinstance(prepare_s, (int, float)) or not 0 <= prepare_s < 1e6:
            return f"'prepare_s' out of range: {prepare_s!r}"[:200]
    return ""


def _count_retirement(counts: dict[str, int], finding: str, distinct: int = 20) -> None:
    """Count a retired process under its audit finding, numbers masked so that findings of
    one kind add up; past ``distinct`` kinds the rest count as "other"."""
    key = re.sub(r"\b\d+\b", "N", finding)[:120]
    if key not in counts and len(counts) >= distinct:
        key = "other"
    counts[key] = counts.get(key, 0) + 1
