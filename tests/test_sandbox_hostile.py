"""Hostile candidates, sent straight to the pool (the static check is bypassed on purpose).

Each must be rejected with its reason, its attack must not reach the host, the orchestrator
must survive, and good tasks in the same batch must still pass every stage.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from opsynth.config import FiltersConfig
from opsynth.filters import compile_cache, privilege, sandbox
from opsynth.filters.harness import FILTERS
from opsynth.filters.pool import LOCK_DIR, WorkerPool, isolation_problem, job_stages
from opsynth.filters.samples import GOOD, task_source
from opsynth.record import Task, Verdict

MARKER = f"opsynth-secret-{uuid.uuid4().hex}"
SECRET_ENV = "OPSYNTH_TEST_SECRET"
# Short enough to keep the runaway attacks cheap, long enough for a good task's torch.compile
# on a CPU in a fresh process (about 35 s even with a warm cache on some hosts and torch builds).
TIMEOUT_S = 60.0
# The wall-clock attacks' own limit: they only have to be killed at it.
SPIN_TIMEOUT_S = 8.0
CACHE = Path(__file__).resolve().parent.parent / ".cache" / "test-compile"
TOKEN = uuid.uuid4().hex[:12]


@dataclass(frozen=True)
class Hostile:
    name: str
    code: str
    reason: str
    stage: str | None = "eager"  # None: any stage (the watchdog fires whenever it looks)


@dataclass
class Host:
    """What the attacks aim at on the host, and what the test inspects afterwards."""

    root: Path
    cache_dir: Path
    port: int
    connections: list[Any]

    @property
    def secret_file(self) -> Path:
        return self.root / "secret.txt"

    def target(self, name: str) -> Path:
        return self.root / f"{name}.pwned"

    def heartbeat(self, kind: str) -> Path:
        return heartbeat_path(kind)


def heartbeat_dirs(kind: str) -> tuple[str, str]:
    """(host path, path in the candidate's sandbox) of the GPU lock dir of a ``kind`` pool:
    the one host folder a sandbox writes (as root, bwrap's is the sandbox uid's own)."""
    if kind == "rlimits":
        return LOCK_DIR, LOCK_DIR
    identity = privilege.sandbox_identity(FiltersConfig().sandbox_uid)
    host = LOCK_DIR
    if identity is not None:
        host = os.path.join(tempfile.gettempdir(), f"opsynth-gpu-locks-{identity.uid}")
    return host, sandbox.SANDBOX_LOCKS


def heartbeat_path(kind: str) -> Path:
    """Where the daemon attack's heartbeat lands on the host."""
    return Path(heartbeat_dirs(kind)[0]) / f"heartbeat-{kind}-{TOKEN}"


# Candidates that make their own process's checks pass: by patching the functions the checks
# call, or by writing every row themselves. Each fools its own stages; the worker's verify stage
# (filters.verify), which decides from seeds, samples and a clock outside the process, does not.
PATCH_CHECKS = "import sys\ncompare = sys.modules['opsynth.filters.compare']\n"
# What lets a zeros task through its own degenerate checks.
ZEROS_PASS_OWN_CHECKS = (
    PATCH_CHECKS + "compare.trivial_answer = lambda *a, **k: ''\n"
    "compare.rel_diff = lambda *a, **k: 1.0\n"
    "compare.real_view = lambda t: torch.arange(t.numel(), dtype=torch.float32)\n"
)


def refusing_every_request(reason: str) -> str:
    """A header whose task passes its own checks as zeros, then answers every request of the
    judge with a failure named ``reason``."""
    return (
        ZEROS_PASS_OWN_CHECKS + "serve = sys.modules['opsynth.filters.serve']\n"
        "class _Refusals(dict):\n"
        "    def __missing__(self, op):\n"
        "        def refuse(request):\n"
        f"            raise serve.Refusal({reason!r}, '')\n"
        "        return refuse\n"
        "serve.Runner.handlers = lambda self: _Refusals()\n"
    )


# Every stage the job runs, verify's included (``filters.pool.job_stages``).
FORGE_ROWS = """
import json, os
stages = JOB_STAGES
lines = [{'event': 'verdict', 'verdict': {'stage': s, 'passed': True, 'reason': 'ok',
          'detail': '', 'measures': {}}} for s in stages] + [{'event': 'done'}]
for fd in range(3, 256):
    try:
        os.write(fd, ''.join(json.dumps(line) + '\\n' for line in lines).encode())
    except OSError:
        pass
"""
FORGE_ROWS = FORGE_ROWS.replace("JOB_STAGES", repr(list(job_stages(FiltersConfig()))))


FORGE_HARNESS_ERROR = """
import json, os
for fd in range(3, 256):
    try:
        os.write(fd, (json.dumps({'event': 'error', 'detail': 'forged'}) + '\\n').encode())
    except OSError:
        pass
os._exit(1)
"""


def forgeries() -> list[Hostile]:
    t = task_source
    return [
        Hostile(
            "zeros_behind_patched_checks",
            t(
                "return torch.zeros_like(x)",
                header=ZEROS_PASS_OWN_CHECKS,
            ),
            "constant_output",
            stage="verify",
        ),
        Hostile(
            "random_behind_patched_checks",
            t(
                "return x + torch.rand_like(x)",
                header=PATCH_CHECKS + "compare.all_close = lambda *a, **k: True\n"
                "compare.max_abs_diff = lambda *a, **k: 0.0\n",
            ),
            "random",
            stage="verify",
        ),
        Hostile(
            "mutates_its_input_behind_patched_checks",
            t(
                "x.mul_(2.0)\n        return x * 1.5",
                header=PATCH_CHECKS + "compare.same_value = lambda *a: True\n"
                "compare.all_close = lambda *a, **k: True\n"
                "compare.max_abs_diff = lambda *a, **k: 0.0\n",
            ),
            "input_mutated",
            stage="verify",
        ),
        Hostile(
            "ignored_input_behind_patched_checks",
            t(
                "return x * 2.0",
                header=PATCH_CHECKS + "compare.rel_diff = lambda *a, **k: 1.0\n",
                signature="x, y",
                inputs="[torch.randn(64, 64), torch.randn(64, 64)]",
            ),
            "input_ignored",
            stage="verify",
        ),
        Hostile(
            # an ignored input drawn at another length each time, its own structure check
            # patched away: no draw's tensor of its shape to swap in, so only the structure
            # of verify's draws shows it
            "drawn_shape_input_behind_patched_checks",
            t(
                "return x * 2.0",
                header=PATCH_CHECKS + "checks = sys.modules['opsynth.filters.checks']\n"
                "checks.structure_mismatch = lambda *a, **k: ''\n",
                signature="x, y",
                inputs="[torch.randn(64, 64), torch.randn(int(torch.randint(1, 1 << 16, ())))]",
            ),
            "unstable_inputs",
            stage="verify",
        ),
        Hostile(
            "mean_answer_behind_patched_checks",
            t(
                "return x * 1e-3 + 5.0",
                header=PATCH_CHECKS + "compare.trivial_answer = lambda *a, **k: ''\n"
                "compare.rel_diff = lambda *a, **k: 1.0\n",
            ),
            "trivial_answer",
            stage="verify",
        ),
        Hostile(
            # its own stages pass by patched checks; every request verify makes is answered
            # with a failure named "ok", which would otherwise be verify's row
            "zeros_refusing_verify_with_ok",
            t("return torch.zeros_like(x)", header=refusing_every_request("ok")),
            "protocol_violation",
            stage="verify",
        ),
        Hostile(
            # the same with a code only the runner observes: the funnel would count the
            # zeros task as a filter's own bug instead of a violation
            "zeros_refusing_verify_as_filter_error",
            t("return torch.zeros_like(x)", header=refusing_every_request("filter_error")),
            "protocol_violation",
            stage="verify",
        ),
        Hostile(
            # its input handed back (a copy): a kernel that returns its input would pass
            "hands_back_its_input",
            t("return x.clone()"),
            "trivial_answer",
            stage="degenerate",
        ),
        Hostile(
            "hands_back_its_input_behind_patched_checks",
            t(
                "return x.clone()",
                header=PATCH_CHECKS + "compare.input_answer = lambda *a, **k: None\n",
            ),
            "trivial_answer",
            stage="verify",
        ),
        Hostile(
            # a tensor inside a list input handed back: caught by the candidate's own stage,
            # numbered as verify numbers it
            "hands_back_a_nested_input",
            t(
                "return x * 2.0, ys[0].clone()",
                signature="x, ys",
                inputs="[torch.randn(64, 64), [torch.randn(64, 64)]]",
            ),
            "trivial_answer",
            stage="degenerate",
        ),
        Hostile(
            # tensors handed over inside a list input: one ignored, one written in place
            "ignores_a_nested_input",
            t(
                "return torch.tanh(x @ x) * 2.0 + x",
                signature="x, ys",
                inputs="[torch.randn(64, 64), [torch.randn(64, 64)]]",
            ),
            "input_ignored",
            stage="degenerate",
        ),
        Hostile(
            "ignores_a_nested_input_behind_patched_checks",
            t(
                "return torch.tanh(x @ x) * 2.0 + x",
                header=PATCH_CHECKS + "compare.rel_diff = lambda *a, **k: 1.0\n",
                signature="x, ys",
                inputs="[torch.randn(64, 64), [torch.randn(64, 64)]]",
            ),
            "input_ignored",
            stage="verify",
        ),
        Hostile(
            "mutates_a_nested_input",
            t(
                "ys[0].abs_()\n        return torch.sigmoid(x) * ys[0] + x.exp()",
                signature="x, ys",
                inputs="[torch.randn(64, 64), [torch.randn(64, 64)]]",
            ),
            "input_mutated",
        ),
        Hostile(
            # the harness's failure reported from the candidate's process once its code ran:
            # the candidate's failure, not the filter's (it was filter_error)
            "reports_a_harness_failure",
            t("return torch.tanh(x) * 2.0", header=FORGE_HARNESS_ERROR),
            "harness_failed",
        ),
        Hostile(
            # an exception whose message raises when read: the candidate's failure, not the
            # harness's (it was filter_error)
            "unprintable_exception_in_init",
            t(
                "return x * 2.0",
                init="raise Unprintable()",
                header="\n\nclass Unprintable(Exception):\n"
                "    def __str__(self):\n        raise self\n",
            ),
            "init_error",
        ),
        Hostile(
            # an input no float, JSON or 64-bit column holds, described in the eager row
            # (it crashed the worker: worker_lost)
            "integer_input_beyond_every_number",
            t(
                "return torch.zeros_like(x)",
                signature="x, n",
                inputs="[torch.randn(64, 64), 10**5000]",
            ),
            "constant_output",
            stage="degenerate",
        ),
        Hostile(
            "forged_rows_for_every_stage",
            t("return torch.zeros_like(x)", header=FORGE_ROWS),
            "protocol_violation",
            stage="verify",
        ),
    ]


def hostile_tasks(host: Host, *, rlimits_safe: bool) -> list[Hostile]:
    """The attacks. ``rlimits_safe`` leaves out the ones only a namespace sandbox can contain
    (file, network and /proc access) and the ones that would harm a shared host outside one
    (a fork bomb, ``kill(-1)``)."""
    t = task_source
    daemon_kind = "rlimits" if rlimits_safe else "bwrap"
    repo_file = os.path.join(sandbox.PACKAGE_ROOT, "pwned-by-candidate.txt")
    heartbeat = (
        "if os.fork() == 0:\n"
        "            os.setsid()\n"
        "            if os.fork() == 0:\n"
        "                path = os.path.join({folder!r}, 'heartbeat-{kind}-{token}')\n"
        "                while True:\n"
        "                    with open(path, 'a') as fh:\n"
        "                        fh.write('.')\n"
        "                    time.sleep(0.05)\n"
        "            os._exit(0)\n"
        "        time.sleep(0.5)\n"
        "        raise RuntimeError('daemon started')"
    )
    # One wall-clock attack per batch: each holds a worker for the whole task timeout.
    spinner = (
        Hostile("infinite_loop", t("while True:\n            pass"), "timeout")
        if rlimits_safe
        else Hostile("sleep_forever", t("time.sleep(1e9)", header="import time"), "timeout")
    )
    common = [
        spinner,
        Hostile(
            "terabyte", t("return x + torch.empty(1 << 40, dtype=torch.uint8).float().sum()"), "oom"
        ),
        Hostile("segfault", t("return ctypes.string_at(0)", header="import ctypes"), "crashed"),
        Hostile("os_exit", t("os._exit(3)", header="import os"), "exited"),
        Hostile("sys_exit", t("sys.exit(0)", header="import sys"), "exited"),
        Hostile(
            "close_fds",
            t("os.closerange(3, 4096)\n        return x * 2.0", header="import os"),
            "exited",
        ),
        Hostile(
            "kill_parent",
            t(
                "os.kill(os.getppid(), signal.SIGKILL)\n        time.sleep(30)",
                header="import os, signal, time",
            ),
            "worker_lost",
        ),
        Hostile("flood_stdout", t("while True:\n            print('x' * 4096)"), "output_flood"),
        Hostile(
            "thread_bomb",
            t(
                "threading.stack_size(1 << 16)\n"
                "        for _ in range(400):\n"
                "            threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
                "        time.sleep(5)\n"
                "        return x * 2.0",
                header="import threading, time",
            ),
            "resource_limit",
            stage=None,
        ),
        Hostile(
            "daemon",
            t(
                heartbeat.format(
                    folder=heartbeat_dirs(daemon_kind)[1], kind=daemon_kind, token=TOKEN
                ),
                header="import os, time",
            ),
            "forward_error",
        ),
        Hostile(
            "malformed_report",
            t(
                "line = {'event': 'verdict', 'verdict': {'stage': 'eager', 'passed': True,\n"
                "        'reason': 'ok', 'elapsed_s': 'fast', 'measures': [1]}}\n"
                "        for fd in range(3, 256):\n"
                "            try:\n"
                "                os.write(fd, (json.dumps(line) + '\\n').encode())\n"
                "            except OSError:\n"
                "                pass\n"
                "        return x * 2.0",
                header="import json, os",
            ),
            "protocol_violation",
        ),
    ] + forgeries()
    if rlimits_safe:
        return common
    return (
        common
        + privilege_attacks(host)
        + [
            Hostile(
                "fork_bomb",
                t("while True:\n            os.fork()", header="import os"),
                "resource_limit",
            ),
            Hostile(
                "kill_everything",
                t(
                    "os.kill(-1, signal.SIGKILL)\n        time.sleep(30)",
                    header="import os, signal, time",
                ),
                "worker_lost",
            ),
            Hostile(
                "os_system",
                t(
                    f"assert os.system('echo pwned > {host.target('os_system')}') == 0\n"
                    "        return x",
                    header="import os",
                ),
                "forward_error",
            ),
            Hostile(
                "subprocess",
                t(
                    f"command = 'echo pwned > {host.target('subprocess')}'\n"
                    "        subprocess.run(['sh', '-c', command], check=True)\n"
                    "        return x",
                    header="import subprocess",
                ),
                "forward_error",
            ),
            Hostile(
                "socket",
                t(
                    f"socket.create_connection(('127.0.0.1', {host.port}), timeout=2)\n"
                    "        return x",
                    header="import socket",
                ),
                "forward_error",
            ),
            Hostile(
                "write_outside",
                t(
                    "errors = []\n"
                    f"        for path in [{str(host.target('write_outside'))!r}, {repo_file!r}]:\n"
                    "            try:\n"
                    "                with open(path, 'w') as fh:\n"
                    "                    fh.write('pwned')\n"
                    "            except OSError as exc:\n"
                    "                errors.append(str(exc))\n"
                    "        raise RuntimeError(errors)"
                ),
                "forward_error",
            ),
            Hostile(
                "read_secrets",
                t(
                    "found = []\n"
                    f"        paths = ['/etc/passwd', '/etc/shadow', {str(host.secret_file)!r}]\n"
                    "        paths += ['/root/.ssh/id_rsa', os.path.expanduser('~/.ssh/id_rsa')]\n"
                    "        for path in paths:\n"
                    "            try:\n"
                    "                with open(path) as fh:\n"
                    "                    found.append(fh.read())\n"
                    "            except OSError as exc:\n"
                    "                found.append(type(exc).__name__)\n"
                    "        raise RuntimeError('|'.join(found))",
                    header="import os",
                ),
                "forward_error",
            ),
            Hostile(
                "read_environment",
                t("raise RuntimeError(repr(dict(os.environ)))", header="import os"),
                "forward_error",
            ),
            Hostile(
                "parent_fds",
                t(
                    "opened = []\n"
                    "        base = f'/proc/{os.getppid()}'\n"
                    "        try:\n"
                    "            names = [f'fd/{n}' for n in os.listdir(base + '/fd')]\n"
                    "        except OSError:\n"
                    "            names = ['fd/0', 'fd/1', 'fd/2', 'fd/3', 'fd/4']\n"
                    "        for name in [*names, 'environ', 'mem']:\n"
                    "            try:\n"
                    "                with open(f'{base}/{name}', 'w') as fh:\n"
                    '                    fh.write(\'{"event": "result"}\\n\')\n'
                    "                opened.append(name)\n"
                    "            except OSError:\n"
                    "                pass\n"
                    "        raise RuntimeError(f'opened={opened}')",
                    header="import os",
                ),
                "forward_error",
            ),
        ]
    )


# System call numbers the attacks below use, per architecture (not all are in libc).
SYSCALLS = {
    "x86_64": {"keyctl": 250, "bpf": 321, "perf_event_open": 298, "process_vm_readv": 310,
               "userfaultfd": 323, "io_uring_setup": 425, "setns": 308, "clone3": 435,
               "pidfd_getfd": 438, "kexec_load": 246},
    "aarch64": {"keyctl": 219, "bpf": 280, "perf_event_open": 241, "process_vm_readv": 270,
                "userfaultfd": 282, "io_uring_setup": 425, "setns": 268, "clone3": 435,
                "pidfd_getfd": 438, "kexec_load": 104},
}  # fmt: skip
# What each refused call must answer (errno): EPERM, but EAFNOSUPPORT for a socket family the
# filter does not know and ENOSYS for clone3 (so that glibc falls back to clone).
# A packet socket is also a raw one: either rule may answer.
REFUSED = {"socket_packet": {1, 97}, "socket_alg": {97}, "clone3": {38}}


def privilege_attacks(host: Host) -> list[Hostile]:
    """Attacks on the kernel interface, each reporting what it got in its error message: the
    system calls a tensor program never needs, a no-op write of kernel settings (the value
    read is written back), who the process is, and what the sandbox says about the host."""
    t = task_source
    calls = (
        "import ctypes, errno, platform, socket\n"
        "        libc = ctypes.CDLL(None, use_errno=True)\n"
        f"        nr = {SYSCALLS!r}[platform.machine()]\n"
        "        def call(fn, *args):\n"
        "            ctypes.set_errno(0)\n"
        "            return 'ok' if fn(*args) != -1 else ctypes.get_errno()\n"
        "        got = {}\n"
        "        got['ptrace'] = call(libc.ptrace, 16, os.getppid(), 0, 0)\n"
        "        got['unshare_user'] = call(libc.unshare, 0x10000000)\n"
        "        got['unshare_mount'] = call(libc.unshare, 0x00020000)\n"
        "        got['mount'] = call(libc.mount, b'none', b'/tmp', b'tmpfs', 0, None)\n"
        "        got['chroot'] = call(libc.chroot, b'/tmp')\n"
        "        for name in nr:\n"
        "            got[name] = call(libc.syscall, nr[name], 0, 0, 0, 0, 0)\n"
        "        for name, family, kind in (('socket_packet', 17, 3), ('socket_alg', 38, 5),\n"
        "                                   ('socket_raw', 2, 3)):\n"
        "            try:\n"
        "                socket.socket(family, kind).close()\n"
        "                got[name] = 'ok'\n"
        "            except OSError as exc:\n"
        "                got[name] = exc.errno\n"
        "        status = open('/proc/self/status').read()\n"
        "        got['seccomp'] = status.split('Seccomp:')[1].split()[0]\n"
        "        got['no_new_privs'] = status.split('NoNewPrivs:')[1].split()[0]\n"
        "        raise RuntimeError(f'calls={got!r}')"
    )
    sysctl = (
        "got = {}\n"
        "        for name in ('kernel/core_pattern', 'vm/swappiness', 'kernel/hostname'):\n"
        "            path = '/proc/sys/' + name\n"
        "            try:\n"
        "                value = open(path).read()\n"
        "                with open(path, 'w') as fh:\n"
        "                    fh.write(value)  # the value just read: a no-op if it lands\n"
        "                got[name] = 'written'\n"
        "            except OSError as exc:\n"
        "                got[name] = exc.errno\n"
        "        raise RuntimeError(f'sysctl={got!r}')"
    )
    identity = (
        "ids = os.getresuid() + os.getresgid()\n"
        "        uid_map = open('/proc/self/uid_map').read().split()\n"
        "        caps = [line.split()[1] for line in open('/proc/self/status')\n"
        "                if line.startswith(('CapEff', 'CapPrm', 'CapAmb'))]\n"
        "        raise RuntimeError(f'ids={ids!r} map={uid_map!r} caps={caps!r} '\n"
        "                           f'groups={os.getgroups()!r}')"
    )
    host_view = (
        "seen = ''\n"
        "        for path in ('/proc/1/cmdline', '/proc/1/environ', '/proc/self/cmdline'):\n"
        "            try:\n"
        "                seen += open(path, 'rb').read().decode(errors='replace')\n"
        "            except OSError:\n"
        "                pass\n"
        "        leaked = [p for p in SECRETS if p in seen]\n"
        "        raise RuntimeError(f'leaked={leaked!r} length={len(seen)}')"
    )
    secrets = [str(host.cache_dir), str(host.root)]
    return [
        Hostile("forbidden_syscalls", t(calls, header="import os"), "forward_error"),
        Hostile("sysctl_write", t(sysctl), "forward_error"),
        Hostile("who_am_i", t(identity, header="import os"), "forward_error"),
        Hostile(
            "host_paths_in_proc",
            t(host_view, header=f"SECRETS = {secrets!r}"),
            "forward_error",
        ),
    ]


def require_bwrap() -> None:
    """Skip where bubblewrap is not installed; where it is, it must work (a sandbox that
    silently stopped starting would otherwise turn this whole suite into skips)."""
    if not sandbox.bwrap_available():
        pytest.skip("bubblewrap is not installed")
    assert isolation_problem(FiltersConfig()) == ""


def reported(rows: list[Verdict], key: str) -> Any:
    """The literal an attack put after ``key=`` in its error message."""
    import ast

    detail = rows[-1].detail
    start = detail.index(f"{key}=") + len(key) + 1
    for end in range(len(detail), start, -1):
        try:
            return ast.literal_eval(detail[start:end])
        except (ValueError, SyntaxError):
            continue
    raise AssertionError(f"no {key}= in {detail!r}")


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    root = tmp_path_factory.mktemp("hostile")
    (root / "secret.txt").write_text(MARKER)
    cache_dir = CACHE
    cache_dir.mkdir(parents=True, exist_ok=True)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.1)
    connections: list[Any] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                connections.append(server.accept())
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SECRET_ENV, MARKER)
        yield Host(
            root=root, cache_dir=cache_dir, port=server.getsockname()[1], connections=connections
        )
    stop.set()
    thread.join()
    server.close()
    for kind in ("bwrap", "rlimits"):
        heartbeat_path(kind).unlink(missing_ok=True)


