"""benchmarks/end_to_end.py: the per-stage table it prints comes from run.json as written."""

from __future__ import annotations

import pytest

from benchmarks.end_to_end import summarise, table


def test_stages_in_run_order_with_shares_and_the_runs_rate() -> None:
    manifest = {
        "status": "complete",
        "counts": {"candidates": 300, "accepted": 240},
        "unscreened": 12,
        "stage_seconds": {
            "filter": 90.0,
            "seeds": 30.0,
            "size": 45.0,
            "compose": 6.0,
            "export": 1.5,
            "pool_start": 20.0,
        },
        "filters_runtime": {"candidates": 450},
    }
    s = summarise(manifest, wall_s=180.0)
    assert [row["stage"] for row in s["stages"]] == ["seeds", "compose", "size", "filter", "export"]
    assert s["stages"][3]["share"] == pytest.approx(0.5)
    assert s["outside_stages_s"] == pytest.approx(180.0 - 172.5)
    assert s["candidates_per_min"] == 100.0 and s["pool_start_s"] == 20.0
    assert s["sandbox_processes"] == 450 and s["processes_per_candidate"] == 1.5
    printed = table(s)
    assert "| filter | 90.0 | 50.0% |" in printed and "**100.0 candidates/min**" in printed
    assert "450 sandboxed processes (1.5 per candidate)" in printed


def test_a_run_json_without_stage_times_still_summarises() -> None:
    s = summarise({"counts": {}}, wall_s=10.0)
    assert s["stages"] == [] and s["candidates"] == 0 and s["candidates_per_min"] == 0.0
    assert s["sandbox_processes"] == 0 and s["processes_per_candidate"] is None
