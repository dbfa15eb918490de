"""``filters.candidates_per_process``: a process takes the next candidate only after its last
one left nothing behind, and verdicts are those of a fresh process per candidate."""

from __future__ import annotations

from test_sandbox_pool import config as pool_config

from filters.pool import WorkerPool
from filters.samples import task_source
from opsynth.record import Task


def config(**overrides: object):
    return pool_config(task_timeout_s=120.0, prestart_child=True, **overrides)


def task(body: str, header: str = "") -> Task:
    return Task(ops=["t"], data_source="torch#1", code=task_source(body, header=header))


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
    with WorkerPool(config(candidates_per_process=4), "cpu") as pool:
        assert outcome(pool.evaluate(tasks)) == expected
        assert pool.stats["child_reused"] == 2


def test_a_candidate_that_changes_torch_retires_its_process() -> None:
    """The first candidate sets float64 as torch's default dtype while it is imported; in a
    reused process the second would then return float64. Its process is retired instead."""
    leaky = task("return torch.relu(x) + 1", header="torch.set_default_dtype(torch.float64)")
    after = task("return torch.relu(x) * 3 + x")
    with WorkerPool(config(candidates_per_process=4), "cpu") as pool:
        found = outcome(pool.evaluate([leaky, after]))
        assert pool.stats["child_reused"] == 0
    assert found[after.id][1] == ["float32"]