def config(host: Host, **overrides: Any) -> FiltersConfig:
    values: dict[str, Any] = {
        "workers": 2,
        "cache_dir": str(host.cache_dir),
        "task_timeout_s": TIMEOUT_S,
        "grace_s": 10.0,
        "window_ms_cpu": (0.0, 60000.0),
        "warmup_runs": 1,
        "timed_runs": 3,
        "max_processes": 128,
        "output_limit_kb": 256,
        "memory_limit_gb": 6.0,
    }
    values.update(overrides)
    return FiltersConfig(**values)


def run_batch(
    host: Host, kind: str, attacks: list[Hostile]
) -> tuple[dict[str, list[Verdict]], list[str], dict[str, Any]]:
    """Good tasks first and last, the attacks in between, all on one pool. The wall-clock
    attacks are queued first as a batch of their own with a short timeout (a per-batch
    override, as the pool's measurements use), so the batch does not wait TIMEOUT_S for them."""
    cfg = config(host, sandbox=kind, allow_unsafe=kind == "rlimits")
    good = [
        Task(ops=["good"], data_source="torch#1", code=GOOD),
        Task(ops=["good2"], data_source="torch#1", code=GOOD),
    ]
    tasks = {a.name: Task(ops=[a.name], data_source="torch#1", code=a.code) for a in attacks}
    slow = [tasks[a.name] for a in attacks if a.reason == "timeout"]
    rest = [task for task in tasks.values() if task not in slow]
    with WorkerPool(cfg, "cpu") as pool:
        waiting = pool.submit(slow, overrides={"task_timeout_s": SPIN_TIMEOUT_S})
        results = pool.evaluate([good[0], *rest, good[1]])
        results.update(pool.wait(waiting))
        stats = dict(pool.stats)
    verdicts = {name: results[task.id] for name, task in tasks.items()}
    good_reasons = [results[g.id][-1].reason for g in good]
    return verdicts, good_reasons, stats


