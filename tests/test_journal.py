"""A part-done chunk's journal: the jobs it settled are read back, across chunks, without the
line a kill cut short, counted for the run's manifest (``flows.size_screen.journaled``), and
told when a run stops at its time limit."""

from __future__ import annotations

from pathlib import Path

from opsynth.flows.size_screen import JOURNAL_SUFFIX, Journal, journaled
from opsynth.record import Verdict
from opsynth.store import RunDir


def test_settled_jobs_are_read_back_from_every_journal(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "run")
    work = run.root / "work"
    work.mkdir(exist_ok=True)
    assert journaled(run) == set()
    first = Journal(work / f"size_filter-a{JOURNAL_SUFFIX}")
    first.record("job-1", {"t1": [Verdict("t1", "eager", True, "ok")]})
    first.record("job-2", {"t2": [Verdict("t2", "eager", False, "forward_error")]})
    second = work / f"size_filter-b{JOURNAL_SUFFIX}"
    Journal(second).record("job-3", {})
    with open(second, "a") as fh:
        fh.write('{"job": "job-4", "results": {"t4"')  # the line a kill cut short
    assert journaled(run) == {"job-1", "job-2", "job-3"}
    assert Journal(work / f"size_filter-a{JOURNAL_SUFFIX}").done["job-2"]["t2"][0].reason == (
        "forward_error"
    )


def test_a_stopped_run_says_what_its_journal_keeps() -> None:
    from opsynth.flows.cli import stopped_line

    manifest = {"counts": {"accepted": 2539}, "journaled_jobs": 144}
    said = stopped_line(manifest, 510.0, 6000)
    assert "(510 s) with 2539 of 6000 accepted; 144 settled jobs of a part-done chunk" in said
    assert said.endswith("; re-run to resume")
    at_a_boundary = stopped_line({**manifest, "journaled_jobs": 0}, 1.0, 3)
    assert "journal" not in at_a_boundary and "with 2539 of 3 accepted; re-run" in at_a_boundary


def test_a_stopped_run_says_what_its_part_done_chunk_leaves_to_the_next_invocation() -> None:
    """Read from the invocation's line (``ChunkStopped.left``): the counts that are not zero."""
    from opsynth.flows.cli import audit_stopped_line
    from opsynth.flows.size_screen import ChunkStopped

    left = ChunkStopped(not_started=3, not_retried=113, abandoned=0).left
    manifest = {
        "counts": {"candidates": 0},
        "unique_rows": 600,
        "journaled_jobs": 55,
        "invocations": [{"left_mid_chunk": left}],
    }
    said = audit_stopped_line(manifest, 150.0)
    assert "55 settled jobs of a part-done chunk kept in its journal (left to the next " in said
    assert "invocation: 3 candidates not started, 113 set-aside jobs not retried); re-run" in said
    assert "abandoned" not in said
