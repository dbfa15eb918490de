"""benchmarks/sizing_too_fast.py: what the rule would have caught, from a run's verdicts."""

from __future__ import annotations

from pathlib import Path

from benchmarks.sizing_too_fast import main
from opsynth.record import Verdict
from opsynth.store import write_verdicts


def sized(task: str, ms: float, *stages: tuple[str, bool, str, float]) -> list[Verdict]:
    claim = {"chosen": 64, "steps": [{"value": 64, "ms": ms, "reason": ""}], "seconds": 2.0}
    rows = [Verdict(task, "eager", True, "ok", measures={"sizing": claim}, elapsed_s=0.5)]
    return rows + [Verdict(task, s, ok, why, elapsed_s=el) for s, ok, why, el in stages]


def test_main_counts_what_each_share_catches_and_what_it_saves(tmp_path: Path, capsys) -> None:
    rows = [
        *sized("fast", 0.3, ("randomness", True, "ok", 0.5), ("runtime", False, "too_fast", 1.0)),
        *sized("edge", 0.7, ("randomness", False, "random", 0.5)),
        *sized(
            "kept",
            5.0,
            ("randomness", True, "ok", 0.5),
            ("compile", True, "ok", 3.0),
            ("verify", True, "ok", 2.0),
            ("dedup", True, "ok", 0.0),
        ),
    ]
    write_verdicts(rows, tmp_path / "verdicts.parquet")
    results = main(["--run", str(tmp_path), "--share", "0.5", "0.8"])
    half, most = results[0.5], results[0.8]
    assert (half["sized"], half["caught"], most["caught"]) == (3, 1, 2)
    assert half["ends"] == {("runtime", "too_fast"): 1} and most["accepted_lost"] == 0
    assert half["stage_s_saved"] == 2.0  # the fast one's eager, randomness and runtime
    assert half["verify_window_s_saved"] == 6.0  # the kept one's eager through verify
    assert most["ends"][("randomness", "random")] == 1
    assert "2 of 3 sized candidates caught (below 0.8 ms)" in capsys.readouterr().out
