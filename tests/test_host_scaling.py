"""benchmarks/host_scaling.py: phases of pinned processes, and their slowdown against the first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.host_scaling import against_first, main, mean_mhz, parse_args


def test_slowdown_is_against_the_same_workloads_first_phase() -> None:
    phases = [
        {"workload": "python", "cores": 16, "median_s": 0.5},
        {"workload": "python", "cores": 32, "median_s": 0.6},
        {"workload": "import", "cores": 16, "median_s": 4.0},
        {"workload": "import", "cores": 32, "median_s": 3.8},
    ]
    assert [p["slowdown"] for p in against_first(phases)] == [1.0, 1.2, 1.0, 0.95]


def test_clock_is_read_for_the_chosen_cores_only(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\ncpu MHz\t\t: 2000.0\n\nprocessor\t: 1\ncpu MHz\t\t: 3000.0\n\n"
        "processor\t: 2\ncpu MHz\t\t: 3500.0\n"
    )
    assert mean_mhz({1, 2}, str(info)) == 3250.0
    assert mean_mhz({7}, str(info)) is None
    assert mean_mhz({0}, str(tmp_path / "missing")) is None


def test_a_short_run_writes_every_phase(tmp_path: Path) -> None:
    """Two phases of the pure-Python workload on one core each: both timed and written."""
    phases = main(["--workloads", "python", "--cores", "1", "1", "--repeats", "1", "--duty",
                   "1", "--out", str(tmp_path)])  # fmt: skip
    assert [p["cores"] for p in phases] == [1, 1] and phases[0]["slowdown"] == 1.0
    assert all(p["repeats"] == 1 and p["median_s"] > 0 for p in phases)
    assert json.loads((tmp_path / "host_scaling.json").read_text()) == phases


@pytest.mark.parametrize("bad", [["--duty", "0"], ["--duty", "1.5"], ["--repeats", "0"]])
def test_bad_settings_are_refused(bad: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(bad)
