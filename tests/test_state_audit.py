"""The audit that decides whether a candidate's process may take another candidate."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

from opsynth.filters import compare
from opsynth.filters.state_audit import differences, snapshot

ROOT = Path(__file__).resolve().parent.parent


def _set(obj: object, name: str, value: object) -> Callable[[], None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    return lambda: setattr(obj, name, old)


def _cudnn_benchmark() -> Callable[[], None]:
    return _set(torch.backends.cudnn, "benchmark", not torch.backends.cudnn.benchmark)


def _default_dtype() -> Callable[[], None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    return lambda: torch.set_default_dtype(old)


def _matmul_precision() -> Callable[[], None]:
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium" if old != "medium" else "high")
    return lambda: torch.set_float32_matmul_precision(old)


def _grad_off() -> Callable[[], None]:
    torch.set_grad_enabled(False)
    return lambda: torch.set_grad_enabled(True)


def _thread_left_running() -> Callable[[], None]:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()

    def undo() -> None:
        stop.set()
        thread.join()

    return undo


def _function_mode_left_on() -> Callable[[], None]:
    mode = TorchFunctionMode()
    mode.__enter__()
    return lambda: mode.__exit__(None, None, None)


MUTATIONS: dict[str, tuple[Callable[[], Callable[[], None]], str]] = {
    "cudnn benchmark": (_cudnn_benchmark, "cudnn.benchmark"),
    "default dtype": (_default_dtype, "default_dtype"),
    "matmul precision": (_matmul_precision, "float32_matmul_precision"),
    "grad mode": (_grad_off, "grad_enabled"),
    "thread": (_thread_left_running, "thread started: Thread-N"),
    "function mode": (_function_mode_left_on, "torch_function_modes"),
    "torch.relu patched": (lambda: _set(torch, "relu", lambda x: x), "torch.relu: replaced"),
    "F.gelu patched": (
        lambda: _set(torch.nn.functional, "gelu", lambda x: x),
        "torch.nn.functional.gelu: replaced",
    ),
    "Linear.forward patched": (
        lambda: _set(torch.nn.Linear, "forward", lambda self, x: x),
        "torch.nn.Linear.forward: replaced",
    ),
    "timer patched": (
        lambda: _set(torch.cuda.Event, "elapsed_time", lambda self, end: 1.0),
        "torch.cuda.Event.elapsed_time: replaced",
    ),
    "clock patched": (
        lambda: _set(time, "perf_counter", lambda: 0.0),
        "time.perf_counter: replaced",
    ),
    "a check's comparison patched": (
        lambda: _set(compare, "all_close", lambda *a, **k: True),
        "opsynth.filters.compare.all_close: replaced",
    ),
    "state stashed on torch": (
        lambda: _stash(torch, "kept_for_later", torch.ones(3)),
        "torch.kept_for_later: added",
    ),
}


def _stash(obj: object, name: str, value: object) -> Callable[[], None]:
    setattr(obj, name, value)
    return lambda: delattr(obj, name)


@pytest.fixture
def undo() -> Iterator[list[Callable[[], None]]]:
    undos: list[Callable[[], None]] = []
    yield undos
    for fn in reversed(undos):
        fn()


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_each_change_a_candidate_can_leave_is_seen(name: str, undo) -> None:
    mutate, expected = MUTATIONS[name]
    before = snapshot()
    undo.append(mutate())
    found = differences(before, snapshot())
    assert any(line.startswith(expected) for line in found), found
    undo.pop()()
    assert differences(before, snapshot()) == []


def test_torch_threads_and_class_caches_are_not_changes() -> None:
    """tqdm's monitor (inductor's progress bars) comes and goes on its own, and copying a
    tensor caches ``__slotnames__`` on its class: neither is a candidate's doing."""
    import copy

    before = snapshot()
    stop = threading.Event()
    monitor = threading.Thread(target=stop.wait, name="tqdm_monitor", daemon=True)
    monitor.start()
    had = "__slotnames__" in vars(torch.Tensor)
    copy.copy(torch.ones(2))
    try:
        assert had or "__slotnames__" in vars(torch.Tensor)
        assert differences(before, snapshot()) == []
    finally:
        stop.set()
        monitor.join()


def test_a_clean_candidate_leaves_nothing() -> None:
    """Building a model, running it and its gradients, and dropping it changes nothing."""
    before = snapshot()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.LayerNorm(8))
    x = torch.randn(4, 8, requires_grad=True)
    model(x).sum().backward()
    with torch.no_grad():
        torch.nn.functional.softmax(model(x), dim=-1)
    del model, x
    assert differences(before, snapshot()) == []


AFTER_COMPILE = """
import sys
import torch
from opsynth.filters.state_audit import after_candidate, prepare, snapshot
device = sys.argv[1]
prepare(device)
before = snapshot(device)
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 14 * 14, 16)
).to(device)
x = torch.randn(4, 3, 16, 16, device=device)
with torch.no_grad():
    eager = model(x)
    compiled = torch.compile(model)(x)
torch.testing.assert_close(compiled, eager, rtol=1e-3, atol=1e-3)
del compiled, eager, model, x
print(after_candidate(before, {"memory_limit_bytes": 8 << 30}, device))
"""


def _compile_in_a_fresh_process(device: str, cache: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", AFTER_COMPILE, device],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "TORCHINDUCTOR_CACHE_DIR": str(cache),
            # As in the sandbox (filters.sandbox): more would start inductor's compile pool.
            "TORCHINDUCTOR_COMPILE_THREADS": "1",
        },
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_torch_compile_in_a_fresh_process_leaves_nothing(tmp_path: Path) -> None:
    """The first ``torch.compile`` of a process patches torch for good; ``prepare`` does it
    before the baseline, so a candidate's compile leaves nothing, or no compiled candidate's
    process would ever be reused."""
    assert _compile_in_a_fresh_process("cpu", tmp_path / "cache") == "[]"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_compiled_candidate_on_the_gpu_leaves_nothing(tmp_path: Path) -> None:
    """On CUDA the cleanup must give back what the candidate took (cached allocator blocks,
    the generator's seed, peak statistics) and count only what the process grew, not the
    context and libraries a fresh process holds too."""
    assert _compile_in_a_fresh_process("cuda", tmp_path / "cache") == "[]"


KEEPS_MEMORY = """
from opsynth.filters.state_audit import after_candidate, snapshot
before = snapshot()
kept = bytearray(96 << 20)
for offset in range(0, len(kept), 4096):  # touched: resident, not just reserved
    kept[offset] = 1
print(after_candidate(before, {"memory_limit_bytes": 128 << 20}, "cpu"))
"""


def test_resident_memory_a_candidate_keeps_retires_the_process() -> None:
    """In a process of its own, as a candidate's is: in the test process, memory other
    threads free between the two snapshots would offset the growth."""
    done = subprocess.run(
        [sys.executable, "-c", KEEPS_MEMORY],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = done.stdout.strip().splitlines()[-1]
    assert "resident memory grew" in found, found
