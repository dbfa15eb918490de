"""What a worker's forked child runs (``filters.worker``, forked by ``filters.children``): it
waits on its private pipe for a job, then takes a new session, rlimits, its own workdir and a
log file for stdout/stderr, runs the job's harness, serves the judge when the job is judged
(``filters.serve``), and, when its process may take further candidates, audits itself between
them (``filters.state_audit``).

Why the child starts its device before its job: creating a CUDA context takes seconds, and a
prestarted child does it while the previous candidate runs. It runs nothing else before its
job, and a child whose device start failed refuses a job it may refuse, which then goes to a
fresh one.

Standard library and torch only, like the worker; what a job needs is imported when it comes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import traceback
from collections.abc import Callable
from types import ModuleType
from typing import Any

from opsynth.filters import harness as harnesses
from opsynth.filters.childio import (
    PR_SET_PDEATHSIG,
    Emitter,
    apply_limits,
    prctl,
    read_job,
    reusable_for,
    write_all,
)

Emit = Callable[[dict[str, Any]], None]
Target = Callable[[Emit], Any]
# The child's report of having read its job: it has run nothing of the job yet.
ACCEPTED = b'{"event": "accepted"}\n'


def main(
    go_fd: int, report_fd: int, inherited: list[int], device: str, device_init: ModuleType
) -> None:  # pragma: no cover - runs in the child
    """The forked child's life, until it exits (it never returns): ``inherited`` are the fds
    it closes first (the parent's ends of its own pipes and every other child's, the worker's
    protocol fds); ``device_init`` is ``filters.device_init``, imported by the worker."""
    status = 0
    try:
        os.setsid()
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        # Default dispositions first: a signal the running candidate sends us now takes
        # effect at once, so the parent sees it before handing us a job.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGXFSZ, signal.SIGXCPU):
            signal.signal(sig, signal.SIG_DFL)
        # Our own parent-side ends, and those of every other child (the running candidate's).
        for fd in inherited:
            with contextlib.suppress(OSError):
                os.close(fd)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
        early = device_init.start_device_init(device)
        emitter = Emitter(report_fd)
        baseline = None
        served = 0
        while True:
            job = read_job(go_fd)
            if job is None:
                os._exit(0)
            if not served and job["refusable"] and early.done and early.failed:
                os._exit(75)  # refused: the parent hands the job to a fresh child
            write_all(report_fd, ACCEPTED)
            settings = job["settings"]
            reuse = reusable_for(settings)
            if not reuse and not job.get("judged"):
                os.close(go_fd)  # its last job: the candidate gets no way to the pipe
            if reuse and baseline is None:
                from opsynth.filters import state_audit

                try:
                    early.wait()  # its thread is gone before the state is recorded
                    state_audit.prepare(device)
                    baseline = state_audit.snapshot(device)
                except BaseException:  # the harness's failure: no candidate code ran yet
                    detail = "preparing the audit's baseline: " + traceback.format_exc()
                    emitter.emit({"event": "error", "detail": detail[-1500:]})
                    raise
                emitter.emit({"event": "prepared"})
            workdir = job["workdir"]
            log = os.open(job["log_path"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.close(log)
            apply_limits(settings, device, reuse=reuse)
            os.chdir(workdir)
            os.environ["TMPDIR"] = workdir
            try:
                served_by = target(job, device, device_init)(emitter.emit)
                if job.get("judged") and served_by:
                    from opsynth.filters.serve import serve

                    serve(go_fd, emitter.emit, *served_by)
                served_by = None  # the candidate's tensors go before the audit looks
            except BaseException:
                emitter.emit({"event": "error", "detail": traceback.format_exc()[-1500:]})
                raise
            served += 1
            if not reuse or served >= int(settings["candidates_per_process"]):
                break
            why = state_audit.after_candidate(baseline, settings, device)
            emitter.emit({"event": "audit", "reusable": not why, "why": why[:20]})
            if why:
                break
    except BaseException:
        status = 70
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        os._exit(status)


def target(job: dict[str, Any], device: str, device_init: ModuleType) -> Target:
    """What a child runs for ``job``; built in the child, which may have been forked before
    its job was known."""
    kind, settings = job["kind"], job["settings"]

    def probe(emit: Emit) -> None:
        emit({"event": "info", **device_init.device_info(device)})
        emit({"event": "done"})

    def calibrate(emit: Emit) -> None:
        from opsynth.filters.calibrate import calibration_benchmark

        emit({"event": "calibration", "results": calibration_benchmark(device)})
        emit({"event": "done"})

    def evaluate(emit: Emit) -> Any:
        return harnesses.of_settings(settings).function()(os.getcwd(), settings, emit)

    return {"probe": probe, "calibrate": calibrate, "eval": evaluate}[kind]
