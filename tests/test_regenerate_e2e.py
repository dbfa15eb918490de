"""End-to-end ``opsynth run``: the real CLI, Prefect's temporary server, sandboxed workers.

These runs are small (a few tasks) but go through every stage for real, including a SIGKILL
of the whole process group mid-run and a resume that must reproduce the same dataset.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.slow

TINY = """
target = 3
max_rounds = 3
chunk_size = 2

# A few torch operators keep the seeds stage (a catalogue extraction) to seconds.
[seeds]
libraries = ["torch"]
operators = ["nn.Linear", "nn.LayerNorm", "F.gelu", "torch.relu", "torch.tanh", "torch.add"]

[compose]
seed = 11
mix = { "torch#1" = 0.5, "torch#2" = 0.5 }
oversample = 1.5

# Sizing probes every candidate and records it, but with this band never rescales: a rescale
# follows measured times, and the kill-and-resume test compares two independent runs.
# Rescaling itself is tested in test_synth_sizing.py.
[sizing]
band = 1000.0

[filters]
device = "cpu"
workers = 2
warmup_runs = 1
timed_runs = 3
shard_size = 2
task_timeout_s = 90.0
"""


def opsynth(
    *args: str, cwd: Path, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """The CLI in a subprocess; ``env`` adds to the environment (``prefect_api``: the session's
    Prefect server instead of a temporary one per run)."""
    return subprocess.run(
        [sys.executable, "-m", "opsynth.flows.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )


def accepted_rows(run: Path) -> list[tuple[str, str, str, str]]:
    rows = pq.read_table(run / "accepted.parquet").to_pylist()
    return [(r["id"], r["ops"], r["data_source"], r["code"]) for r in rows]


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cfg") / "tiny.toml"
    path.write_text(TINY)
    return path


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, tiny_config) -> Path:
    out = tmp_path_factory.mktemp("ref") / "run"
    proc = opsynth("run", "--out", str(out), "--config", str(tiny_config), cwd=out.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (out.parent / "stderr.txt").write_text(proc.stderr)
    return out


def test_a_run_reports_progress_from_its_start(reference_run) -> None:
    """Not on a terminal (a log, CI), every stage still says when it starts and ends, and the
    first line comes before Prefect's server starts."""
    lines = (reference_run.parent / "stderr.txt").read_text().splitlines()
    assert lines[0].startswith("opsynth run -> ") and "starting Prefect" in lines[0], lines[:3]
    for stage in ("seeds: 0/1", "seeds: 1/1", "compose round 0: 0/", "size_filter: "):
        assert any(line.startswith(stage) for line in lines), (stage, lines[:20])


