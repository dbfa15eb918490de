"""``opsynth decontam`` and ``opsynth dedup`` on a small parquet, through the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from opsynth.record import Task
from opsynth.store import write_tasks

SHARED = Path(__file__).resolve().parents[2] / "shared"
KERNELBENCH = SHARED / "kernelbench" / "kernelbench.jsonl"
OPS6K = SHARED / "ops6k" / "cuda_agent_ops_6k.parquet"

pytestmark = pytest.mark.skipif(
    not (KERNELBENCH.exists() and OPS6K.exists()), reason="reference data ../shared is absent"
)


@pytest.fixture
def task_file(tmp_path) -> tuple[Path, Task, Task]:
    kb = json.loads(KERNELBENCH.read_text().splitlines()[20])
    contaminated = Task(ops=[kb["name"]], data_source="torch#1", code=kb["code"])
    row = pq.read_table(OPS6K).slice(0, 1).to_pylist()[0]
    clean = Task(ops=json.loads(row["ops"]), data_source=row["data_source"], code=row["code"])
    # the same task with a comment added: a duplicate after normalisation
    twin = Task(ops=clean.ops, data_source=clean.data_source, code="# reworded\n" + clean.code)
    path = tmp_path / "set.parquet"
    write_tasks([contaminated, clean, twin], path)
    return path, contaminated, clean


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "opsynth.flows.cli", *args], capture_output=True, text=True, cwd=cwd
    )


def test_decontam_drops_the_kernelbench_copy(task_file, tmp_path):
    path, contaminated, _ = task_file
    proc = run_cli("decontam", "--input", str(path), "--out", str(tmp_path / "d"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    dropped = pq.read_table(tmp_path / "d" / "dropped.parquet").to_pylist()
    assert [r["id"] for r in dropped] == [contaminated.id]
    verdicts = pq.read_table(tmp_path / "d" / "verdicts.parquet").to_pylist()
    assert {v["reason"] for v in verdicts if not v["passed"]} == {"kernelbench_similar"}
    for v in verdicts:  # every row, kept or not, names its nearest KernelBench problem
        assert json.loads(v["measures"])["kb_nearest_name"]


def test_dedup_keeps_one_of_the_twins(task_file, tmp_path):
    path, _, _ = task_file
    proc = run_cli("dedup", "--input", str(path), "--out", str(tmp_path / "u"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    kept = pq.read_table(tmp_path / "u" / "kept.parquet").to_pylist()
    assert len(kept) == 2
    verdicts = pq.read_table(tmp_path / "u" / "verdicts.parquet").to_pylist()
    assert [v["reason"] for v in verdicts if not v["passed"]] == ["exact_duplicate"]
