"""The warm worker: imports torch once, then forks one short-lived child per candidate.

Run as ``python -P -m opsynth.filters.worker --in FD --out FD --device cpu|cuda --host-pidns NS
[--prestart]`` inside the sandbox (see ``filters.sandbox``). It speaks JSON lines with the
orchestrator over the two inherited pipe fds, never over stdout.

Why a child per candidate: a candidate may patch torch, leak threads or memory, or poison a
CUDA context; all of that dies with its child, and the next candidate starts from the clean
parent. The parent never initialises CUDA (a forked child cannot use a CUDA context created
before the fork), so each child initialises the device itself.

Why a prestarted child (``--prestart``): creating a CUDA context takes seconds when many
workers share a GPU. So while one candidate runs, the worker forks the next child, which
creates its context and then waits, having run nothing else, for its job on a private pipe.
The running candidate cannot get at it: children are non-dumpable (no /proc/PID/mem, no
ptrace), the waiting child holds none of the running one's fds, and the watchdog leaves it
out of the candidate's census and kill. What a candidate *can* do, kill or stop it, is caught
before use: a waiting child that is gone, stopped, or does not accept its job within
``HANDSHAKE_S`` is discarded and the job goes to a freshly forked one.

The child: starts a new session, gets rlimits (address space on CPU only, since CUDA maps a
huge virtual range; CPU time; file size; processes), has stdout/stderr sent to a file in its
own temp dir and the protocol fds closed, and reports over a private pipe. The parent enforces
the wall-clock limit and watches the child's processes, threads, resident memory and output
size, killing everything the candidate started when a limit is crossed or the candidate ends.

Standard library and torch only (imported lazily in ``main``): this file must run on GPU hosts
that have nothing else installed.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import json
import os
import select
import shutil
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

from opsynth.filters import compile_cache, protocol
from opsynth.filters import harness as harnesses
from opsynth.filters.childio import (
    MAX_LINE_BYTES,
    Emitter,
    apply_limits,
    drain,
    exit_failure,
    failed_row,
    inside,
    log_tail,
    proc_stat,
    read_job,
    read_line,
    reusable_for,
    state,
    write_all,
)
from opsynth.filters.harness import CODE_FILE
from opsynth.filters.judge import JudgeContext, Peer, PeerFailure

Emit = Callable[[dict[str, Any]], None]
Target = Callable[[Emit], Any]
# The child's report of having read its job: it has run nothing of the job yet.
ACCEPTED = b'{"event": "accepted"}\n'

# How often the parent checks the child's clock, processes, memory and output (seconds).
POLL_S = 0.02
# Outside a private PID namespace the census scans every process on the host; do it less often.
HOST_CENSUS_S = 0.1
# Seconds to wait for killed processes to be reaped before giving up on this worker.
REAP_S = 10.0
# A waiting child accepts its job within this, or it is discarded for a fresh one.
HANDSHAKE_S = 10.0
# How long the kill after a candidate spares the waiting child before killing everything.
SPARE_KILL_S = 2.0
LOG_FILE = "output.log"

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36

# torch's message when a forked child uses CUDA after the parent touched the CUDA runtime.
FORK_POISONED = "Cannot re-initialize CUDA in forked subprocess"


def _prctl(option: int, value: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(option, value, 0, 0, 0)


class _Child:
    """A forked child as the parent sees it: its pid and the parent's ends of its two pipes
    (the job it is sent, the reports it writes)."""

    def __init__(self, pid: int, go_fd: int, report_fd: int, registry: set[int]) -> None:
        self.pid = pid
        self.go_fd = go_fd
        self.report_fd = report_fd
        self.reaped = False
        self.served = 0  # candidates this process has taken
        self._registry = registry
        registry.update((go_fd, report_fd))

    def close(self) -> None:
        for fd in (self.go_fd, self.report_fd):
            if fd in self._registry:
                self._registry.discard(fd)
                with contextlib.suppress(OSError):
                    os.close(fd)


class Worker:
    """One worker process: the protocol loop, the child runner and the watchdog."""

    def __init__(
        self,
        in_fd: int,
        out_fd: int,
        device: str,
        host_pidns: str,
        preimport: bool = True,
        prestart: bool = False,
    ) -> None:
        self.preimport = preimport
        self.prestart = prestart
        # The prestarted child, waiting for its job; and the parent-side fds of all children.
        self._spare: _Child | None = None
        # The child kept after its candidate passed the audit, waiting for the next job; and
        # what its report pipe held past ``done``.
        self._kept: _Child | None = None
        self._leftover = b""
        self._child_fds: set[int] = set()
        # How the last child started: prestarted, fresh (none was waiting), replaced (the
        # waiting one was gone or stopped), refused (it exited instead of accepting the job:
        # its CUDA init had failed) or unresponsive (alive, but no answer within HANDSHAKE_S).
        self.last_child = ""
        # Why the running child broke the protocol ("" while it has not).
        self.violation = ""
        # Why the last candidate's process was not kept for the next one, though it could have
        # been (the audit's first finding, "census" or "no audit"); "" when kept or not eligible.
        self.last_retired = ""
        # Seconds the last candidate waited for its process's audit baseline.
        self.last_prepare_s = 0.0
        self._refusal = ""
        self.in_fd = in_fd
        self.out_fd = out_fd
        self.device = device
        self.tmp = os.environ.get("TMPDIR") or "/tmp"
        # The read-only compile-cache layer every candidate reads (filters.compile_cache).
        self.trusted_cache = os.environ.get(compile_cache.TRUSTED_ENV, "")
        self.private_pidns = (
            bool(host_pidns)
            and os.readlink("/proc/self/ns/pid") != host_pidns
            and os.getppid() == 1
        )
        self.count = 0
        self.page_size = os.sysconf("SC_PAGE_SIZE")
        self._reader = os.fdopen(in_fd, "rb", buffering=1 << 16, closefd=False)

    # ------------------------------------------------------------------------ protocol

    def send(self, message: dict[str, Any]) -> None:
        write_all(self.out_fd, (json.dumps(message) + "\n").encode())

    def serve(self) -> None:
        start = time.perf_counter()
        import torch  # noqa: F401  (warm: imported once, inherited by every child)

        if self.preimport:
            # torch.compile's machinery takes seconds to import; do it once, here, with the
            # modules the trusted layer saw a first compile import (``preimport``). Some torch
            # versions ask CUDA for its device count while importing it, which makes a forked
            # child unable to use CUDA; the NVML-based check (PYTORCH_NVML_BASED_CUDA_CHECK,
            # set by the pool) avoids that, and the probe below catches it where it does not.
            with contextlib.suppress(ImportError):
                import torch._dynamo  # noqa: F401
                import torch._inductor.compile_fx  # noqa: F401
        import torch._inductor.codecache  # noqa: F401

        preimported = compile_cache.preimport(self.trusted_cache) if self.preimport else 0
        vec_isa = compile_cache.adopt_vec_isa(self.trusted_cache)
        locks = os.path.join(self.tmp, compile_cache.PRIVATE, "header-locks")
        compile_cache.use_trusted_headers(self.trusted_cache, locks)

        from opsynth.filters import checks, device_init

        self.checks, self.device_init = checks, device_init
        import_s = time.perf_counter() - start
        info, failure, _ = self.run_child({"kind": "probe", "settings": {"device": self.device}})
        if failure and self.preimport and FORK_POISONED in failure[1]:
            self._discard_spare()
            # Start over as a fresh process that imports only torch before forking.
            os.execv(sys.executable, [*sys.orig_argv, "--no-preimport"])
        ready: dict[str, Any] = {
            "event": "ready",
            "pid": os.getpid(),
            "private_pidns": self.private_pidns,
            "import_s": round(import_s, 3),
            "preimported": preimported,
            "vec_isa": vec_isa,
            **info,
        }
        if failure or "device_name" not in info:
            reason, detail = failure or ("crashed", "device probe reported nothing")
            ready["error"] = f"device probe failed ({reason}): {detail}"
        self.send(ready)
        try:
            while True:
                line = self._reader.readline()
                if not line:
                    return
                message = json.loads(line)
                op = message.get("op")
                if op == "eval":
                    self.send(self.evaluate(message))
                elif op == "calibrate":
                    self.send(self.calibrate(message))
                elif op == "release":
                    self.send({"event": "released", "count": self.release()})
                elif op == "exit":
                    return
        finally:
            self.release()

    # ------------------------------------------------------------------------ operations

    def release(self) -> int:
        """Kill the processes waiting for a next candidate (the prestarted spare, the child
        kept for reuse): on CUDA each holds a context and the kept one its cached memory, which
        a candidate retried alone must not share the device with. The next candidate forks
        afresh. How many there were."""
        waiting = (self._spare is not None) + (self._kept is not None)
        self._discard_spare()
        kept, self._kept = self._kept, None
        self._discard(kept)
        return waiting

    def evaluate(self, message: dict[str, Any]) -> dict[str, Any]:
        task_id = message["task_id"]
        settings = message["settings"]
        code = message["code"]
        verdicts: list[dict[str, Any]] = []
        harness = harnesses.of_settings(settings)
        stages = harnesses.stages_of(settings, harness)
        judged = [stage for stage in stages if stage in harness.judged]
        current = {"stage": stages[0]}

        def on_event(event: dict[str, Any], trusted: bool = False) -> None:
            kind = event.get("event")
            expected = stages[len(verdicts)] if len(verdicts) < len(stages) else None
            if kind == "stage" and event.get("stage") == expected:
                current["stage"] = expected
                self.send({"event": "stage", "task_id": task_id, "stage": expected})
            elif kind == "verdict":
                if verdicts and not verdicts[-1]["passed"]:
                    return
                row = event.get("verdict")
                problem = protocol.row_problem(row, expected, harness)
                if expected in judged and not trusted:
                    problem = f"reported a verdict for {expected}, which only the judge reports"
                if problem:
                    self.violation = problem
                    row = failed_row(expected or stages[-1], "protocol_violation", problem)
                verdicts.append(row)
                self.send({"event": "verdict", "task_id": task_id, "verdict": row})
            elif kind == "started" and isinstance(event.get("pid"), int):
                self.send({"event": "started", "task_id": task_id, "pid": event["pid"]})

        def after_done(child: _Child, job: dict[str, Any]) -> tuple[str, str] | None:
            """The judge's turn, once the child's own stages passed (``filters.judge``)."""
            own = [stage for stage in stages if stage not in judged]
            if len(verdicts) != len(own) or not all(v["passed"] for v in verdicts):
                return None
            return self._judge(harness, child, job, on_event)

        files = message.get("files") or {}
        job = {"kind": "eval", "settings": settings, "judged": bool(judged)}
        _, failure, clean = self.run_child(
            job, on_event, code=code, files=files, after_done=after_done if judged else None
        )
        complete = len(verdicts) == len(stages) or bool(verdicts and not verdicts[-1]["passed"])
        if not complete:
            # The stage that was running; if it had already reported a pass, the next one.
            stage = current["stage"]
            if verdicts and verdicts[-1]["stage"] == stage:
                stage = stages[len(verdicts)]
            reason, detail = failure or ("exited", "the candidate process ended without reporting")
            verdicts.append(failed_row(stage, reason, detail))
        replace = not clean or any(v["reason"] == "cuda_error" for v in verdicts)
        return {
            "event": "result",
            "task_id": task_id,
            "verdicts": verdicts,
            "replace": replace,
            "child": self.last_child,
            "retired": self.last_retired,
            "prepare_s": round(self.last_prepare_s, 3),
        }

    def calibrate(self, message: dict[str, Any]) -> dict[str, Any]:
        job = {"kind": "calibrate", "settings": message.get("settings", {})}
        result, failure, clean = self.run_child(job)
        reply: dict[str, Any] = {"event": "calibration", "results": result.get("results", {})}
        if failure:
            reply["error"] = f"{failure[0]}: {failure[1]}"
        reply["replace"] = not clean
        return reply

    def _target(self, job: dict[str, Any]) -> Target:
        """What a child runs for ``job``; built in the child, which may have been forked before
        its job was known."""
        kind, settings = job["kind"], job["settings"]

        def probe(emit: Emit) -> None:
            emit({"event": "info", **self.device_init.device_info(self.device)})
            emit({"event": "done"})

        def calibrate(emit: Emit) -> None:
            from opsynth.filters.calibrate import calibration_benchmark

            emit({"event": "calibration", "results": calibration_benchmark(self.device)})
            emit({"event": "done"})

        def evaluate(emit: Emit) -> Any:
            return harnesses.of_settings(settings).function()(os.getcwd(), settings, emit)

        return {"probe": probe, "calibrate": calibrate, "eval": evaluate}[kind]

    # ------------------------------------------------------------------------ child runner

    def run_child(
        self,
        job: dict[str, Any],
        on_event: Callable[[dict[str, Any]], None] | None = None,
        code: str | None = None,
        files: dict[str, str] | None = None,
        after_done: Callable[[_Child, dict[str, Any]], tuple[str, str] | None] | None = None,
    ) -> tuple[dict[str, Any], tuple[str, str] | None, bool]:
        """Run ``job`` in a child (the prestarted one, or a fresh fork); supervise it until it
        reports ``done``, dies, or crosses a limit; then kill everything it started. Returns
        the merged payload of its ``info``-like events, the failure (reason, detail) if it did
        not finish, and whether every process it started was reaped."""
        self.count += 1
        settings = job["settings"]
        # A fixed path (wiped between candidates): compile caches key on source file names.
        workdir = os.path.join(self.tmp, "candidate")
        os.makedirs(workdir, exist_ok=True)
        # Each candidate's compile caches start empty but for links to the trusted layer.
        triton = os.environ.get("TRITON_CACHE_DIR")
        if self.trusted_cache and triton:
            compile_cache.link_trusted(self.trusted_cache, triton)
        if code is not None:
            with open(os.path.join(workdir, CODE_FILE), "w") as fh:
                fh.write(code)
        for relative, text in (files or {}).items():
            path = inside(workdir, relative)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as fh:
                fh.write(text)
        log_path = os.path.join(workdir, LOG_FILE)
        job = {**job, "workdir": workdir, "log_path": log_path}
        reusable = reusable_for(settings)
        child, started = self._reuse_kept(job)
        if child is None:
            child, started = self._start_child(job)
        payload: dict[str, Any] = {}
        failure: tuple[str, str] | None = ("filter_error", "the candidate process did not start")
        keep = False
        self.last_retired = self.violation = ""
        try:
            if started is not None:
                child.served += 1
                if on_event:
                    on_event({"event": "started", "pid": child.pid})
                payload, failure = self._supervise(
                    child.pid,
                    child.report_fd,
                    settings,
                    log_path,
                    on_event,
                    started,
                    may_prepare=child.served == 1 and reusable,
                )
                if failure is None and after_done is not None:
                    failure = after_done(child, job)
                per_process = int(settings.get("candidates_per_process", 1))
                if self.violation:  # never trusted with another candidate
                    self.last_retired = "protocol_violation"
                elif failure is None and reusable and child.served < per_process:
                    self.last_retired = self._audit_finding(child)
                    keep = not self.last_retired
        finally:
            if keep:
                self._kept, clean = child, True
            else:
                child.close()
                clean = self._kill_all(child.pid)
        if failure and failure[0] in ("crashed", "exited"):
            tail = log_tail(log_path)
            if tail:
                failure = (failure[0], f"{failure[1]}; output tail: {tail}")
        self._wipe()
        return payload, failure, clean

    # ------------------------------------------------------------------------ the judge

    def _judge(
        self,
        harness: harnesses.Harness,
        child: _Child,
        job: dict[str, Any],
        on_event: Callable[..., None],
    ) -> tuple[str, str] | None:
        """Run ``harness``'s judge here, in the worker, against ``child`` (which reported
        ``done`` and now serves requests) and any child the judge starts for this job; the
        judge reports the judged stages' rows itself. A failure of a child on the way (it
        broke the protocol, died, hit a limit, ran out of time) is returned for the stage the
        judge was in. Every child it started is killed before this returns."""
        settings = job["settings"]
        deadline = time.monotonic() + float(settings.get("task_timeout_s", 60.0))
        spawned: list[_Child] = []

        def peer(of: _Child, pending: bytes = b"") -> Peer:
            def tick() -> tuple[str, str] | None:
                done_pid, status = os.waitpid(of.pid, os.WNOHANG)
                if done_pid:
                    of.reaped = True
                    return exit_failure(status, job["log_path"], settings)
                return self._watchdog(of.pid, job["log_path"], settings)

            return Peer(of.go_fd, of.report_fd, deadline=deadline, tick=tick, pending=pending)

        def spawn(**overrides: Any) -> Peer:
            started_job = {**job, "settings": {**settings, **overrides}}
            other, started = self._start_child(started_job)
            spawned.append(other)
            if started is None:
                raise PeerFailure("filter_error", "the judge's second process did not start")

            def no_verdicts(event: dict[str, Any]) -> None:
                if event.get("event") == "verdict":
                    self.violation = "a judged process reported a verdict of its own"

            _, failure = self._supervise(
                other.pid,
                other.report_fd,
                started_job["settings"],
                job["log_path"],
                no_verdicts,
                started,
            )
            if failure or self.violation:
                raise PeerFailure(*(failure or ("protocol_violation", self.violation)))
            return peer(other, self._leftover)

        first = peer(child, self._leftover)
        context = JudgeContext(first, settings, spawn, on_event)
        try:
            harness.judge_function()(context)  # type: ignore[misc]
            context.end(first)
            self._leftover = bytes(first.buffer)
        except PeerFailure as failure:
            if failure.reason == "protocol_violation":
                self.violation = failure.detail
            return failure.reason, failure.detail
        except Exception:  # a bug of the judge's, not the candidate's: this job fails alone
            self.violation = "the judge failed"  # its process is not trusted with another job
            return "filter_error", "the judge raised: " + traceback.format_exc()[-1500:]
        finally:
            for other in spawned:
                other.close()
                self._kill_all(other.pid)
        return None

    # ------------------------------------------------------------------------ children

    def _start_child(self, job: dict[str, Any]) -> tuple[_Child, bytes | None]:
        """Hand ``job`` to the prestarted child, else a fresh fork; fork the next spare."""
        child, spare, self._spare = self._spare, True, None
        self.last_child = "prestarted"
        if child is None or not self._waiting(child):
            self.last_child = "fresh" if child is None else "replaced"
            self._discard(child)
            child, spare = self._fork_child(), False
        started = self._hand_over(child, job, refusable=spare)
        if started is None and spare:
            self.last_child = self._refusal
            self._discard(child)
            child = self._fork_child()
            started = self._hand_over(child, job, refusable=False)
        if self.prestart:
            with contextlib.suppress(OSError):  # no fork to spare (a process limit): go without
                self._spare = self._fork_child()
        return child, started

    def _reuse_kept(self, job: dict[str, Any]) -> tuple[_Child | None, bytes | None]:
        """Hand ``job`` to the child kept from the last candidate, if there is one and it
        takes it; its context is ready, and the spare stays spare."""
        child, self._kept = self._kept, None
        if child is None:
            return None, None
        if self._waiting(child):
            started = self._hand_over(child, job, refusable=False)
            if started is not None:
                self.last_child = "reused"
                return child, started
        self._discard(child)
        return None, None

    def _audit_finding(self, child: _Child) -> str:
        """After a candidate that finished, why its process may not take the next one ("" if
        it may): it must report its own audit (``filters.state_audit``) within
        ``HANDSHAKE_S``, and nothing but the process itself may be left of the candidate (no
        other process, no extra thread the audit could not see)."""
        line = read_line(child.report_fd, time.monotonic() + HANDSHAKE_S, self._leftover)
        try:
            audit = json.loads(line) if line else {}
        except ValueError:
            audit = {}
        if not (isinstance(audit, dict) and audit.get("event") == "audit"):
            return "no audit"
        if audit.get("reusable") is not True:
            why = audit.get("why") or ["not reusable"]
            return str(why[0])[:200]
        procs = self._census(child.pid)
        return "" if [proc for proc, _, _ in procs] == [child.pid] else "census"

    def _fork_child(self) -> _Child:
        """Fork a child that waits for its job; on CUDA it creates its context meanwhile. It
        compiles nothing before its job (the audit's baseline included): until then it shares
        the worker's temp dir, compile cache and all, with the candidate running now, which
        could plant there what such a compile would load."""
        go_read, go_write = os.pipe()
        report_read, report_write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            self._child(go_read, report_write, [go_write, report_read])
        os.close(go_read)
        os.close(report_write)
        return _Child(pid, go_write, report_read, self._child_fds)

    def _waiting(self, child: _Child) -> bool:
        """The prestarted child is alive and not stopped (a candidate could have done either)."""
        try:
            if os.waitpid(child.pid, os.WNOHANG)[0]:
                child.reaped = True
                return False
        except ChildProcessError:
            child.reaped = True
            return False
        return state(child.pid) not in ("", "T", "t", "Z", "X")

    def _hand_over(self, child: _Child, job: dict[str, Any], *, refusable: bool) -> bytes | None:
        """Send ``job``; wait for the child to accept it. The bytes it reported after
        accepting, or None if it did not: it is gone or exited (``_refusal`` "refused") or
        gave no answer in time ("unresponsive")."""
        self._refusal = "refused"
        try:
            write_all(child.go_fd, (json.dumps({**job, "refusable": refusable}) + "\n").encode())
        except OSError:
            return None
        received = b""
        deadline = time.monotonic() + HANDSHAKE_S
        while len(received) < len(ACCEPTED):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([child.report_fd], [], [], left)[0]:
                self._refusal = "unresponsive"
                return None
            chunk = os.read(child.report_fd, 1 << 16)
            if not chunk:
                return None
            received += chunk
        if not received.startswith(ACCEPTED):
            return None
        return received[len(ACCEPTED) :]

    def _discard(self, child: _Child | None) -> None:
        if child is None:
            return
        child.close()
        if not child.reaped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)
            deadline = time.monotonic() + REAP_S
            while time.monotonic() < deadline:
                try:
                    if os.waitpid(child.pid, os.WNOHANG)[0]:
                        break
                except ChildProcessError:
                    break
                time.sleep(0.005)
            child.reaped = True

    def _discard_spare(self) -> None:
        spare, self._spare = self._spare, None
        self._discard(spare)

    def _child(
        self, go_fd: int, report_fd: int, parent_fds: list[int]
    ) -> None:  # pragma: no cover - runs in the child
        status = 0
        try:
            os.setsid()
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            # Default dispositions first: a signal the running candidate sends us now takes
            # effect at once, so the parent sees it before handing us a job.
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGXFSZ, signal.SIGXCPU):
                signal.signal(sig, signal.SIG_DFL)
            # Our own parent-side ends, and those of every other child (the running candidate's).
            for fd in (*parent_fds, *self._child_fds, self.in_fd, self.out_fd):
                with contextlib.suppress(OSError):
                    os.close(fd)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.close(null)
            early = self.device_init.start_device_init(self.device)
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
                        state_audit.prepare(self.device)
                        baseline = state_audit.snapshot(self.device)
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
                apply_limits(settings, self.device, reuse=reuse)
                os.chdir(workdir)
                os.environ["TMPDIR"] = workdir
                try:
                    served_by = self._target(job)(emitter.emit)
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
                why = state_audit.after_candidate(baseline, settings, self.device)
                emitter.emit({"event": "audit", "reusable": not why, "why": why[:20]})
                if why:
                    break
        except BaseException:
            status = 70
            with contextlib.suppress(BaseException):
                traceback.print_exc()
        finally:
            os._exit(status)

    def _supervise(
        self,
        pid: int,
        read_fd: int,
        settings: dict[str, Any],
        log_path: str,
        on_event: Callable[[dict[str, Any]], None] | None,
        initial: bytes = b"",
        may_prepare: bool = False,
    ) -> tuple[dict[str, Any], tuple[str, str] | None]:
        """``may_prepare``: the first job of a child that may take more; it first compiles the
        audit's tiny model (``filters.state_audit.prepare``) and reports ``prepared`` once:
        the candidate's time starts then. Preparing gets a timeout of its own, and running
        past it is the harness's failure, not the candidate's."""
        timeout = float(settings.get("task_timeout_s", 60.0))
        began = time.monotonic()
        deadline = began + timeout
        self.last_prepare_s = 0.0
        census_every = POLL_S if self.private_pidns else HOST_CENSUS_S
        self._leftover = b""  # what this child reports past ``done`` (its audit), if anything
        next_census = 0.0
        payload: dict[str, Any] = {}
        buffer = bytearray()
        pipe_open = True
        error: str | None = None

        def consume(chunk: bytes) -> bool:
            nonlocal error, deadline, may_prepare
            buffer.extend(chunk)
            while b"\n" in buffer:
                line, _, rest = bytes(buffer).partition(b"\n")
                buffer[:] = rest
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(event, dict):
                    continue
                kind = event.get("event")
                if kind == "done":
                    return True
                if kind == "prepared" and may_prepare:
                    may_prepare = False
                    now = time.monotonic()
                    deadline = now + timeout
                    self.last_prepare_s = now - began
                elif kind == "error":
                    error = str(event.get("detail", ""))[-1500:]
                elif kind in ("info", "calibration"):
                    payload.update({k: v for k, v in event.items() if k != "event"})
                elif on_event and kind != "started":  # only we say which process started
                    on_event(event)
            return False

        if initial and consume(initial):
            self._leftover = bytes(buffer)
            return payload, None
        while True:
            if pipe_open:
                ready, _, _ = select.select([read_fd], [], [], POLL_S)
                if ready:
                    chunk = os.read(read_fd, 1 << 16)
                    if not chunk:
                        pipe_open = False
                    elif consume(chunk):
                        self._leftover = bytes(buffer)
                        return payload, None
            else:
                time.sleep(POLL_S)
            if len(buffer) > MAX_LINE_BYTES:
                return payload, ("crashed", "the candidate wrote an oversized report line")
            done_pid, status = os.waitpid(pid, os.WNOHANG)
            if done_pid:
                if pipe_open and consume(drain(read_fd)):
                    return payload, None
                if error is not None:
                    return payload, ("filter_error", f"the check harness raised: {error}")
                return payload, exit_failure(status, log_path, settings)
            now = time.monotonic()
            if now >= next_census:
                next_census = now + census_every
                failure = self._watchdog(pid, log_path, settings)
                if failure:
                    return payload, failure
            if now > deadline and may_prepare:
                detail = "preparing the audit's baseline (a tiny torch.compile) took longer"
                return payload, ("filter_error", f"{detail} than task_timeout_s={timeout:g} s")
            if now > deadline:
                return payload, ("timeout", f"exceeded task_timeout_s={timeout:g} s")

    # ------------------------------------------------------------------------ watchdog

    def _census(self, pid: int) -> list[tuple[int, int, int]]:
        """(pid, threads, rss pages) of every process the candidate started (not the
        prestarted child, which is ours and has run nothing of the candidate's, nor what it
        started: the compiler its audit preparation runs, in its session, which the candidate
        cannot join)."""
        me = os.getpid()
        spare = self._spare.pid if self._spare else None
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            proc = int(name)
            if proc in (me, spare) or (self.private_pidns and proc == 1):
                continue
            stat = proc_stat(proc)
            if stat is None:
                continue
            ppid, pgrp, session, threads, rss = stat
            if spare is not None and session == spare:
                continue
            if self.private_pidns or session == pid or pgrp == pid or ppid == me:
                found.append((proc, threads, rss))
        return found

    def _watchdog(
        self, pid: int, log_path: str, settings: dict[str, Any]
    ) -> tuple[str, str] | None:
        procs = self._census(pid)
        tasks = sum(threads for _, threads, _ in procs)
        limit = int(settings.get("max_processes", 256))
        if tasks > limit:
            return ("resource_limit", f"{tasks} processes/threads > max_processes={limit}")
        rss = sum(pages for _, _, pages in procs) * self.page_size
        memory = int(settings.get("memory_limit_bytes", 8 << 30))
        if rss > memory:
            return (
                "resource_limit",
                f"resident memory {rss / 2**30:.2f} GiB > {memory / 2**30:.2f} GiB",
            )
        with contextlib.suppress(OSError):
            size = os.stat(log_path).st_size
            cap = int(settings.get("output_limit_bytes", 1 << 20))
            if size > cap:
                return ("output_flood", f"wrote {size} bytes to stdout/stderr > {cap}")
        return None

    def _kill_all(self, pid: int) -> bool:
        """Kill every process the candidate started and reap them; False if some would not die.
        The prestarted child is spared for ``SPARE_KILL_S``; if the candidate's processes are
        not all gone by then (a fork bomb racing the census), it goes too, and in a private
        PID namespace one ``kill(-1)`` takes everything at once."""
        deadline = time.monotonic() + REAP_S
        spare_until = time.monotonic() + SPARE_KILL_S
        while True:
            if self._spare and time.monotonic() >= spare_until:
                self._discard_spare()
            if self.private_pidns and not self._spare:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(-1, signal.SIGKILL)  # everything in our PID namespace but us and init
            else:
                for proc, _, _ in self._census(pid):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(proc, signal.SIGKILL)
            if self._reap(pid, min(deadline, time.monotonic() + 0.5)):
                return True
            if time.monotonic() >= deadline:
                return False

    def _reap(self, pid: int, deadline: float) -> bool:
        """Reap killed processes until none of the candidate's is left (True) or ``deadline``."""
        while True:
            try:
                reaped, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return True
            if reaped:
                if self._spare and reaped == self._spare.pid:
                    self._spare.reaped = True
                    self._discard_spare()
                continue
            if self._spare and not self._census(pid):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)

    def _wipe(self) -> None:
        """Empty the temp dirs between candidates so nothing one leaves is seen by the next."""
        dirs = [self.tmp] + (["/dev/shm"] if self.private_pidns else [])
        for directory in dirs:
            with contextlib.suppress(OSError):
                for entry in os.scandir(directory):
                    if os.path.ismount(entry.path):
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        with contextlib.suppress(OSError):
                            os.unlink(entry.path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in", dest="in_fd", type=int, required=True)
    parser.add_argument("--out", dest="out_fd", type=int, required=True)
    parser.add_argument("--device", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--host-pidns", default="")
    parser.add_argument("--no-preimport", dest="preimport", action="store_false")
    parser.add_argument("--prestart", action="store_true")
    args = parser.parse_args(argv)
    # Forking after torch started its own threads is what this worker is built on: the child
    # never relies on those threads, so Python 3.12's warning about it is noise in the log.
    warnings.filterwarnings(
        "ignore", message=".*use of fork\\(\\) may lead to deadlocks", category=DeprecationWarning
    )
    # Non-dumpable: a candidate (same uid) cannot open our fds through /proc or ptrace us.
    _prctl(PR_SET_DUMPABLE, 0)
    # Subreaper: processes the candidate orphans are re-parented to us, so we can kill them.
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    try:
        Worker(
            args.in_fd,
            args.out_fd,
            args.device,
            args.host_pidns,
            args.preimport,
            args.prestart,
        ).serve()
    except BrokenPipeError:
        return 0
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
