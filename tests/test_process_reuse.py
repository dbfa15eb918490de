"""``filters.candidates_per_process_*``: a process takes the next candidate only after its last
one left nothing behind, and verdicts are those of a fresh process per candidate."""

from __future__ import annotations

import pytest
import torch
from conftest import TEST_COMPILE_CACHE
from test_sandbox_pool import config as pool_config

from opsynth.filters.pool import WorkerPool
from opsynth.filters.samples import task_source
from opsynth.record import Task


def config(**overrides: object):
    return pool_config(task_timeout_s=120.0, prestart_child=True, **overrides)


def task(body: str, header: str = "") -> Task:
    return Task(ops=["t"], data_source="torch#1", code=task_source(body, header=header))


def details(verdicts: dict) -> str:
    """Every row that is neither ok nor a check's verdict, with its detail: a mismatch says why."""
    return "; ".join(
        f"{task_id} {v.stage} {v.reason}: {v.detail}"
        for task_id, rows in verdicts.items()
        for v in rows
        if v.reason in ("filter_error", "crashed", "timeout")
    )


def outcome(verdicts: dict) -> dict:
    """Per task: every stage's reason, and the eager row's output dtypes."""
    found = {}
    for task_id, rows in verdicts.items():
        eager = next((v for v in rows if v.stage == "eager"), None)
        dtypes = [o["dtype"] for o in eager.measures.get("outputs", [])] if eager else []
        found[task_id] = ([(v.stage, v.reason) for v in rows], dtypes)
    return found


def test_clean_candidates_share_a_process_and_keep_their_verdicts() -> None:
    tasks = [
        task("return x * 0 + 1"),  # constant: rejected at degenerate
        task("return torch.relu(x) * 2 + x"),  # passes every stage, compiled included
        task("return x * 0 + 2"),
    ]
    with WorkerPool(config(), "cpu") as fresh:
        expected = outcome(fresh.evaluate(tasks))
        assert fresh.stats["child_reused"] == 0
    with WorkerPool(config(candidates_per_process_cpu=4), "cpu") as pool:
        verdicts = pool.evaluate(tasks)
        assert outcome(verdicts) == expected, details(verdicts)
        assert pool.stats["child_reused"] == 2
        assert pool.stats["child_retired"] == {}
        # one process for all three: it prepared its baseline (a tiny compile) once
        assert pool.stats["audit_prepare_s"] > 0.5


def test_a_candidate_that_changes_torch_retires_its_process() -> None:
    """The first candidate sets float64 as torch's default dtype while it is imported; in a
    reused process the second would then return float64. Its process is retired instead."""
    leaky = task("return torch.relu(x) + 1", header="torch.set_default_dtype(torch.float64)")
    after = task("return torch.relu(x) * 3 + x")
    with WorkerPool(config(candidates_per_process_cpu=4), "cpu") as pool:
        found = outcome(pool.evaluate([leaky, after]))
        assert pool.stats["child_reused"] == 0
        assert pool.stats["child_retired"] == {"default_dtype: torch.float32 -> torch.float64": 1}
    assert found[after.id][1] == ["float32"]


def test_a_candidate_that_patches_the_checks_retires_its_process() -> None:
    """The first candidate replaces the checks' comparison in its process (as the hostile
    suite's patched-checks candidates do); a reused process would let the next candidate's
    randomness and compile checks compare nothing. Its process is retired instead, and the
    next candidate, nondeterministic, is rejected by its own process's checks."""
    patcher = task(
        "return torch.relu(x) + 1",
        header="import sys\n"
        "sys.modules['opsynth.filters.compare'].all_close = lambda *a, **k: True",
    )
    after = task("return x + torch.rand_like(x)")
    with WorkerPool(config(candidates_per_process_cpu=4), "cpu") as pool:
        found = outcome(pool.evaluate([patcher, after]))
        assert pool.stats["child_reused"] == 0
        assert pool.stats["child_retired"] == {"opsynth.filters.compare.all_close: replaced": 1}
    assert ("randomness", "random") in found[after.id][0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_the_gpu_reused_processes_keep_verdicts_and_retire_on_a_changed_switch() -> None:
    """On CUDA the audit must not retire a clean process (cached allocator blocks, the CUDA
    generator, cuBLAS workspaces are all restored or freed), and a candidate that turns TF32
    on must retire its process: in a reused one the next matmul would be TF32."""
    big = "[torch.randn(4096, 4096)]"  # a 4096^3 matmul: milliseconds, inside the window
    clean = [
        task("return torch.relu(x @ x) + x"),
        task("return x * 0 + 1"),
        Task(
            ops=["t"],
            data_source="torch#1",
            code=task_source("return torch.tanh(x @ x) * 2", inputs=big),
        ),
    ]
    leaky = Task(
        ops=["t"],
        data_source="torch#1",
        code=task_source(
            "return torch.sigmoid(x @ x)",
            inputs=big,
            header="torch.backends.cuda.matmul.allow_tf32 = True",
        ),
    )
    tasks = [*clean, leaky, task("return torch.relu(x @ x) - x")]
    with WorkerPool(config(), "cuda") as fresh:
        expected = outcome(fresh.evaluate(tasks))
    with WorkerPool(config(candidates_per_process_cuda=8), "cuda") as pool:
        found = outcome(pool.evaluate(tasks))
        stats = dict(pool.stats)
    assert {k: v[0] for k, v in found.items()} == {k: v[0] for k, v in expected.items()}
    # clean -> clean -> clean -> leaky; then a fresh one
    assert stats["child_reused"] == 3, stats["child_retired"]
    # TF32 on moves the float32 matmul precision too: the first finding (sorted) is that.
    assert list(stats["child_retired"]) == ["float32_matmul_precision: 'highest' -> 'high'"]


def test_preparing_the_baseline_is_not_the_candidates_time() -> None:
    """A reusable process compiles a tiny model before its baseline (seconds with a cold
    cache, never under half a second: tracing, lowering and a C++ build); running past the
    timeout there is the harness's failure, not a candidate's ``timeout``."""
    quick = task("return x * 0 + 1")
    # the trusted layer is the session's; the compile cache a process prepares in is its own,
    # empty, whatever the layer holds
    cold = {"cache_dir": str(TEST_COMPILE_CACHE), "task_timeout_s": 0.5}
    with WorkerPool(pool_config(candidates_per_process_cpu=4, **cold), "cpu") as pool:
        rows = pool.evaluate([quick])[quick.id]
    assert [(v.stage, v.reason) for v in rows] == [("eager", "filter_error")]
    assert "audit's baseline" in rows[0].detail