@pytest.fixture(scope="module")
def bwrap_batch(
    host: Host,
) -> tuple[dict[str, list[Verdict]], list[str], dict[str, Any], list[Hostile]]:
    require_bwrap()
    attacks = hostile_tasks(host, rlimits_safe=False)
    verdicts, good, stats = run_batch(host, "bwrap", attacks)
    return verdicts, good, stats, attacks


def _check(attack: Hostile, rows: list[Verdict]) -> None:
    last = rows[-1]
    summary = [(v.stage, v.reason, v.detail[:300]) for v in rows]
    assert not last.passed, summary
    assert last.reason == attack.reason, summary
    if attack.stage is not None:
        assert last.stage == attack.stage, summary
    assert all(v.passed for v in rows[:-1]), summary
    assert last.stage in FILTERS.stages


BWRAP_ATTACKS = [
    a.name for a in hostile_tasks(Host(Path("/x"), Path("/x"), 1, []), rlimits_safe=False)
]


@pytest.mark.parametrize("name", BWRAP_ATTACKS)
def test_attack_is_rejected_with_its_reason(name: str, bwrap_batch: Any) -> None:
    verdicts, _, _, attacks = bwrap_batch
    attack = next(a for a in attacks if a.name == name)
    _check(attack, verdicts[name])


