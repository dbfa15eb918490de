"""benchmarks/compose_setting.py: one composer setting off and on, over the same draws."""

from __future__ import annotations

from pathlib import Path

from benchmarks.compose_setting import changes, dim_forms, keyword_shares, main
from opsynth.record import Task
from opsynth.store import write_tasks


def test_dim_forms_reads_keywords_positions_and_modules() -> None:
    code = (
        "a = F.softmax(x, dim=1)\nb = F.softmax(x)\nc = F.log_softmax(x, -1)\n"
        "m = nn.Softmax(dim=self.dim)\nn = nn.Softmax()\ns = torch.sum(x)\n"
    )
    forms = dim_forms([code, "def broken(:"], ["F.softmax", "F.log_softmax", "nn.Softmax"])
    assert forms == {"dim=1": 1, "none": 2, "dim=-1": 1, "dim=self.dim": 1, "unparsed": 1}


def test_changes_compares_position_by_position() -> None:
    a, b, c = (Task(ops=[op], data_source="torch#1", code=op) for op in ("x", "y", "z"))
    rewritten = Task(ops=["y"], data_source="torch#1", code="y2")
    assert changes([a, b, c], [a, rewritten, a]) == {"compared": 3, "same_ops": 2, "same_code": 1}


def test_main_composes_both_ways_and_the_softmax_calls_name_their_dim(
    tmp_path: Path, catalogue_seeds, capsys
) -> None:
    write_tasks(catalogue_seeds, tmp_path / "seeds.parquet")
    argv = ["--catalogue", str(tmp_path), "--setting", "explicit_dim", "--n", "60"]
    # a uniform profile passes no optional arguments: only the setting names a dim
    argv += ["--profile", "uniform"]
    results = main([*argv, "--dims", "F.softmax", "--calls", "F.softmax"])
    off, on = results["false"]["dim_forms"], results["true"]["dim_forms"]
    assert off.get("none", 0) > 0 and on and "none" not in on, results
    moved = results["changes"]
    assert (
        moved["compared"] == 60
        and moved["same_code"] < 60
        and moved["same_code"] <= moved["same_ops"]
    )
    assert results["true"]["keywords"]["F.softmax"]["dim"] == 1.0
    assert "dim" not in results["false"]["keywords"]["F.softmax"]
    out = capsys.readouterr().out
    assert "keep their op sequence" in out and "keywords of F.softmax (true" in out


def test_keyword_shares_count_each_names_calls() -> None:
    code = "a = torch.mean(x, dim=1, keepdim=True)\nb = torch.mean(x, dim=(2, 3))\n"
    shares = keyword_shares([code], ["torch.mean", "torch.sum"])
    assert shares == {
        "torch.mean": {"calls": 2, "dim": 1.0, "keepdim": 0.5},
        "torch.sum": {"calls": 0},
    }
