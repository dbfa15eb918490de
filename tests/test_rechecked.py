"""Rows a release's re-check rejected (``opsynth.rechecked``): recorded in the run directory as
``recheck`` verdicts with the audit's reason, merged over several audits, refused for audits of
other rows; and an earlier audit's verdicts carried into a re-check of a changed set, but never
its set stages, nor across configs or devices."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from runfactory import make_run

from opsynth.rechecked import (
    RECHECK_STAGE,
    RECHECKED_FILE,
    RecheckError,
    carried_verdicts,
    read_rechecked,
    record_rechecked,
)
from opsynth.rundata import load_run
from opsynth.store import RunDir, read_tasks


@pytest.fixture
def release(tmp_path) -> Path:
    return make_run(tmp_path / "run", seed=1)


def audit_of(release: Path, root: Path, reject: dict, seed: int = 7) -> Path:
    rows = read_tasks(release / "accepted.parquet")
    return make_run(root, seed=seed, audit=True, tasks=rows, reject=reject)


def test_rejected_rows_are_recorded_with_the_audits_reason(release, tmp_path):
    rows = read_tasks(release / "accepted.parquet")
    audit = audit_of(release, tmp_path / "a", {0: ("runtime", "too_fast"), 2: ("dedup", "exact")})
    assert record_rechecked(RunDir.open_existing(release), audit) == (2, 2)
    dropped = read_rechecked(RunDir.open_existing(release))
    assert set(dropped) == {rows[0].id, rows[2].id}
    first = dropped[rows[0].id]
    assert (first.stage, first.passed, first.reason) == (RECHECK_STAGE, False, "too_fast")
    assert first.detail.startswith("runtime: ") and first.measures["stage"] == "runtime"
    assert first.measures["audit"] == str(audit)
    assert dropped[rows[2].id].reason == "exact"


def test_a_second_audit_adds_to_the_record_and_a_repeat_adds_nothing(release, tmp_path):
    run = RunDir.open_existing(release)
    rows = read_tasks(release / "accepted.parquet")
    record_rechecked(run, audit_of(release, tmp_path / "a", {0: ("runtime", "too_fast")}))
    again = audit_of(release, tmp_path / "b", {0: ("compile", "x"), 1: ("randomness", "random")})
    assert record_rechecked(run, again) == (1, 2)
    assert record_rechecked(run, again) == (0, 2)
    dropped = read_rechecked(run)
    assert dropped[rows[0].id].detail.startswith("runtime: ")  # the first record stands
    assert dropped[rows[1].id].reason == "random"


def test_an_audit_of_other_rows_or_a_run_is_refused(release, tmp_path):
    run = RunDir.open_existing(release)
    other = make_run(tmp_path / "other", seed=3, audit=True)
    with pytest.raises(RecheckError, match="rows this run did not accept"):
        record_rechecked(run, other)
    with pytest.raises(RecheckError, match="is a run, not an audit"):
        record_rechecked(run, make_run(tmp_path / "run2", seed=4))
    with pytest.raises(RecheckError, match="no run.json"):
        record_rechecked(run, tmp_path / "nowhere")
    assert not (release / RECHECKED_FILE).exists()


def test_an_earlier_audits_verdicts_are_carried_but_not_its_set_stages(release, tmp_path):
    audit = load_run(audit_of(release, tmp_path / "a", {1: ("runtime", "too_fast")}))
    ids = audit.candidates["id"].to_list()
    wanted = [ids[0], ids[1], "not-checked-before"]
    cfg_hash, device = audit.manifest["config_hash"], audit.manifest["device"]
    carried, verdicts = carried_verdicts(audit, wanted, cfg_hash, device)
    assert carried == {ids[0], ids[1]}
    assert {v.task_id for v in verdicts} == carried
    assert "dedup" not in {v.stage for v in verdicts}
    before = [
        (v["task_id"], v["stage"], v["reason"], json.loads(v["measures"]))
        for v in audit.verdicts.iter_rows(named=True)
        if v["task_id"] in carried and v["stage"] != "dedup"
    ]
    assert [(v.task_id, v.stage, v.reason, v.measures) for v in verdicts] == before


def test_verdicts_of_another_config_or_device_are_not_carried(release, tmp_path):
    audit = load_run(audit_of(release, tmp_path / "a", {}))
    cfg_hash = audit.manifest["config_hash"]
    with pytest.raises(RecheckError, match="same config and device"):
        carried_verdicts(audit, [], "0123456789ab", "cpu")
    with pytest.raises(RecheckError, match="same config and device"):
        carried_verdicts(audit, [], cfg_hash, "cuda")
    with pytest.raises(RecheckError, match="is a run, not an audit"):
        carried_verdicts(load_run(release), [], cfg_hash, "cpu")