def test_run_writes_every_stage_file(reference_run):
    for name in ("seeds", "candidates", "verdicts", "accepted", "rejected"):
        assert (reference_run / f"{name}.parquet").is_file(), name
    for name in ("seeds.parquet", "verdicts.parquet", "reasons.csv", "summary.json"):
        assert (reference_run / "catalogue" / name).is_file(), name
    manifest = json.loads((reference_run / "run.json").read_text())
    assert manifest["status"] == "complete"
    # this invocation's wall time per stage, for the end-to-end benchmark's table
    seconds = manifest["stage_seconds"]
    # (sizing and filtering pipelined: one stage, flows.size_screen)
    assert all(seconds[stage] > 0 for stage in ("seeds", "compose", "size_filter")), seconds
    assert seconds["dedup"] >= 0 and seconds["export"] >= 0
    assert seconds["pool_start"] > 0
    assert manifest["counts"]["accepted"] == 3
    # the target split over the mix (a tie to the first source); the export fills each
    # source's share first, what one lacks from the others' extra rows (opsynth.quota)
    quota = manifest["quota"]
    assert quota["wanted"] == {"torch#1": 2, "torch#2": 1}
    assert sum(quota["exported"].values()) == 3
    for source, wanted in quota["wanted"].items():
        got = quota["accepted"].get(source, 0)
        assert quota["exported"].get(source, 0) >= min(wanted, got), quota
    stages = [row["stage"] for row in manifest["funnel"]]
    # the runtime window is decided in verify (filters.timing_in_verify, the default)
    for stage in ("static", "decontam", "eager", "randomness", "degenerate", "compile", "verify"):
        assert stage in stages
    assert "runtime" not in stages
    # every candidate that was not accepted has at least one failing verdict explaining why
    verdicts = pq.read_table(reference_run / "verdicts.parquet").to_pylist()
    # composed candidates were screened two at a time until the target was met; those left
    # are counted, and neither candidates nor verdicts hold them
    screened = {v["task_id"] for v in verdicts if v["stage"] == "static"}
    assert manifest["compose"]["passed"] == len(screened) + manifest["unscreened"]
    candidate_ids = {
        r["id"] for r in pq.read_table(reference_run / "candidates.parquet").to_pylist()
    }
    composed = {v["task_id"] for v in verdicts if v["stage"] == "compose" and v["passed"]}
    assert composed == screened and composed <= candidate_ids
    failing = {v["task_id"] for v in verdicts if not v["passed"]}
    rejected = {r["id"] for r in pq.read_table(reference_run / "rejected.parquet").to_pylist()}
    assert rejected <= failing
    for row in pq.read_table(reference_run / "accepted.parquet").to_pylist():
        assert row["data_source"] == f"torch#{len(json.loads(row['ops']))}"
        assert "class Model" in row["code"] and "def get_inputs" in row["code"]
        meta = json.loads(row["meta"])
        timed = meta["filters"]["verify"]
        assert timed["eager_ms_median"] > 0 and timed["compiled_ms_median"] > 0
        # sized on the filtering device before the filters ran (filters.sizing)
        assert meta["sizing"]["device"].startswith("cpu") and meta["sizing"]["steps"]


def test_rerun_recomputes_nothing(reference_run, tiny_config, prefect_api):
    """Not even with the pool tuned otherwise: settings marked speed-only (workers, shard
    size, process reuse, pipelining) are not part of the work files' keys."""
    before = accepted_rows(reference_run)
    tuned = tiny_config.with_name("tuned.toml")
    tuned.write_text(
        tiny_config.read_text()
        .replace("workers = 2", "workers = 1\ncandidates_per_process_cpu = 2")
        .replace("shard_size = 2", "shard_size = 1")
    )
    args = ("run", "--out", str(reference_run), "--config", str(tuned))
    proc = opsynth(*args, cwd=reference_run, env=prefect_api)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((reference_run / "run.json").read_text())
    assert manifest["work"]["computed"] == {}
    assert manifest["filters_runtime"] == {}  # no worker was even started
    assert accepted_rows(reference_run) == before


def test_status_shows_funnel(reference_run):
    proc = opsynth("status", str(reference_run), cwd=reference_run)
    assert proc.returncode == 0, proc.stderr
    assert "compile" in proc.stdout and "complete" in proc.stdout


