"""One agent shell command inside bubblewrap.

The command sees the workdir (read-write, at its own path, as cwd; the protected files
read-only on top), the system read-only as far as Python, torch and the C++/CUDA toolchain
need it (the same binds as the filters' workers), and the project packages the commands use,
read-only at ``/opsynth``. It gets no network, its own PID namespace (when the command ends or
times out, everything it started dies with it), a private ``/tmp`` and an environment built
from an allow-list, so the trainer's API keys never reach it. It runs as an unprivileged uid
under the filters' seccomp filter (``filters.privilege``). There is no unsandboxed fallback:
when bubblewrap is missing or cannot start, the command is not run.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from opsynth.config import FiltersConfig
from opsynth.filters import privilege, sandbox
from opsynth.trainer.workdir import Workdir

PACKAGES = ("opsynth", "opsynth.filters", "opsynth.evaluator", "opsynth.trainer")
TMP_BYTES = 4 << 30
EXTRA_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
KILL_GRACE_S = 5.0
# The workdir is host disk: one runaway file (a log in a loop, a dump) must not fill it. The
# limit is set hard and the shell has no capabilities, so the command cannot raise it.
FILE_BYTES = 4 << 30
SHELL = 'ulimit -f {blocks} && exec bash --noprofile --norc -c "$1"'
PROBE_TIMEOUT_S = 60.0
# The host uid commands run as when the trainer runs as root: the filters' default (nobody).
SANDBOX_UID = FiltersConfig.model_fields["sandbox_uid"].default


@dataclass(frozen=True)
class Outcome:
    """``head`` + ``tail`` are the command's output (stdout and stderr interleaved) with
    ``dropped`` bytes between them discarded while reading, so a flood never fills memory."""

    head: str
    tail: str
    dropped: int
    returncode: int | None  # None: killed at the timeout
    unavailable: str = ""  # why the sandbox could not start ("" when it ran)


def has_gpu() -> bool:
    return any(name.startswith("nvidia") for name in os.listdir("/dev"))


def sandbox_env(workdir: Path, cuda_visible_devices: str | None = None) -> dict[str, str]:
    """The command's complete environment; nothing else of the trainer's leaks in. Compile
    caches live in the workdir so builds and ``torch.compile`` are reused across commands."""
    names = sandbox.PASSTHROUGH_ENV + EXTRA_ENV
    env = {name: os.environ[name] for name in names if name in os.environ}
    cache = os.path.join(workdir, ".cache")
    env.update(
        PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "/usr/bin")]),
        HOME="/tmp",
        TMPDIR="/tmp",
        USER="agent",
        LOGNAME="agent",
        TERM="dumb",
        PYTHONPATH=os.pathsep.join([sandbox.MOUNT_ROOT, *host_python_path()]),
        PYTHONNOUSERSITE="1",
        PYTHONDONTWRITEBYTECODE="1",
        TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"),
        TRITON_CACHE_DIR=os.path.join(cache, "triton"),
        TORCH_EXTENSIONS_DIR=os.path.join(cache, "torch_extensions"),
    )
    if cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    env.setdefault("LANG", "C.UTF-8")
    return env


def host_python_path() -> list[str]:
    """The folders of the trainer's own PYTHONPATH (a host may keep the project's dependencies
    there rather than in the interpreter's site-packages), read-only at the same paths in the
    shell, so the commands it runs import what the trainer imports. The project's root is not
    among them: its packages are bound on their own."""
    project = os.path.realpath(sandbox.PACKAGE_ROOT)
    found = {
        os.path.realpath(entry)
        for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if entry and os.path.isdir(entry)
    }
    return sorted(found - {project})


def sandbox_command(workdir: Workdir, command: list[str]) -> sandbox.Command:
    """bwrap with the filters' system binds, the project packages, the workdir read-write and
    its protected files read-only, entered as the unprivileged sandbox uid (when the trainer
    runs as root: the workdir is handed to that uid first) under the seccomp filter."""
    root = str(workdir.path.resolve())
    identity = privilege.sandbox_identity(SANDBOX_UID)
    if identity is not None:
        _hand_over(root, identity)
    args = sandbox.system_options(tmp_bytes=TMP_BYTES, gpu=has_gpu(), identity=identity)
    args += sandbox.package_binds(PACKAGES)
    for folder in host_python_path():
        args += ["--ro-bind", folder, folder]
    args += ["--bind", root, root]
    for rel in sorted(workdir.protected):
        path = os.path.join(root, rel)
        args += ["--ro-bind-try", path, path]
    options = [*sandbox.with_parent_dirs(args), "--remount-ro", "/", "--chdir", "/"]
    return sandbox.bwrap_command(options, command, identity=identity, cwd=root)


def _hand_over(root: str, identity: privilege.Identity) -> None:
    """Give the workdir to the sandbox uid so the command can write it (symlinks untouched)."""
    os.chown(root, identity.uid, identity.gid, follow_symlinks=False)
    for parent, dirs, files in os.walk(root):
        for name in dirs + files:
            os.chown(os.path.join(parent, name), identity.uid, identity.gid, follow_symlinks=False)


def run_bash(
    command: str,
    workdir: Workdir,
    timeout_s: float,
    keep_bytes: int,
    cuda_visible_devices: str | None = None,
) -> Outcome:
    """Runs ``bash -c command``; keeps the first and last ``keep_bytes`` of its output."""
    why = probe()
    if why:
        return Outcome("", "", 0, None, why)
    shell = ["bash", "--noprofile", "--norc", "-c"]
    env = sandbox_env(workdir.path.resolve(), cuda_visible_devices)
    try:
        launch = sandbox_command(
            workdir, [*shell, SHELL.format(blocks=FILE_BYTES >> 10), "agent", command]
        )
    except (OSError, privilege.SeccompUnavailable) as exc:
        return Outcome("", "", 0, None, f"the sandbox could not be prepared: {exc}")
    try:
        proc = subprocess.Popen(
            launch.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            pass_fds=launch.fds,
            start_new_session=True,
        )
    except OSError as exc:
        return Outcome("", "", 0, None, f"bwrap could not start: {exc}")
    finally:
        launch.close()
    deadline = time.monotonic() + timeout_s
    with proc.stdout:
        head, tail, dropped = _read(proc, deadline, keep_bytes)
    returncode = None
    try:  # the output can end before the command does (it may close its stdout)
        returncode = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill(proc)
    return Outcome(_text(head), _text(tail), dropped, returncode)


_probed = False


def probe() -> str:
    """Why bubblewrap cannot start Python with the project packages here; "" when it can. A
    success is remembered for the process, a failure is retried on the next command."""
    global _probed
    if _probed:
        return ""
    if not sandbox.bwrap_available():
        return "bwrap is not installed"
    why = privilege.seccomp_problem()
    if why:
        return why
    with tempfile.TemporaryDirectory(prefix="opsynth-probe-") as tmp:
        probe_wd = Workdir(Path(tmp), "probe", {})
        launch = sandbox_command(
            probe_wd, [sys.executable, "-P", "-c", "import opsynth.trainer.workdir"]
        )
        env = sandbox_env(Path(tmp))
        proc, why = sandbox.run_once(
            launch, env=env, cwd=None, timeout_s=PROBE_TIMEOUT_S, what="bwrap probe"
        )
    if proc is None:
        return why
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace")[-500:]
        return f"bwrap probe exited {proc.returncode}: {err}"
    _probed = True
    return ""


def _read(proc: subprocess.Popen, deadline: float, keep: int) -> tuple[bytes, bytes, int]:
    """(head, tail, bytes dropped between them), read until end of output or the deadline."""
    head, chunks, kept, dropped = bytearray(), deque(), 0, 0
    fd = proc.stdout.fileno()
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if not sel.select(timeout=min(left, 1.0)):
                continue
            data = os.read(fd, 1 << 16)
            if not data:
                break
            room = keep - len(head)
            if room > 0:
                head += data[:room]
                data = data[room:]
            if data:
                chunks.append(data)
                kept += len(data)
                while kept - len(chunks[0]) >= keep:
                    kept -= len(chunks[0])
                    dropped += len(chunks.popleft())
    tail = b"".join(chunks)
    dropped += max(0, len(tail) - keep)
    return bytes(head), tail[max(0, len(tail) - keep) :], dropped


def _text(data: bytes) -> str:
    return data.decode(errors="replace")


def _kill(proc: subprocess.Popen) -> None:
    """bwrap leads its process group; killing it takes down its PID namespace, and with it
    everything the command started."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
