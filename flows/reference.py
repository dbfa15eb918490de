"""``opsynth report --reference``: loading the reference set and the dedup-side measure.

The report core (``opsynth.report.fidelity``) compares profiles and never imports a stage;
the structural-duplicate share needs ``ast_dedup``'s forward-graph hash, so it is computed
here and handed over. A reference is the shipped ``ops6k`` profile, a profile JSON file, a
task parquet file, or a Hugging Face Hub dataset id; only task rows give a reference
structural share (a profile has no code to hash).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from opsynth.profile import SHIPPED, Profile, load_profile, ops_list, read_rows
from opsynth.report.fidelity import Fidelity, compare, task_rows
from opsynth.rundata import RunData

COLUMNS = ("ops", "data_source", "code")
HUB_SPLIT = "train"


class ReferenceLoadError(ValueError):
    """The reference could not be read; one line with the fix."""


def load_reference(spec: str) -> tuple[str, Profile | list[dict[str, Any]]]:
    """``(label, profile or task rows)`` for ``--reference spec``."""
    path = Path(spec)
    if spec in SHIPPED or path.suffix == ".json":
        try:
            profile = load_profile(spec)
        except ValueError as exc:
            raise ReferenceLoadError(f"--reference: {exc}") from exc
        if profile is None:  # a file named like the "uniform" keyword; never a reference
            raise ReferenceLoadError(f"--reference {spec}: not a profile")
        return f"{spec} (profile {profile.name!r}, {profile.tasks} tasks)", profile
    if path.exists():
        try:
            rows = read_rows(path)
        except ValueError as exc:
            raise ReferenceLoadError(f"--reference: {exc}") from exc
        return f"{spec} ({len(rows)} tasks)", rows
    if spec.count("/") != 1 or spec.endswith(".parquet"):
        raise ReferenceLoadError(
            f"--reference {spec}: no such file and not a Hub dataset id ORG/NAME; use ops6k, "
            "a profile JSON, a task parquet or ORG/NAME"
        )
    rows = _hub_rows(spec)
    return f"{spec} (Hub, {len(rows)} tasks)", rows


def _hub_rows(repo_id: str) -> list[dict[str, Any]]:
    from opsynth.flows.hub_data import HubLoadError, load_hub_dataset

    try:
        loaded = load_hub_dataset(repo_id, split=HUB_SPLIT)
    except HubLoadError as exc:
        raise ReferenceLoadError(
            f"--reference {exc}; check the id and the network, or pass a local parquet or profile"
        ) from exc
    missing = [c for c in COLUMNS if c not in loaded.column_names]
    if missing:
        raise ReferenceLoadError(
            f"--reference {repo_id}: lacks column(s) {', '.join(missing)}; expected {COLUMNS}"
        )
    return [{c: row[c] for c in COLUMNS} for row in loaded]


def structural_share(rows: Sequence[Mapping[str, Any]], wl_iterations: int = 3) -> float | None:
    """Share of tasks whose forward dataflow graph repeats another task's (``[dedup]
    structural`` with exact and near matching off, so every task sharing a graph with its
    cluster's representative counts); None for no tasks."""
    if not rows:
        return None
    from opsynth.ast_dedup.dedup import STRUCTURAL, dedup
    from opsynth.config import DedupConfig
    from opsynth.record import Task

    tasks = [
        Task(ops=ops_list(r["ops"]), data_source=str(r["data_source"]), code=str(r["code"]))
        for r in rows
    ]
    cfg = DedupConfig(exact=False, near=False, structural=True, wl_iterations=wl_iterations)
    result = dedup(tasks, cfg)
    return result.counts.get(f"dropped_{STRUCTURAL}", 0) / len(tasks)


def fidelity_for(data: RunData, spec: str) -> Fidelity:
    """The run's accepted tasks against the reference ``spec``, structural shares included."""
    label, reference = load_reference(spec)
    run = task_rows(data.accepted)
    wl = int(data.setting("dedup", "wl_iterations", 3) or 3)
    reference_structural = None
    if not isinstance(reference, Profile):
        reference_structural = structural_share(reference, wl)
    return compare(
        run,
        reference,
        label,
        run_structural=structural_share(run, wl),
        reference_structural=reference_structural,
    )