def test_good_tasks_in_the_hostile_batch_pass(bwrap_batch: Any) -> None:
    _, good, stats, _ = bwrap_batch
    assert good == ["ok", "ok"]
    assert stats["sandbox"] == "bwrap"
    assert stats["workers_replaced"] >= 2  # the two worker-killing attacks


def test_no_attack_reached_the_host(bwrap_batch: Any, host: Host) -> None:
    verdicts, _, _, _ = bwrap_batch
    assert host.connections == []
    for name in ("os_system", "subprocess", "write_outside"):
        assert not host.target(name).exists()
    assert not os.path.exists(os.path.join(sandbox.PACKAGE_ROOT, "pwned-by-candidate.txt"))
    everything = repr([(v.detail, v.measures) for rows in verdicts.values() for v in rows])
    assert MARKER not in everything
    assert "root:x:0:0" not in everything
    assert SECRET_ENV not in everything
    assert "FileNotFoundError" in verdicts["read_secrets"][-1].detail
    assert "opened=[]" in verdicts["parent_fds"][-1].detail


def test_the_kernel_interface_is_closed(bwrap_batch: Any) -> None:
    """Every call a tensor program never needs is refused by the seccomp filter, which is
    loaded with no_new_privs."""
    verdicts, _, _, _ = bwrap_batch
    got = reported(verdicts["forbidden_syscalls"], "calls")
    assert got.pop("seccomp") == "2" and got.pop("no_new_privs") == "1", got
    wrong = {name: e for name, e in got.items() if e not in REFUSED.get(name, {1})}  # EPERM
    assert not wrong, got


