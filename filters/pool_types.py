"""What the worker pool's modules share (``filters.pool``): a job, a queued batch of jobs
(``Ticket``), a started worker process as the pool holds it, and the pool's one error.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from opsynth.filters import harness as harnesses
from opsynth.filters import reasons
from opsynth.record import Verdict

Progress = Callable[[int, int], None]


class Job(Protocol):
    """What a worker evaluates: a Task, or any object with an id and code (and files)."""

    id: str
    code: str


@dataclass(eq=False)
class Ticket:
    """A queued batch: its jobs by id, what its check settings change from the pool's (the
    pool's own are known once it has started), and the verdicts gathered so far (filled by
    whichever call drives the pool)."""

    jobs: dict[str, Job]
    overrides: dict[str, Any]
    progress: Progress | None = None
    results: dict[str, list[Verdict]] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return len(self.results) >= len(self.jobs)


# A worker's stdout and stderr, in its own folder: read back when it dies or fails to start.
WORKER_LOG = "worker.log"


def log_path(directory: str) -> str:
    return os.path.join(directory, WORKER_LOG)


class PoolError(RuntimeError):
    """The pool cannot run candidates at all (no worker starts)."""


@dataclass
class WorkerProcess:
    """One started worker process as the pool holds it: its slot and GPU, the sandbox kind it
    runs in, its pipes and folder, its state, and the candidate it runs now with the verdict
    rows that candidate has reported so far. A replacement is a new one in the same slot."""

    slot: int
    gpu: str | None
    kind: str
    proc: subprocess.Popen[bytes]
    to_fd: int
    from_fd: int
    directory: str
    started_at: float
    state: str = "starting"  # starting -> idle <-> busy -> gone
    info: dict[str, Any] = field(default_factory=dict)
    buffer: bytearray = field(default_factory=bytearray)
    served: int = 0
    task: Job | None = None
    ticket: Ticket | None = None
    deadline: float = 0.0
    stage: str = reasons.STAGES[0]
    stages: tuple[str, ...] = reasons.STAGES
    harness: harnesses.Harness = harnesses.FILTERS
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    child_pid: int | None = None

    @property
    def log_path(self) -> str:
        return log_path(self.directory)
