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

Here: the protocol loop, the requests (eval, calibrate, release), a job's run in a child and
the judge's conversation with it. The child's own side is ``filters.child_main``, the worker's
hold on its children (forking, handing over, the prestarted and the kept one)
``filters.children``, and its watch over the running one ``filters.watchdog``.

Standard library and torch only (torch imported lazily, in ``Worker.serve``): this file must
run on GPU hosts that have nothing else installed; so must the modules above.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

from opsynth.filters import child_main, compile_cache, protocol
from opsynth.filters import harness as harnesses
from opsynth.filters.childio import (
    PR_SET_CHILD_SUBREAPER,
    PR_SET_DUMPABLE,
    PR_SET_PDEATHSIG,
    exit_failure,
    failed_row,
    inside,
    log_tail,
    prctl,
    read_line,
    reusable_for,
    write_all,
)
from opsynth.filters.children import HANDSHAKE_S, Child, Children
from opsynth.filters.harness import CODE_FILE
from opsynth.filters.judge import JudgeContext, Peer, PeerFailure
from opsynth.filters.watchdog import Supervised, Watchdog, wipe

LOG_FILE = "output.log"

# torch's message when a forked child uses CUDA after the parent touched the CUDA runtime.
FORK_POISONED = "Cannot re-initialize CUDA in forked subprocess"


class Worker:
    """One worker process: the protocol loop, the child runner and the judge; its children
    are held by ``children`` and watched by ``watchdog``."""

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
        # The prestarted child, the kept one, and how the last one started.
        self.children = Children(self._child, prestart)
        # What the running child's report pipe held past ``done``.
        self._leftover = b""
        # Why the running child broke the protocol ("" while it has not).
        self.violation = ""
        # Why the last candidate's process was not kept for the next one, though it could have
        # been (the audit's first finding, "census" or "no audit"); "" when kept or not eligible.
        self.last_retired = ""
        # Seconds the last candidate waited for its process's audit baseline.
        self.last_prepare_s = 0.0
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
        self.watchdog = Watchdog(self.children, self.private_pidns, os.sysconf("SC_PAGE_SIZE"))
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
            self.children.discard_spare()
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
        """Kill the processes waiting for a next candidate (``Children.release``)."""
        return self.children.release()

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

        def after_done(child: Child, job: dict[str, Any]) -> tuple[str, str] | None:
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
            "child": self.children.last_child,
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

    # ------------------------------------------------------------------------ child runner

    def run_child(
        self,
        job: dict[str, Any],
        on_event: Callable[[dict[str, Any]], None] | None = None,
        code: str | None = None,
        files: dict[str, str] | None = None,
        after_done: Callable[[Child, dict[str, Any]], tuple[str, str] | None] | None = None,
    ) -> tuple[dict[str, Any], tuple[str, str] | None, bool]:
        """Run ``job`` in a child (the prestarted one, or a fresh fork); supervise it until it
        reports ``done``, dies, or crosses a limit; then kill everything it started. Returns
        the merged payload of its ``info``-like events, the failure (reason, detail) if it did
        not finish, and whether every process it started was reaped."""
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
        child, started = self.children.reuse_kept(job)
        if child is None:
            child, started = self.children.start(job)
        payload: dict[str, Any] = {}
        failure: tuple[str, str] | None = ("filter_error", "the candidate process did not start")
        keep = False
        self.last_retired = self.violation = ""
        self.last_prepare_s = 0.0
        try:
            if started is not None:
                child.served += 1
                if on_event:
                    on_event({"event": "started", "pid": child.pid})
                watched = self.watchdog.supervise(
                    child.pid,
                    child.report_fd,
                    settings,
                    log_path,
                    on_event,
                    started,
                    may_prepare=child.served == 1 and reusable,
                )
                payload, failure = self._keep(watched)
                self.last_prepare_s = watched.prepare_s  # the job's first process, not a judge's
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
                self.children.kept, clean = child, True
            else:
                child.close()
                clean = self.watchdog.kill_all(child.pid)
        if failure and failure[0] in ("crashed", "exited"):
            tail = log_tail(log_path)
            if tail:
                failure = (failure[0], f"{failure[1]}; output tail: {tail}")
        wipe(self.tmp, self.private_pidns)
        return payload, failure, clean

    def _keep(self, watched: Supervised) -> tuple[dict[str, Any], tuple[str, str] | None]:
        """Keep what a supervised child reported past ``done`` (its audit, read by
        ``_audit_finding`` and the judge); its payload and failure."""
        self._leftover = watched.leftover
        return watched.payload, watched.failure

    # ------------------------------------------------------------------------ the judge

    def _judge(
        self,
        harness: harnesses.Harness,
        child: Child,
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
        spawned: list[Child] = []

        def peer(of: Child, pending: bytes = b"") -> Peer:
            def tick() -> tuple[str, str] | None:
                done_pid, status = os.waitpid(of.pid, os.WNOHANG)
                if done_pid:
                    of.reaped = True
                    return exit_failure(status, job["log_path"], settings)
                return self.watchdog.limits(of.pid, job["log_path"], settings)

            return Peer(
                of.go_fd,
                of.report_fd,
                deadline=deadline,
                tick=tick,
                pending=pending,
                known=harness.known,
            )

        def spawn(**overrides: Any) -> Peer:
            started_job = {**job, "settings": {**settings, **overrides}}
            other, started = self.children.start(started_job)
            spawned.append(other)
            if started is None:
                raise PeerFailure("filter_error", "the judge's second process did not start")

            def no_verdicts(event: dict[str, Any]) -> None:
                if event.get("event") == "verdict":
                    self.violation = "a judged process reported a verdict of its own"

            _, failure = self._keep(
                self.watchdog.supervise(
                    other.pid,
                    other.report_fd,
                    started_job["settings"],
                    job["log_path"],
                    no_verdicts,
                    started,
                )
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
                self.watchdog.kill_all(other.pid)
        return None

    # ------------------------------------------------------------------------ its children

    def _audit_finding(self, child: Child) -> str:
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
        procs = self.watchdog.census(child.pid)
        return "" if [proc for proc, _, _ in procs] == [child.pid] else "census"

    def _child(
        self, go_fd: int, report_fd: int, parent_fds: list[int]
    ) -> None:  # pragma: no cover - runs in the child
        """What a forked child runs (``filters.child_main``): it closes its own parent-side
        ends, those of every other child (the running candidate's) and the worker's."""
        inherited = [*parent_fds, *self.children.fds, self.in_fd, self.out_fd]
        child_main.main(go_fd, report_fd, inherited, self.device, self.device_init)


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
    prctl(PR_SET_DUMPABLE, 0)
    # Subreaper: processes the candidate orphans are re-parented to us, so we can kill them.
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
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