def test_the_sandbox_is_not_root_and_cannot_write_kernel_settings(bwrap_batch: Any) -> None:
    """As root or not, the candidate is an unprivileged host uid without capabilities, and a
    write of kernel settings (the value it read, so a no-op) is refused."""
    verdicts, _, _, _ = bwrap_batch
    ids = reported(verdicts["who_am_i"], "ids")
    uid_map = reported(verdicts["who_am_i"], "map")
    caps = reported(verdicts["who_am_i"], "caps")
    host_uid = int(uid_map[1]) + ids[0] - int(uid_map[0])  # the uid the host sees
    assert host_uid != 0 and 0 not in ids, (ids, uid_map)
    if os.geteuid() == 0:  # root's supplementary groups are not inherited either
        assert host_uid == FiltersConfig().sandbox_uid
        assert reported(verdicts["who_am_i"], "groups") in ([], [ids[3]])
    assert all(int(value, 16) == 0 for value in caps), caps
    sysctl = reported(verdicts["sysctl_write"], "sysctl")
    assert "written" not in sysctl.values() and len(sysctl) == 3, sysctl


def test_the_sandbox_names_no_host_path(bwrap_batch: Any) -> None:
    """bwrap's options (bind sources among them) come through a descriptor: what the
    candidate can read of pid 1 and itself names no host path outside the system dirs."""
    verdicts, _, _, _ = bwrap_batch
    assert reported(verdicts["host_paths_in_proc"], "leaked") == []
    assert reported(verdicts["host_paths_in_proc"], "length") > 0


