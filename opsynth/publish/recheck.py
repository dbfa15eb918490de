"""A release's re-check: an ``opsynth audit`` of the run's accepted rows on a fresh process pool,
a second, independent pass whose outcome the dataset card states beside the run's own funnel.

The audit must cover exactly the run's accepted rows (task ids are content hashes, so the same
code gives the same id in both) and have finished; anything else is one ``PublishError`` line.
Plain functions over ``RunData``; the card renders what ``Recheck`` holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from opsynth.publish.errors import PublishError
from opsynth.report import tables as t
from opsynth.rundata import RunData, load_run
from opsynth.store import COMPLETE, RunDirError

# the stage whose rejections are duplicates, not failing tasks
DEDUP_STAGE = "dedup"


@dataclass(frozen=True)
class Recheck:
    """What the card states about the re-check: its run data (device, versions, config hash
    and funnel are in its manifest and verdicts), how many of the release's rows it covered
    and passed, the reasons of those it did not pass, and the largest KernelBench similarity
    it measured."""

    data: RunData
    rows: int
    passed: int
    failures: pl.DataFrame  # stage, reason, count: the first failing verdict per row
    duplicates: int
    max_similarity: float | None


def load_recheck(path: Path, run: RunData) -> Recheck:
    """The audit at ``path`` as the re-check of ``run``; one ``PublishError`` line when it is
    not an audit, has not finished, or did not check exactly the run's accepted rows."""
    try:
        audit = load_run(Path(path))
    except RunDirError as exc:
        raise PublishError(f"--recheck {exc}") from exc
    if audit.kind != "audit":
        raise PublishError(f"--recheck {path} is a run, not an audit of the run's accepted rows")
    if audit.manifest.get("status") != COMPLETE:
        raise PublishError(
            f"--recheck {path} is {audit.manifest.get('status')!r}: re-run its `opsynth audit` "
            "command to finish it"
        )
    released = set(run.accepted["id"].to_list())
    checked = set(audit.candidates["id"].to_list())
    if checked != released:
        missing, extra = len(released - checked), len(checked - released)
        raise PublishError(
            f"--recheck {path} checked {len(checked)} rows, the run accepted {len(released)}: "
            f"{missing} of the run's rows not checked, {extra} rows not the run's; audit "
            "the run's accepted.parquet"
        )
    failures = (
        audit.rejections()
        .group_by("stage", "reason")
        .agg(pl.len().alias("count"))
        .sort(["count", "stage", "reason"], descending=[True, False, False])
    )
    duplicates = int(failures.filter(pl.col("stage") == DEDUP_STAGE)["count"].sum())
    similarity = t.similarity_values(audit)
    return Recheck(
        data=audit,
        rows=len(checked),
        passed=audit.accepted.height,
        failures=failures,
        duplicates=duplicates,
        max_similarity=float(similarity.max()) if similarity.len() else None,
    )
