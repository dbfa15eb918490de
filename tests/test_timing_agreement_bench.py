"""benchmarks/timing_agreement.py: the three timings of a task line up, and rows near an edge
are counted and weighed by how the probes scattered."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.timing_agreement import band_of, flip_estimate, last_probe_ms, main, report
from opsynth.record import Task, Verdict
from opsynth.store import write_tasks, write_verdicts


def task(name: str) -> Task:
    return Task(ops=["torch.relu"], data_source="torch#1", code=f"# {name}\n")


def rows(t: Task, runtime_ms: float, probe_ms: float | None, judged_ms: float) -> list[Verdict]:
    sizing = {"chosen": 64, "steps": [{"value": 8, "ms": 0.1}, {"value": 64, "ms": probe_ms}]}
    runtime = {
        "eager_ms_median": runtime_ms,
        "eager_ms_min": runtime_ms / 1.25,
        "scaled_ms": runtime_ms,
        "window_ms": [1.0, 100.0],
        "speed_factor": 1.0,
    }
    return [
        Verdict(t.id, "eager", True, "ok", measures={"sizing": sizing}),
        Verdict(t.id, "runtime", True, "ok", measures=runtime),
        Verdict(t.id, "verify", True, "ok", measures={"judged_ms": judged_ms}),
    ]


def test_ratios_edges_and_the_flip_estimate(tmp_path: Path, capsys) -> None:
    edge, middle, slow, rejected = task("edge"), task("middle"), task("slow"), task("rejected")
    verdicts = (
        rows(edge, 1.05, 0.84, 1.26)  # probe/runtime 0.8: a second look could fall below 1 ms
        + rows(middle, 1.5, 1.5, 1.8)
        + rows(slow, 30.0, 30.0, 30.0)
        + rows(rejected, 1.2, 1.2, 1.2)
    )
    write_verdicts(verdicts, tmp_path / "verdicts.parquet")
    write_tasks([edge, middle, slow], tmp_path / "accepted.parquet")
    result = report(tmp_path)
    assert result["timed_tasks"] == 4 and result["accepted"] == 3
    assert result["window_ms"] == [1.0, 100.0]
    short = result["probe_over_runtime"]["< 2 ms"]
    assert short["n"] == 3 and short["q0.01"] == pytest.approx(0.8) and short["q0.5"] == 1.0
    assert result["verify_over_runtime"]["< 2 ms"]["q0.99"] == pytest.approx(1.2)
    assert result["runtime_median_over_min"][">= 20 ms"]["q0.5"] == pytest.approx(1.25)
    assert result["accepted_within_10pct_of_an_edge"] == 1  # 1.05 ms only
    assert result["accepted_within_20pct_of_an_edge"] == 1
    # the edge row, under its band's three ratios (0.8, 1, 1): a third of a row below
    assert result["accepted_expected_below_on_a_second_runtime"] == pytest.approx(0.3)
    assert result["accepted_expected_above_on_a_second_runtime"] == 0
    main([str(tmp_path)])
    assert "below / above the window" in capsys.readouterr().out


def test_helpers() -> None:
    assert [band_of(ms) for ms in (1.0, 2.0, 3.0, 19.9, 20.0, 500.0)] == [0, 0, 1, 2, 2, 3]
    assert last_probe_ms({"chosen": 8, "steps": [{"value": 8, "ms": 2.0}, {"value": 8}]}) == 2.0
    assert last_probe_ms({"chosen": 8, "steps": [{"value": 4, "ms": 2.0}]}) is None
    assert last_probe_ms("not a claim") is None
    below, above = flip_estimate([], {0: [1.0]}, (1.0, 100.0))
    assert below == above == 0