def test_escaped_daemon_is_killed(bwrap_batch: Any, host: Host) -> None:
    assert_heartbeat_stopped(host.heartbeat("bwrap"))


def assert_heartbeat_stopped(path: Path) -> None:
    assert path.exists(), "the daemon never ran, so this test proves nothing"
    before = path.stat().st_size
    time.sleep(0.5)
    assert path.stat().st_size == before


def test_rlimits_fallback_contains_runaway_candidates(host: Host) -> None:
    attacks = hostile_tasks(host, rlimits_safe=True)
    verdicts, good, stats = run_batch(host, "rlimits", attacks)
    assert stats["sandbox"] == "rlimits"
    assert good == ["ok", "ok"]
    for attack in attacks:
        _check(attack, verdicts[attack.name])
    assert_heartbeat_stopped(host.heartbeat("rlimits"))


def test_patching_torch_does_not_leak_into_the_next_candidate(host: Host) -> None:
    patcher = task_source(
        "return torch.relu(x) + 1.0",
        header=(
            "torch.relu = lambda x, *a, **k: x * 0\n"
            "torch.Tensor.__add__ = lambda self, other: self * 0\n"
            "torch.manual_seed = lambda *a, **k: None\n"
            "nn.Linear.forward = lambda self, x: x * 0"
        ),
    )
    tasks = [
        Task(ops=["patch"], data_source="torch#1", code=patcher),
        Task(ops=["good"], data_source="torch#1", code=GOOD),
    ]
    with WorkerPool(config(host, workers=1, task_timeout_s=600.0), "cpu") as pool:
        results = pool.evaluate(tasks)
        assert pool.stats["workers_started"] == 1  # the same worker served both
    patched, good = results[tasks[0].id], results[tasks[1].id]
    assert not patched[-1].passed
    assert [v.reason for v in good] == ["ok"] * len(job_stages(FiltersConfig()))