def _kill_when(out: Path, tiny_config: Path, ready, env: dict[str, str]) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "opsynth.flows.cli",
            "run",
            "--out",
            str(out),
            "--config",
            str(tiny_config),
        ],
        cwd=out.parent,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    try:
        while not ready() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert proc.poll() is None, "run finished before it could be killed"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_sigkill_twice_then_resume_gives_identical_dataset(
    tmp_path, tiny_config, reference_run, prefect_api
):
    """Killed early (seconds in), then killed again in the resumed run as soon as it has
    written a sized and filtered chunk, then stopped by a time limit: the last run finishes
    with the reference run's dataset, reusing the chunks written before."""
    out = tmp_path / "run"
    start = time.monotonic()
    _kill_when(out, tiny_config, lambda: time.monotonic() - start > 8, prefect_api)
    assert not (out / "accepted.parquet").exists()

    def shards() -> int:  # a chunk's verdicts are written after its tasks: the chunk is done
        return len(list((out / "work").glob("size_filter-verdicts-*.parquet")))

    written = shards()
    _kill_when(out, tiny_config, lambda: shards() > written, prefect_api)
    assert not (out / "accepted.parquet").exists()
    args = ("run", "--out", str(out), "--config", str(tiny_config))

    # A time limit already spent when the chunks come: the run writes what it has and stops
    # at a chunk boundary (exit 3), starting at most the chunk it had no estimate for.
    proc = opsynth(*args, "--time-limit", "1", cwd=tmp_path, env=prefect_api)
    assert proc.returncode == 3, proc.stderr[-3000:]
    said = proc.stdout + proc.stderr
    assert "stopped at the time limit" in said and "re-run to resume" in said, said[-2000:]
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["status"] == "stopped"
    assert manifest["counts"]["accepted"] < 3 and manifest["unscreened"] > 0
    [stopped] = manifest["invocations"]
    assert stopped["status"] == "stopped" and len(stopped["chunks_computed_s"]) <= 1
    # the jobs a part-done chunk settled are counted where a user reads the run's progress
    lines = [
        json.loads(line)["job"]
        for journal in (out / "work").glob("*.journal.jsonl")
        for line in journal.read_text().splitlines()
        if line.endswith("}")
    ]
    assert manifest["journaled_jobs"] == stopped["journaled_jobs"] == len(set(lines))
    assert ("settled jobs of a part-done chunk" in said) == bool(lines)
    assert (out / "accepted.parquet").is_file()
    # its finished chunks are reported only when asked, and the report says what it covers
    refused = opsynth("report", str(out), cwd=tmp_path, env=prefect_api)
    assert refused.returncode == 2 and "--partial" in refused.stderr, refused.stderr[-2000:]
    assert len([line for line in refused.stderr.splitlines() if line.strip()]) == 1
    report = tmp_path / "partial"
    proc = opsynth("report", str(out), "--partial", "--out", str(report), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    accepted = manifest["counts"]["accepted"]
    assert f"with {accepted} of 3 accepted" in (report / "report.md").read_text()

    proc = opsynth(*args, cwd=tmp_path, env=prefect_api)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert accepted_rows(out) == accepted_rows(reference_run)
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["work"]["reused"].get("size_filter", 0) >= 1
    assert [i["status"] for i in manifest["invocations"]] == ["stopped", "complete"]
    assert manifest["journaled_jobs"] == 0  # every chunk ended: its journal is gone


def test_rows_a_recheck_rejected_leave_the_set_and_rows_past_the_target_fill_in(
    tmp_path, tiny_config, reference_run, prefect_api
):
    """``--drop-rechecked AUDIT``: the row the audit rejected is out of accepted.parquet with
    a ``recheck`` verdict naming the audit's stage and reason, every other row stays, a row
    past the target takes the free place, and nothing is computed again (the rounds and
    chunks are those of the run); a later invocation keeps the row out."""
    from runfactory import make_run

    from opsynth.store import read_tasks

    run = tmp_path / "run"
    shutil.copytree(reference_run, run)
    before = accepted_rows(run)
    verdicts = pq.read_table(run / "verdicts.parquet").to_pylist()
    over = [v["task_id"] for v in verdicts if v["reason"] == "over_target"]
    rows = read_tasks(run / "accepted.parquet")
    audit = make_run(
        tmp_path / "audit", seed=5, audit=True, tasks=rows, reject={0: ("runtime", "too_fast")}
    )
    args = ("run", "--out", str(run), "--config", str(tiny_config))
    proc = opsynth(*args, "--drop-rechecked", str(audit), cwd=tmp_path, env=prefect_api)
    said = proc.stdout + proc.stderr
    assert "1 more rows the re-check" in said, said[-2000:]
    after = accepted_rows(run)
    kept = [r for r in after if r[0] != rows[0].id]
    assert rows[0].id not in {r[0] for r in after}
    assert [r for r in kept if r in before] == before[1:]
    assert {r[0] for r in kept if r not in before} <= set(over)
    assert len(after) == min(3, len(before) - 1 + len(over))
    assert proc.returncode == (0 if over else 1), proc.stderr[-3000:]
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["work"]["computed"] == {} and manifest["rechecked_dropped"] == 1
    mine = [
        v for v in pq.read_table(run / "verdicts.parquet").to_pylist() if v["task_id"] == rows[0].id
    ]
    [failed] = [v for v in mine if not v["passed"]]
    assert (failed["stage"], failed["reason"]) == ("recheck", "too_fast")
    assert failed["detail"].startswith("runtime: ")
    # a later invocation, without the option, leaves it out too
    proc = opsynth(*args, cwd=tmp_path, env=prefect_api)
    assert accepted_rows(run) == after
    # an audit of rows this run never accepted is one line, and changes nothing
    stranger = make_run(tmp_path / "stranger", seed=6, audit=True)
    proc = opsynth(*args, "--drop-rechecked", str(stranger), cwd=tmp_path, env=prefect_api)
    assert proc.returncode == 2 and "did not accept" in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1
    assert accepted_rows(run) == after


def test_a_recheck_reuses_an_earlier_audits_verdicts_and_checks_only_new_rows(
    tmp_path, tiny_config, reference_run, prefect_api
):
    """``opsynth audit --reuse EARLIER``: the tasks the earlier audit checked keep its
    verdicts (not its dedup) and are not run again; only the new ones are; and an earlier
    audit of another config is refused in one line before anything runs."""
    from opsynth.store import read_tasks, write_tasks

    first_rows = read_tasks(reference_run / "accepted.parquet")
    rejected = read_tasks(reference_run / "rejected.parquet")
    first_set, second_set = tmp_path / "first.parquet", tmp_path / "second.parquet"
    write_tasks(first_rows, first_set)
    write_tasks(first_rows[1:] + rejected[:1], second_set)
    cfg = ("--config", str(tiny_config), "--device", "cpu")
    earlier, later = tmp_path / "earlier", tmp_path / "later"
    proc = opsynth(
        "audit",
        "--input",
        str(first_set),
        "--out",
        str(earlier),
        *cfg,
        cwd=tmp_path,
        env=prefect_api,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    args = ("audit", "--input", str(second_set), "--out", str(later), *cfg, "--reuse", str(earlier))
    proc = opsynth(*args, cwd=tmp_path, env=prefect_api)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((later / "run.json").read_text())
    assert manifest["reused_rows"] == len(first_rows) - 1 and manifest["reused_from"] == str(
        earlier
    )
    assert manifest["counts"]["candidates"] == len(first_rows)
    # one chunk, the one new task's, where the earlier audit screened all of its own
    earlier_work = json.loads((earlier / "run.json").read_text())["work"]["computed"]
    assert manifest["work"]["computed"]["screen"] == 1 < earlier_work["screen"]

    def stage_rows(audit: Path, task_id: str) -> list[tuple]:
        rows = pq.read_table(audit / "verdicts.parquet").to_pylist()
        return [
            (v["stage"], v["passed"], v["reason"], v["measures"])
            for v in rows
            if v["task_id"] == task_id and v["stage"] != "dedup"
        ]

    for task in first_rows[1:]:
        assert stage_rows(later, task.id) == stage_rows(earlier, task.id)
    assert stage_rows(later, rejected[0].id)  # the new task was checked
    # dedup ran over the whole set again
    deduped = {
        v["task_id"]
        for v in pq.read_table(later / "verdicts.parquet").to_pylist()
        if v["stage"] == "dedup"
    }
    assert {t.id for t in first_rows[1:]} <= deduped
    other = tiny_config.with_name("other.toml")
    other.write_text(tiny_config.read_text().replace("timed_runs = 3", "timed_runs = 4"))
    refused = (
        "audit",
        "--input",
        str(second_set),
        "--out",
        str(tmp_path / "x"),
        "--config",
        str(other),
        "--device",
        "cpu",
        "--reuse",
        str(earlier),
    )
    proc = opsynth(*refused, cwd=tmp_path, env=prefect_api)
    assert proc.returncode == 2 and "same config and device" in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1
