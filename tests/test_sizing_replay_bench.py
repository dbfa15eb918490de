"""benchmarks/sizing_replay.py: the search replayed on a candidate's own probes."""

from __future__ import annotations

from pathlib import Path

from benchmarks.sizing_replay import fitted, main, replay
from opsynth.config import RunConfig
from opsynth.record import Verdict
from opsynth.store import write_verdicts

WINDOW = (1.0, 100.0)  # target 10 ms


def claim(*steps: tuple[int, float, float]) -> dict:
    return {
        "steps": [{"value": v, "ms": ms, "reason": "", "device_gib": g} for v, ms, g in steps],
        "seconds": 1.0 * len(steps),  # one second a probe
    }


# Linear in the batch: 0.01 ms and 0.002 GiB per unit. Composed at 16 (0.16 ms), it took the
# search three probes (x64 -> 10.24 ms, inside the band at once, but the record's third step
# stands for a real search's bisection).
LINEAR = claim((16, 0.16, 0.032), (1024, 10.24, 2.048), (512, 5.12, 1.024))
# Memory-bound: 0.001 ms and 0.01 GiB per unit, so the 8 GiB cap stops it near 0.8 ms.
CAPPED = claim((16, 0.016, 0.16), (512, 0.512, 5.12), (768, 0.768, 7.68))


def test_the_model_goes_through_the_largest_probes() -> None:
    model = fitted(LINEAR["steps"])
    ms, gib = model(2048)
    assert abs(ms - 20.48) < 1e-9 and abs(gib - 4.096) < 1e-9


def test_a_first_probe_near_the_target_ends_the_search_at_once() -> None:
    cfg = RunConfig().sizing
    probes, ok = replay(LINEAR, 1, cfg, WINDOW, oom_gib=60.0)
    assert (probes, ok) == (2, True)  # 16 -> x64 = 1024: 10.24 ms, the target
    probes, ok = replay(LINEAR, 64, cfg, WINDOW, oom_gib=60.0)
    assert (probes, ok) == (1, True)
    # the memory cap, not the runtime, ends a cheap chain's search, below the window
    probes, ok = replay(CAPPED, 1, cfg, WINDOW, oom_gib=60.0)
    assert probes >= 2 and ok is False
    # a first probe that runs out of memory leaves the search with no size
    assert replay(LINEAR, 64, cfg, WINDOW, oom_gib=1.0) == (1, None)


def test_main_reads_a_run_and_prints_per_scale(tmp_path: Path, capsys) -> None:
    rows = [
        Verdict("a", "eager", True, "ok", measures={"sizing": LINEAR}),
        Verdict("b", "eager", True, "ok", measures={"sizing": CAPPED}),
        Verdict("c", "eager", True, "ok", measures={"sizing": claim((16, 5.0, 0.1))}),  # one
        Verdict("a", "runtime", True, "ok", measures={}),
    ]
    write_verdicts(rows, tmp_path / "verdicts.parquet")
    results = main(["--run", str(tmp_path), "--scale", "1", "64"])
    assert "2 candidates with two or more probes; recorded 3.000" in capsys.readouterr().out
    assert results[1]["probes"] > results[64]["probes"]
    assert results[64]["ended_after"][1] == 1 and results[1]["no_size"] == 0
    # searches priced as the run's own three-probe ones: a second a probe
    assert results[1]["sizing_s"] == 2.0 and results[64]["sizing_s"] == 1.5