def cache_attack() -> str:
    """A candidate that plants code in its compile caches (a module where inductor looks,
    a file in every Triton entry it can reach) and tries to write into the trusted layer."""
    return task_source(
        "planted, written, refused = [], [], 0\n"
        "        for var in ('TORCHINDUCTOR_CACHE_DIR', 'TRITON_CACHE_DIR'):\n"
        "            folder = os.environ[var]\n"
        "            os.makedirs(folder, exist_ok=True)\n"
        "            targets = [os.path.join(folder, 'planted.py')]\n"
        "            targets += [os.path.join(e.path, 'planted.py') for e in os.scandir(folder)\n"
        "                        if e.is_dir()]\n"
        "            for path in targets:\n"
        "                try:\n"
        "                    with open(path, 'w') as fh:\n"
        "                        fh.write('raise SystemExit(3)')\n"
        "                    planted.append(path)\n"
        "                except OSError:\n"
        "                    refused += 1\n"
        "        trusted = os.environ['OPSYNTH_TRUSTED_CACHE']\n"
        "        for root, dirs, files in os.walk(trusted):\n"
        "            for name in [*files, 'planted.py']:\n"
        "                try:\n"
        "                    with open(os.path.join(root, name), 'a') as fh:\n"
        "                        fh.write('raise SystemExit(3)')\n"
        "                    written.append(os.path.join(root, name))\n"
        "                except OSError:\n"
        "                    refused += 1\n"
        "        raise RuntimeError("
        "f'planted={len(planted)} written={written!r} refused={refused}')",
        header="import os",
    )


CACHE_LOOK = task_source(
    "found = []\n"
    "        for var in ('TORCHINDUCTOR_CACHE_DIR', 'TRITON_CACHE_DIR'):\n"
    "            pattern = os.path.join(os.environ[var], '**', 'planted.py')\n"
    "            found += glob.glob(pattern, recursive=True)\n"
    "        raise RuntimeError(f'found={found!r}')",
    header="import glob, os",
)


