"""benchmarks/stable_sort.py: a run's sorting mismatches, rewritten stable, to audit."""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks.stable_sort import main, stable_source
from opsynth.filters.samples import task_source
from opsynth.record import Task, Verdict
from opsynth.store import read_tasks, write_tasks, write_verdicts


def test_each_sort_call_becomes_stable_with_its_literals_named() -> None:
    code = "a = torch.argsort(x, -1)\nb, i = torch.sort(torch.relu(x), 1, True)\nc = x.sum(1)\n"
    out = stable_source(code)
    assert out == (
        "a = torch.argsort(x, dim=-1, stable=True)\n"
        "b, i = torch.sort(torch.relu(x), dim=1, descending=True, stable=True)\n"
        "c = x.sum(1)\n"
    )
    x = torch.tensor([[0.0, -1.0, 2.0, 0.0]])
    scope = {"torch": torch, "x": x}
    exec(out, scope)  # noqa: S102 - the rewritten calls are valid torch calls
    assert scope["a"].tolist() == [[1, 0, 3, 2]]
    assert stable_source("y = torch.sort(x, stable=False)\n") is None
    assert stable_source("y = torch.cumsum(x, 1)\n") is None


def test_main_writes_the_sorting_mismatches_both_ways(tmp_path: Path, capsys) -> None:
    sorting = Task(
        ops=["torch.argsort"], data_source="torch#1", code=task_source("return torch.argsort(x)")
    )
    other = Task(
        ops=["torch.cumsum"], data_source="torch#1", code=task_source("return torch.cumsum(x, 1)")
    )
    passed = Task(
        ops=["torch.sort"], data_source="torch#1", code=task_source("return torch.sort(x)[0]")
    )
    write_tasks([sorting, other, passed], tmp_path / "candidates.parquet")
    write_verdicts(
        [
            Verdict(sorting.id, "compile", False, "compile_mismatch"),
            Verdict(other.id, "compile", False, "compile_mismatch"),
            Verdict(passed.id, "compile", True, "ok"),
        ],
        tmp_path / "verdicts.parquet",
    )
    assert main(["--run", str(tmp_path), "--out", str(tmp_path / "out")]) == (2, 1)
    [as_run] = read_tasks(tmp_path / "out" / "as_run.parquet")
    [stable] = read_tasks(tmp_path / "out" / "stable.parquet")
    assert as_run.id == sorting.id and stable.id != sorting.id
    assert "torch.argsort(x, stable=True)" in stable.code
    assert "1 that sort" in capsys.readouterr().out
