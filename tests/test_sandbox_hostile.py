"""Hostile candidates, sent straight to the pool (the static check is bypassed on purpose).

Each must be rejected with its reason, its attack must not reach the host, the orchestrator
must survive, and good tasks in the same batch must still pass every stage.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from filters import reasons, sandbox
from filters.pool import WorkerPool
from filters.samples import GOOD, task_source
from opsynth.config import FiltersConfig
from opsynth.record import Task, Verdict

MARKER = f"opsynth-secret-{uuid.uuid4().hex}"
SECRET_ENV = "OPSYNTH_TEST_SECRET"
# Short enough to keep the runaway attacks cheap, long enough for a good task's torch.compile
# on a CPU in a fresh process (about 35 s even with a warm cache on some hosts and torch builds).
TIMEOUT_S = 60.0
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
        return self.cache_dir / f"heartbeat-{kind}-{TOKEN}"


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
        "                cache = os.environ['TORCHINDUCTOR_CACHE_DIR']\n"
        "                path = os.path.join(cache, '..', 'heartbeat-{kind}-{token}')\n"
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
            t(heartbeat.format(kind=daemon_kind, token=TOKEN), header="import os, time"),
            "forward_error",
        ),
    ]
    if rlimits_safe:
        return common
    return common + [
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
                "        names = [f'fd/{n}' for n in os.listdir(base + '/fd')]\n"
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
    for path in cache_dir.glob(f"heartbeat-*{TOKEN}"):
        path.unlink()


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


def warm_compile_cache(cfg: FiltersConfig) -> None:
    """Compile the good task once with a long timeout and otherwise the same config (the
    compile cache is keyed on thread count and cache path, so on worker count and sandbox
    kind), so the short-timeout batches below see a warm cache however cold the host was."""
    with WorkerPool(cfg.model_copy(update={"task_timeout_s": 600.0}), "cpu") as pool:
        good = Task(ops=["good"], data_source="torch#1", code=GOOD)
        rows = pool.evaluate([good])[good.id]
    assert rows[-1].reason == "ok", rows[-1].detail


def run_batch(
    host: Host, kind: str, attacks: list[Hostile]
) -> tuple[dict[str, list[Verdict]], list[str], dict[str, Any]]:
    """Good tasks first and last, the attacks in between, all in one ``evaluate`` call."""
    cfg = config(host, sandbox=kind)
    warm_compile_cache(cfg)
    good = [
        Task(ops=["good"], data_source="torch#1", code=GOOD),
        Task(ops=["good2"], data_source="torch#1", code=GOOD),
    ]
    tasks = {a.name: Task(ops=[a.name], data_source="torch#1", code=a.code) for a in attacks}
    with WorkerPool(cfg, "cpu") as pool:
        results = pool.evaluate([good[0], *tasks.values(), good[1]])
        stats = dict(pool.stats)
    verdicts = {name: results[task.id] for name, task in tasks.items()}
    good_reasons = [results[g.id][-1].reason for g in good]
    return verdicts, good_reasons, stats


@pytest.fixture(scope="module")
def bwrap_batch(
    host: Host,
) -> tuple[dict[str, list[Verdict]], list[str], dict[str, Any], list[Hostile]]:
    if not sandbox.bwrap_available() or sandbox.probe_bwrap(
        paths=sandbox.Paths(str(host.cache_dir), str(host.root), str(host.root)),
        device="cpu",
        tmp_bytes=1 << 28,
    ):
        pytest.skip("bubblewrap is not usable here")
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
    assert last.stage in reasons.STAGES


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
    assert [v.reason for v in good] == ["ok"] * len(reasons.STAGES)


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
    if not sandbox.bwrap_available() or sandbox.probe_bwrap(
        paths=sandbox.Paths(str(host.cache_dir), str(host.root), str(host.root)),
        device="cpu",
        tmp_bytes=1 << 28,
    ):
        pytest.skip("bubblewrap is not usable here")
    cfg = config(host, sandbox="bwrap", workers=1)
    warm_compile_cache(cfg)
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
    # the stopped waiting child was noticed and replaced; the killed one was reaped with the
    # attack's processes, so the last candidate started fresh
    assert (stats["child_prestarted"], stats["child_replaced"], stats["child_fresh"]) == (2, 1, 1)
    for attack in (tasks[0], tasks[2]):
        last = results[attack.id][-1]
        assert last.reason == "forward_error", last.detail
        assert "siblings=1 opened=[]" in last.detail, last.detail
    for good in (tasks[1], tasks[3]):
        assert [v.reason for v in results[good.id]] == ["ok"] * len(reasons.STAGES)


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
    assert [v.reason for v in results[tasks[1].id]] == ["ok"] * len(reasons.STAGES)