def test_a_candidate_cannot_pass_code_on_through_the_compile_cache(host: Host) -> None:
    """What one candidate writes into its compile caches is gone when the next one, in the
    same worker, compiles; the trusted layer every candidate reads is read-only to both."""
    require_bwrap()
    cfg = config(host, sandbox="bwrap", workers=1)
    tasks = [
        Task(ops=["plant"], data_source="torch#1", code=cache_attack()),
        Task(ops=["look"], data_source="torch#1", code=CACHE_LOOK),
        Task(ops=["good"], data_source="torch#1", code=GOOD),
    ]
    with WorkerPool(cfg, "cpu") as pool:
        results = pool.evaluate(tasks)
        stats = dict(pool.stats)
    assert stats["workers_started"] == 1 and stats["compile_cache"] == "trusted", stats
    plant, look, good = (results[t.id] for t in tasks)
    assert reported(plant, "planted") >= 2  # its own, private caches take the code
    assert reported(plant, "written") == []
    assert reported(plant, "refused") > 0  # the layer holds files, each refused
    assert reported(look, "found") == []
    assert [v.reason for v in good] == ["ok"] * len(job_stages(FiltersConfig()))
    layer = compile_cache.layer_dir(str(host.cache_dir), "cpu")
    assert compile_cache.is_complete(layer)
    assert not list(Path(layer).rglob("planted.py"))
    # the warm-up named what a first compile imports, and the worker imported it before forking
    named = Path(layer, compile_cache.IMPORTS).read_text().split()
    assert "torch._inductor.codegen.cpp" in named and stats["preimported"] == len(named), stats
    # and which vector instruction sets its compiles found usable, which the worker took
    usable = Path(layer, compile_cache.VEC_ISA).read_text().splitlines()
    assert stats["vec_isa"] == len(usable), stats


def sibling_attack(action: str) -> str:
    """A candidate that looks for the worker's other child (the next candidate's prestarted
    process), tries to open its memory and fds, then does ``action`` to it."""
    return task_source(
        "me, parent = os.getpid(), os.getppid()\n"
        "        siblings, deadline = [], time.monotonic() + 10\n"
        "        while not siblings and time.monotonic() < deadline:\n"
        "            for name in filter(str.isdigit, os.listdir('/proc')):\n"
        "                try:\n"
        "                    stat = open(f'/proc/{name}/stat').read()\n"
        "                except OSError:\n"
        "                    continue\n"
        "                ppid = int(stat[stat.rfind(')') + 2 :].split()[1])\n"
        "                if ppid == parent and int(name) != me:\n"
        "                    siblings.append(int(name))\n"
        "            time.sleep(0.05)\n"
        "        opened = []\n"
        "        for pid in siblings:\n"
        "            for name in ['mem', 'fd/3', 'environ']:\n"
        "                path = f'/proc/{pid}/{name}'\n"
        "                try:\n"
        "                    open(path, 'rb').close()\n"
        "                    opened.append(path)\n"
        "                except OSError:\n"
        "                    pass\n"
        f"            os.kill(pid, signal.{action})\n"
        "        raise RuntimeError(f'siblings={len(siblings)} opened={opened}')",
        header="import os, signal, time",
    )


def test_a_candidate_cannot_tamper_with_the_next_candidates_process(host: Host) -> None:
    """The prestarted child exists while a candidate runs (the attack finds it), is closed to
    it, and a stopped or killed one is never handed the next candidate."""
    require_bwrap()
    cfg = config(host, sandbox="bwrap", workers=1)
    tasks = [
        Task(ops=["stop"], data_source="torch#1", code=sibling_attack("SIGSTOP")),
        Task(ops=["good"], data_source="torch#1", code=GOOD),
        Task(ops=["kill"], data_source="torch#1", code=sibling_attack("SIGKILL")),
        Task(ops=["good2"], data_source="torch#1", code=GOOD),
    ]
    with WorkerPool(cfg, "cpu") as pool:
        results = pool.evaluate(tasks)
        stats = dict(pool.stats)
    assert stats["workers_started"] == 1  # one worker saw all four
    # the stopped waiting child was noticed and replaced. The killed one was reaped with the
    # attack's processes (the last candidate starts fresh), or is found dead when the last
    # candidate comes (replaced), or is still dying then and so refuses it: each way a new
    # fork runs that candidate
    assert stats["child_prestarted"] == 2 and stats["child_replaced"] >= 1
    new_fork = ("child_fresh", "child_replaced", "child_refused", "child_unresponsive")
    assert sum(stats[key] for key in new_fork) == 2, stats
    for attack in (tasks[0], tasks[2]):
        last = results[attack.id][-1]
        assert last.reason == "forward_error", last.detail
        assert "siblings=1 opened=[]" in last.detail, last.detail
    for good in (tasks[1], tasks[3]):
        assert [v.reason for v in results[good.id]] == ["ok"] * len(job_stages(FiltersConfig()))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_illegal_memory_access_is_a_cuda_error(host: Host) -> None:
    bad = task_source(
        "return x[torch.tensor([1 << 30], device=x.device)] * 2.0",
        inputs="[torch.randn(64, 64)]",
    )
    tasks = [
        Task(ops=["bad"], data_source="torch#1", code=bad),
        Task(ops=["good"], data_source="torch#1", code=GOOD),
    ]
    cfg = config(host, workers=1, task_timeout_s=300.0, window_ms_cuda=(0.0, 60000.0))
    with WorkerPool(cfg, "cuda") as pool:
        results = pool.evaluate(tasks)
        replaced = pool.stats["workers_replaced"]
    assert results[tasks[0].id][-1].reason == "cuda_error"
    assert replaced >= 1  # a CUDA error retires the worker
    assert [v.reason for v in results[tasks[1].id]] == ["ok"] * len(job_stages(FiltersConfig()))
