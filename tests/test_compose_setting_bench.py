"""benchmarks/compose_setting.py: one composer setting off and on, over the same draws."""

from __future__ import annotations

from pathlib import Path

import pytest

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


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--setting", "no_such"], "is not a [compose] setting"),
        (["--setting", "optional_draws"], "is not boolean: give --values A B"),
        (["--setting", "optional_draws", "--values", "2", "2"], "--values must differ"),
        (["--setting", "optional_draws", "--values", "1", "0"], "--values '0'"),
    ],
)
def test_main_refuses_a_bad_setting_or_values_in_one_line(
    tmp_path: Path, extra: list[str], message: str, capsys
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--catalogue", str(tmp_path), *extra])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1], err


def test_main_compares_two_values_of_a_numeric_setting(
    tmp_path: Path, catalogue_seeds, capsys
) -> None:
    write_tasks(catalogue_seeds, tmp_path / "seeds.parquet")
    argv = ["--catalogue", str(tmp_path), "--setting", "optional_draws", "--values", "1", "3"]
    results = main([*argv, "--n", "30", "--calls", "nn.Linear"])
    assert results["1"]["tasks"] == results["3"]["tasks"] == 30
    assert results["1"]["distinct_operators"] > 0 and results["changes"]["compared"] == 30
    assert "optional_draws=3: 30 tasks" in capsys.readouterr().out
