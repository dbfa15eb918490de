"""benchmarks/timer_disturbance.py: every mode's disturbers run beside the timer, whose
readings are summarised against idle's; GPU-only modes are refused on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.timer_disturbance import main, summary


def test_each_mode_is_timed_beside_its_disturbers(tmp_path: Path, capsys) -> None:
    out = tmp_path / "timer_disturbance.json"
    argv = ["--device", "cpu", "--disturbers", "1", "--rounds", "3", "--elements", "4096"]
    argv += ["--warmup-runs", "1", "--timed-runs", "3", "--settle-s", "0", "--out", str(out)]
    result = main(argv + ["--mode", "cpu", "--mode", "shared", "--mode", "unlocked"])
    assert list(result["modes"]) == ["idle", "cpu", "shared", "unlocked"]  # idle first, always
    assert result["modes"]["idle"]["median_ratio"] == 1.0
    for row in result["modes"].values():
        assert row["rounds"] == 3 and 0 < row["median_ms"] <= row["p95_ms"] <= row["max_ms"]
    assert json.loads(out.read_text()) == result
    assert "unlocked: median" in capsys.readouterr().out


def test_gpu_only_modes_are_refused_on_the_cpu(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="contexts need --device cuda"):
        main(["--device", "cpu", "--mode", "contexts", "--out", str(tmp_path / "x.json")])


def test_summary_ratios_are_against_the_reference_median() -> None:
    row = summary([2.0, 1.0, 4.0], [1.0, 1.0, 2.0])
    assert row == {
        "rounds": 3,
        "median_ms": 2.0,
        "p95_ms": 4.0,
        "max_ms": 4.0,
        "median_ratio": 2.0,
        "p95_ratio": 4.0,
        "max_ratio": 4.0,
    }
