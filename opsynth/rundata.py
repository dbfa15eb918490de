"""A finished run or audit as polars frames: what the Hub export and the audit report read.

A run directory is read through ``opsynth.store`` (so a file of another record schema is refused
in one line) and must have finished: a run still going, or killed before export, has no
consistent set of final files. ``opsynth.publish.layout.load_revision`` builds the same object
from a published Hub revision, so the report renders identically from either.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from opsynth.store import FINISHED, STOPPED, RunDir, RunDirError, read_table

FRAMES = ("candidates", "accepted", "verdicts")


@dataclass
class RunData:
    """``candidates`` and ``accepted`` have the Task columns (``opsynth.store.TASK_SCHEMA``),
    ``verdicts`` the Verdict columns; ``manifest`` is run.json; ``source`` says where it came
    from (a path, or ``repo@revision``)."""

    manifest: dict[str, Any]
    candidates: pl.DataFrame
    accepted: pl.DataFrame
    verdicts: pl.DataFrame
    source: str

    @property
    def kind(self) -> str:
        """``audit`` for ``opsynth audit`` runs (no compose stage), else ``regenerate``."""
        return self.manifest.get("kind", "regenerate")

    @property
    def rejected(self) -> pl.DataFrame:
        return self.candidates.join(self.accepted.select("id"), on="id", how="anti")

    def setting(self, section: str, key: str, default: Any = None) -> Any:
        """A config value as the run recorded it (older runs may lack newer keys)."""
        return self.manifest.get("config", {}).get(section, {}).get(key, default)

    def rejections(self) -> pl.DataFrame:
        """One row per rejected candidate: the first verdict that failed it (``stage``,
        ``reason``, ``detail``); the verdicts are in the order the stages met the task."""
        failed = self.verdicts.filter(~pl.col("passed"))
        first = failed.group_by("task_id", maintain_order=True).first()
        return first.select(
            pl.col("task_id").alias("id"), "stage", "reason", "detail", "measures"
        ).join(self.accepted.select("id"), on="id", how="anti")


def load_run(root: Path, *, partial: bool = False) -> RunData:
    """A finished run directory, or with ``partial`` also one a time limit stopped (its
    finished chunks); every problem is one ``RunDirError`` line naming the fix."""
    run = RunDir.open_existing(Path(root))
    manifest = run.read_manifest()
    status = manifest.get("status")
    if status not in FINISHED and not (partial and status == STOPPED):
        fix = (
            ": re-run the command that made it to finish it (`opsynth report --partial` "
            "reports its finished chunks)"
            if status == STOPPED
            else "; wait for it, or re-run the command that made it to finish it"
        )
        raise RunDirError(f"{root} has not finished (status {status!r}){fix}")
    frames = {}
    for name in FRAMES:
        path = run.path(f"{name}.parquet")
        if not path.is_file():
            raise RunDirError(
                f"{root} has no {name}.parquet; re-run the command that made it to finish it"
            )
        frames[name] = pl.from_arrow(read_table(path))
    return RunData(manifest=manifest, source=str(root), **frames)


def decode_measures(frame: pl.DataFrame, column: str = "measures") -> pl.DataFrame:
    """``frame`` with its JSON ``column`` spread into columns (absent keys are null)."""
    rows = [json.loads(m or "{}") for m in frame[column].to_list()]
    spread = pl.DataFrame(rows, infer_schema_length=None, strict=False) if rows else pl.DataFrame()
    if spread.width == 0:
        return frame.drop(column)
    clash = [c for c in spread.columns if c in frame.columns]
    return pl.concat([frame.drop(column), spread.drop(clash)], how="horizontal")
