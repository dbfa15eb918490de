"""benchmarks/timing_cost.py: variants become valid configs, and its table reads the verdicts."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from benchmarks.timing_cost import main, merged, parse_variant, summarise, table, to_toml
from opsynth.config import RunConfig
from opsynth.record import Verdict
from opsynth.store import write_verdicts

ROOT = Path(__file__).resolve().parent.parent


def test_a_variant_over_the_default_config_is_that_config_with_its_keys_set() -> None:
    base = tomllib.loads((ROOT / "configs" / "default.toml").read_text())
    name, overrides = parse_variant("lean=filters.timed_runs=5,sizing.enabled=false")
    assert name == "lean" and overrides == {"filters.timed_runs": 5, "sizing.enabled": False}
    config = tomllib.loads(to_toml(merged(base, overrides)))
    assert config == merged(base, overrides) != base  # nested tables and lists survive
    loaded = RunConfig.model_validate(config)
    assert loaded.filters.timed_runs == 5 and not loaded.sizing.enabled
    assert base["filters"]["timed_runs"] != 5  # the base is left as it was
    assert parse_variant("plain=") == ("plain", {})
    for bad in ("=filters.timed_runs=5", "x=timed_runs=5", "x=filters.timed_runs"):
        with pytest.raises(SystemExit):
            parse_variant(bad)


def verdict(task: str, stage: str, reason: str = "ok", s: float = 1.0, **measures) -> Verdict:
    return Verdict(task, stage, reason == "ok", reason, measures=measures, elapsed_s=s)


def test_per_stage_means_lock_waits_and_differing_reasons(tmp_path: Path) -> None:
    runs = {}
    for name, second in (("a", "ok"), ("b", "too_fast")):
        run = tmp_path / name
        run.mkdir()
        sizing = {"seconds": 3.0, "steps": [{"value": 1}, {"value": 8}]}
        rows = [
            verdict("t1", "compose", s=0.0),
            verdict("t1", "eager", s=2.0, gpu_lock_wait_s=0.5, sizing=sizing),
            verdict("t1", "runtime", s=1.0, gpu_lock_wait_s=0.25, gpu_exclusive_s=0.1),
            verdict("t1", "verify", s=4.0, lock_wait_s=1.0, timed_s=0.2, requests_s={"run": 0.5}),
            verdict("t2", "eager", s=4.0, gpu_lock_wait_s=1.5),
            verdict("t2", "runtime", second, s=3.0, gpu_lock_wait_s=0.75, gpu_exclusive_s=0.3),
        ]
        write_verdicts(rows, run / "verdicts.parquet")
        runtime = {"first_result_at": 100.0, "last_result_at": 160.0}
        manifest = {"counts": {"accepted": 1}, "filters_runtime": runtime}
        (run / "run.json").write_text(json.dumps(manifest))
        runs[name] = summarise(run)
    a = runs["a"]
    assert a["sandboxed"] == 2 and a["candidates_per_min"] == 2.0
    assert a["stages"]["eager"] == {"rows": 2, "seconds": 3.0, "lock_wait_s": 1.0, "exclusive_s": 0}
    assert a["stages"]["runtime"]["exclusive_s"] == 0.2
    verify = {"rows": 1, "seconds": 4.0, "lock_wait_s": 1.0, "exclusive_s": 0.2}
    assert a["stages"]["verify"] == verify
    assert a["sizing"] == {"seconds": 3.0, "probes": 2.0}
    assert a["verify_requests_s"] == {"run": 0.5}
    assert a["final"] == {"t1": "ok", "t2": "ok"} and runs["b"]["final"]["t2"] == "too_fast"
    # a chunk stopped by --time-limit: its settled jobs are in its journal, not the parquet
    journal = tmp_path / "a" / "work" / "size_filter-k.journal.jsonl"
    journal.parent.mkdir()
    settled = {"t3": [verdict("t3", "eager", s=6.0, gpu_lock_wait_s=2.5).to_row()]}
    journal.write_text(json.dumps({"job": "j", "results": settled}) + "\n" + '{"job": "torn')
    stopped = summarise(tmp_path / "a")
    assert stopped["sandboxed"] == 3 and stopped["final"]["t3"] == "ok"
    assert stopped["stages"]["eager"]["lock_wait_s"] == 1.5  # (0.5 + 1.5 + 2.5) / 3
    printed = table(runs)
    assert "| runtime: s / lock wait / held alone | 2.0 / 0.5 / 0.2 | 2.0 / 0.5 / 0.2 |" in printed
    assert "| final reasons differing from a | 0 | 1 |" in printed


def test_a_variant_whose_run_refuses_its_config_is_left_out(tmp_path: Path, capsys) -> None:
    config = tmp_path / "base.toml"
    config.write_text('target = 2\n[seeds]\ncache_dir = "none"\nlibraries = ["einops"]\n')
    results = main(
        ["--config", str(config), "--out", str(tmp_path / "out"), "--repeat", "2"]
        + ["--variant", "bad=filters.no_such_key=1", "--device", "cpu"]
    )
    assert results == {}
    out = capsys.readouterr().out
    assert "bad: exit 2" in out and "bad#2: exit 2" in out
    # the catalogue was extracted once, before the first variant, where the variants look
    assert out.index("seed catalogue extracted in") < out.index("bad: exit 2")
    [catalogue] = (tmp_path / "out" / "seed-cache").glob("catalogue-*")
    assert (catalogue / "summary.json").is_file()
    assert not (tmp_path / "out" / "catalogue-first").exists()
    written = tomllib.loads((tmp_path / "out" / "bad-2" / "config.toml").read_text())
    # every variant keeps its catalogue in one place, whatever the base config says
    assert written["seeds"]["cache_dir"] == str((tmp_path / "out" / "seed-cache").resolve())
    assert json.loads((tmp_path / "out" / "timing_cost.json").read_text()) == {}


def test_each_variant_is_written_as_it_ends(tmp_path: Path, monkeypatch) -> None:
    """A caller's own time limit may kill the list mid-way: the variants already done are in
    ``timing_cost.json`` by then."""
    import benchmarks.timing_cost as bench

    config = tmp_path / "base.toml"
    config.write_text("target = 2\n")
    out = tmp_path / "out"

    class Killed(Exception):
        pass

    def fake_run(cmd, *args, **kwargs):  # the first variant's run finishes, the second is cut
        run = Path(cmd[cmd.index("--out") + 1])
        if run.parent.name == "second":
            assert json.loads((out / "timing_cost.json").read_text()).keys() == {"first"}
            raise Killed
        run.mkdir(parents=True)
        write_verdicts([verdict("t1", "eager")], run / "verdicts.parquet")
        (run / "run.json").write_text(json.dumps({"counts": {"accepted": 1}}))
        return type("Done", (), {"returncode": 0})()

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    with pytest.raises(Killed):
        main(
            ["--config", str(config), "--out", str(out), "--variant", "first="]
            + ["--variant", "second=filters.timed_runs=5", "--no-catalogue-first"]
        )
    written = json.loads((out / "timing_cost.json").read_text())
    assert list(written) == ["first"] and written["first"]["sandboxed"] == 1
