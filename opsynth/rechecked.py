"""Rows a release's re-check rejected, dropped from the run that accepted them.

A release is re-checked by a second, independent pass: ``opsynth audit`` of the run's accepted
rows. A row that pass rejects is not released. ``opsynth run --drop-rechecked AUDIT`` records
each such row in the run directory (``RECHECKED_FILE``) as a failing ``recheck`` verdict that
names the audit's stage, reason and detail; every later invocation of the run leaves those rows
out of its export (after the rounds, so no chunk's work changes), the source quotas fill their
places from the rows past the target, and the funnel says why each one went. An audit that
checked rows the run did not accept is refused: it says nothing about this run.

Plain functions over ``RunData``, ``RunDir`` and ``Verdict``; no Prefect. ``RunData`` (polars)
is imported only where an audit is read: a run imports this module for ``read_rechecked`` on
GPU hosts that have no polars.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from opsynth.record import Verdict
from opsynth.store import RunDir, RunDirError, read_tasks, read_verdicts, write_verdicts

if TYPE_CHECKING:
    from opsynth.rundata import RunData

RECHECK_STAGE = "recheck"
RECHECKED_FILE = "rechecked.parquet"  # in the run directory, beside run.json


class RecheckError(ValueError):
    """The audit cannot be applied to the run; one line with the fix."""


def rejections(audit: RunData, source: str) -> list[Verdict]:
    """One failing ``recheck`` verdict per row the audit rejected: its first failing stage's
    reason, that stage and detail in the detail, and where it came from in the measures."""
    config_hash = str(audit.manifest.get("config_hash", ""))
    return [
        Verdict(
            task_id=row["id"],
            stage=RECHECK_STAGE,
            passed=False,
            reason=row["reason"],
            detail=f"{row['stage']}: {row['detail']}"[:2000],
            measures={"audit": source, "audit_config_hash": config_hash, "stage": row["stage"]},
        )
        for row in audit.rejections().iter_rows(named=True)
    ]


def read_rechecked(run: RunDir) -> dict[str, Verdict]:
    """The rows this run's re-checks rejected so far, by task id (none without the file)."""
    path = run.path(RECHECKED_FILE)
    return {v.task_id: v for v in read_verdicts(path)} if path.exists() else {}


def record_rechecked(run: RunDir, audit_path: Path) -> tuple[int, int]:
    """Add the rows the audit at ``audit_path`` rejected to the run's record; returns (rows
    newly dropped, rows dropped in all). Raises ``RecheckError`` when the audit is not one,
    or checked rows the run's last export did not accept."""
    from opsynth.rundata import load_run

    try:
        audit = load_run(Path(audit_path), partial=True)
    except RunDirError as exc:
        raise RecheckError(f"--drop-rechecked {exc}") from exc
    if audit.kind != "audit":
        raise RecheckError(f"--drop-rechecked {audit_path} is a run, not an audit of its rows")
    if not run.path("accepted.parquet").exists():
        raise RecheckError(f"{run.root} has exported no accepted rows to re-check yet")
    accepted = {t.id for t in read_tasks(run.path("accepted.parquet"))}
    recorded = read_rechecked(run)
    foreign = set(audit.candidates["id"].to_list()) - accepted - set(recorded)
    if foreign:
        raise RecheckError(
            f"--drop-rechecked {audit_path} checked {len(foreign)} rows this run did not "
            f"accept (e.g. {sorted(foreign)[0]}); audit the run's accepted.parquet"
        )
    new = [v for v in rejections(audit, str(audit_path)) if v.task_id not in recorded]
    merged = [*recorded.values(), *new]
    write_verdicts(merged, run.path(RECHECKED_FILE))
    return len(new), len(merged)


# verdicts about the whole set, not one task: an audit of another set decides them again
SET_STAGES = frozenset({"dedup", "export"})


def carried_verdicts(
    prior: RunData, task_ids: list[str], config_hash: str, device: str
) -> tuple[set[str], list[Verdict]]:
    """The ids among ``task_ids`` an earlier audit (``prior``, finished chunks only) checked,
    and its verdicts on them but for the set stages, for an audit with the same config and
    device that need not check them again (a re-check after rows were replaced checks only
    the new ones; dedup runs over the whole set again). ``RecheckError`` when the earlier
    audit was made with another config or device, so its verdicts would not be this audit's."""
    check_reusable(prior, config_hash, device)
    wanted = set(task_ids)
    carried = set(prior.candidates["id"].to_list()) & wanted
    verdicts = [
        Verdict.from_row(row)
        for row in prior.verdicts.iter_rows(named=True)
        if row["task_id"] in carried and row["stage"] not in SET_STAGES
    ]
    return carried, verdicts


def check_reusable(prior: RunData, config_hash: str, device: str) -> None:
    """``RecheckError`` unless ``prior`` is an audit made with this config on this device."""
    made = (str(prior.manifest.get("config_hash", "")), str(prior.manifest.get("device", "")))
    if prior.kind != "audit":
        raise RecheckError(f"--reuse {prior.source} is a run, not an audit")
    if made != (config_hash, device):
        raise RecheckError(
            f"--reuse {prior.source} was made with config {made[0]} on {made[1]}, this audit "
            f"has config {config_hash} on {device}; audit with the same config and device"
        )
