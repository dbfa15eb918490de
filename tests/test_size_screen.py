"""Sizing and filtering a chunk pipelined (``flows.size_screen``), by separate probes or inline
in each candidate's filter process, decides as the two-stage path does: the same sized tasks
and the same verdicts, with nothing probed that static checks reject; inline, in one job per
candidate, and a forged sizing claim is the candidate's protocol violation. Every path runs
on one real sandboxed pool inside a Prefect flow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "runner_screen.py"


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory, prefect_api: dict[str, str]) -> dict:
    out = tmp_path_factory.mktemp("paths")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), "local", "pipelined"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **prefect_api},
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# the chunk: sizable() (three sizable tasks, one plain), the forbidden one, two twins, tasks()
FORBIDDEN = 4
TWINS = (5, 6)


@pytest.mark.parametrize("path", ["pipelined", "inline"])
def test_pipelined_sizing_and_filtering_decide_as_two_stages(paths: dict, path: str) -> None:
    two, piped = paths["two_stage"], paths[path]
    assert two["stages_timed"] == ["filter", "size"] and piped["stages_timed"] == ["size_filter"]
    pairs = list(zip(two["final"], piped["final"], strict=True))
    del pairs[FORBIDDEN]
    for (two_id, two_sizing), (piped_id, piped_sizing) in pairs:
        assert piped_id == two_id
        assert piped["verdicts"][piped_id] == two["verdicts"][two_id]
        assert (piped_sizing is None) == (two_sizing is None)
        if piped_sizing is not None:
            assert [s["value"] for s in piped_sizing["steps"]] == [
                s["value"] for s in two_sizing["steps"]
            ]
            assert piped_sizing["chosen"] == two_sizing["chosen"]
    # the three sizable tasks grew (to max_value), so their rows are under their sized ids
    for _, sizing in piped["final"][:3]:
        assert sizing["chosen"] > sizing["steps"][0]["value"], sizing
        assert sizing["from_id"]


def test_inline_sizing_runs_one_job_per_candidate(paths: dict) -> None:
    inline, piped = paths["inline"], paths["pipelined"]
    sized = [sizing for _, sizing in inline["final"] if sizing and sizing["steps"]]
    assert len(sized) == 4 and all(s["measured"] == "in_filter_process" for s in sized)
    rows_of = inline["verdicts"]
    executed = {task_id for task_id, rows in rows_of.items() if any(r[0] == "eager" for r in rows)}
    # one job per candidate that reached the sandbox, and one more: the second twin's sized
    # job, whose code the first twin keeps, so it is filtered again as composed
    assert inline["jobs"] == len(executed) + 1, (inline["jobs"], len(executed))
    assert piped["jobs"] > inline["jobs"] + 5, (piped["jobs"], inline["jobs"])


def test_a_forged_sizing_claim_is_a_protocol_violation(paths: dict) -> None:
    forged = paths["forged"]
    for task_id, sizing in forged["final"][:2]:
        assert sizing is None, sizing  # rejected as composed
        *prefilters, last = forged["verdicts"][task_id]
        assert all(passed for _, passed, _ in prefilters) and len(prefilters) == 2
        assert last == ["eager", False, "protocol_violation"]
        assert "sizing claim" in forged["details"][task_id], forged["details"][task_id]


def test_what_static_checks_reject_is_not_probed(paths: dict) -> None:
    two, piped = paths["two_stage"], paths["pipelined"]
    task_id, sizing = piped["final"][FORBIDDEN]
    assert sizing is None  # never measured, so it keeps its composed id
    assert two["final"][FORBIDDEN][1]["steps"], "the two-stage path probes it first"
    [(stage, passed, reason)] = piped["verdicts"][task_id]
    assert (stage, passed) == ("static", False) and reason != "ok"
    assert two["verdicts"][two["final"][FORBIDDEN][0]] == [[stage, passed, reason]]


def test_of_two_candidates_sized_to_one_code_the_first_keeps_it(paths: dict) -> None:
    for path in ("two_stage", "pipelined", "inline"):
        (first_id, first), (second_id, second) = [paths[path]["final"][i] for i in TWINS]
        assert first["chosen"] == 256 and first["from_id"], first
        assert second is None  # back to its composed size: no sizing record
        assert first_id != second_id
        assert paths[path]["verdicts"][second_id]  # and filtered as composed


def test_a_candidate_that_poisons_its_context_while_sizing_is_filtered_afresh(paths) -> None:
    forged = paths["forged"]
    task_id, sizing = forged["final"][2]
    assert [s["reason"] for s in sizing["steps"]] == ["", "cuda_error"], sizing
    assert sizing["chosen"] == 4 and "from_id" not in sizing  # the size it measured
    *_, last = forged["verdicts"][task_id]
    assert last[2] != "cuda_error", last  # its verdict comes from a fresh process


def test_a_candidate_killed_before_it_claims_a_size_is_sized_by_separate_probes(paths) -> None:
    hung = paths["hung"]
    [(task_id, sizing)] = hung["final"]
    assert "measured" not in sizing, sizing  # the probes' record, not a claim
    assert [s["value"] for s in sizing["steps"]] == [4, 256]
    assert [s["reason"] for s in sizing["steps"]] == ["", "timeout"], sizing
    assert sizing["chosen"] == 4
    # the inline job, the two probes and the filter run of the size it measured
    assert hung["jobs"] == 4, hung["jobs"]


def test_a_chunk_stopped_or_killed_mid_way_resumes_from_its_journal(paths: dict) -> None:
    """Jobs that would not end by the time limit do not start. At its limit the chunk starts
    no candidate and finishes those begun, every job
    journaled; killed later mid-way, its settled jobs are on disk too; the resumed run
    replays them instead of running them and decides as an uninterrupted inline run."""
    resumed, inline = paths["resumed"], paths["inline"]
    # a job that would not end by the limit, judged by the jobs' latency, never starts
    assert resumed["ran_reserved"] == resumed["journaled_reserved"] == 0, resumed
    assert 1 <= resumed["journaled_limited"] == resumed["ran_limited"] < inline["jobs"], resumed
    assert resumed["journaled"] >= resumed["journaled_limited"] + 3, resumed
    assert resumed["replayed"] == resumed["journaled"]
    # nothing settled runs twice: the second pool ran what the journal did not hold
    assert resumed["ran_second"] == inline["jobs"] - resumed["journaled"], resumed
    assert not resumed["journal_left"]  # the chunk's work files replace it
    for (got_id, got), (want_id, want) in zip(resumed["final"], inline["final"], strict=True):
        assert got_id == want_id
        assert resumed["verdicts"][got_id] == inline["verdicts"][want_id]
        assert (got or {}).get("chosen") == (want or {}).get("chosen")


def test_a_job_still_running_well_past_the_limit_is_abandoned_not_waited_for(paths) -> None:
    """A forward that never returns holds the chunk only until the limit plus the overrun
    allowance, not until its own timeout: it is withdrawn from the pool (its worker
    replaced, and the pool keeps serving the paths after this one) and not journaled, so a
    later invocation runs it; the job that finished is journaled."""
    abandoned = paths["abandoned"]
    assert abandoned["stopped"].endswith("1 abandoned past the limit"), abandoned
    assert 15 <= abandoned["seconds"] < abandoned["job_timeout_s"], abandoned
    assert abandoned["journaled"] == [abandoned["quick_id"]], abandoned
    assert abandoned["cancelled"] == 1, abandoned


def test_the_next_chunks_first_jobs_run_on_workers_the_tail_leaves_idle(paths: dict) -> None:
    """Started while the first chunk's last job runs, taken over by the second chunk's
    pipeline: no job runs twice, and the second chunk decides as it does alone."""
    ahead, inline = paths["ahead"], paths["inline"]
    assert ahead["taken_over"] >= 1, ahead
    # the same candidates as the inline path's chunk but the one static checks reject
    assert ahead["jobs"] == inline["jobs"], (ahead["jobs"], inline["jobs"])
    same = [inline["final"][i] for i in (0, 1, 2, 3, *TWINS)]
    for (got_id, got), (want_id, want) in zip(ahead["final"], same, strict=True):
        assert got_id == want_id
        assert ahead["verdicts"][got_id] == inline["verdicts"][want_id]
        assert (got or {}).get("chosen") == (want or {}).get("chosen")


def test_an_audit_checks_each_task_as_given_in_one_job(paths: dict) -> None:
    """With sizing off (``opsynth audit``), nothing is probed: one filter job per task that
    static checks pass, also for the next chunk's tasks started ahead, and the verdicts the
    two-stage path gives the tasks it leaves unsized."""
    given, two = paths["as_given"], paths["two_stage"]
    assert given["jobs"] == 7, given  # plain, the second twin and the five of tasks()
    assert len(given["verdicts"]) == 8  # and the statically rejected one, unprobed
    # the two-stage path may grow the statically rejected task before it rejects it: its
    # rows are then under the sized id (how fast its probes ran decides)
    two_id = {(s or {}).get("from_id", task_id): task_id for task_id, s in two["final"]}
    for task_id, rows in given["verdicts"].items():
        want = two["verdicts"][two_id[task_id]]
        assert [tuple(r) for r in rows] == [tuple(r) for r in want], task_id
    assert sum(rows[-1][0] == "static" for rows in given["verdicts"].values()) == 1


def test_a_chunks_oom_jobs_are_retried_together_after_the_rest(paths: dict) -> None:
    """Jobs that end in a ``retry_alone`` reason are set aside and retried together once the
    rest of the chunk is done: one ``retry_alone`` call for both one-job batches, whose tasks
    share a wave, instead of a drain of the whole pool per ``oom``."""
    retried = paths["retried"]
    log, ooms, others = retried["log"], retried["ooms"], retried["others"]
    assert retried["retry_calls"] == [2] and retried["retried_alone"] == 2
    assert all(retried["last"][task_id][0] != "oom" for task_id in others)
    order = [task_id for task_id, _ in log]
    after_the_rest = max(order.index(task_id) for task_id in others)
    waves = []
    for task_id in ooms:
        runs = [i for i, (found, _) in enumerate(log) if found == task_id]
        # side by side with the rest; then in the shared wave, after the rest; failing the
        # same way there, once more alone
        assert len(runs) == 3 and runs[1] > after_the_rest, log
        assert log[runs[2]][1] == 0, log
        waves.append(runs[1])
        reason, first = retried["last"][task_id]
        assert reason == "oom" and first["reason"] == "oom" and first["retry_wave"] == 1
        assert "Tried to allocate" in first["detail"]
    # the shared wave: both dispatched one after the other, the pool otherwise empty
    assert abs(waves[0] - waves[1]) == 1, log
    assert sorted(log[i][1] for i in waves) == [0, 1], log
    # past the time limit's cutoff nothing set aside is retried or journaled: the chunk stops
    assert retried["late_retry_calls"] == [], retried
    assert ", 1 jobs not retried, 0 abandoned" in retried["late_stopped"], retried
    assert not set(ooms) & set(retried["late_journaled"]), retried
    assert set(retried["late_journaled"]) <= set(others), retried


def test_a_size_too_fast_for_the_window_is_rejected_alike_before_its_filters(paths) -> None:
    """``sizing.too_fast_share``: tasks that max_value keeps far below the window's lower edge
    are ``too_fast`` at stage ``sizing`` on every path, with no filter job run for them; the
    inline path's job per candidate stopped at its claim."""
    found = paths["too_fast"]
    two, piped, inline = found["two_stage"], found["pipelined"], found["inline"]
    expected = [("static", True, "ok"), ("decontam", True, "ok"), ("sizing", False, "too_fast")]
    for path in (two, piped, inline):
        assert [[tuple(r) for r in rows] for rows in path["verdicts"]] == [expected] * 3, path
        # the 256-row probe reads nearest the 1.4 s target, unless a loaded host's noise
        # reverses a 64-fold size; either way both read far below the edge
        assert all("sizing probe at the chosen size (" in d for d in path["details"]), path
    assert two["jobs"] == piped["jobs"] == 6, (two, piped)  # two probes each (4 -> 256)
    assert inline["jobs"] == 3, inline  # one inline job each
