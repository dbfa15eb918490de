"""Reading task sets to audit: a local parquet file or a Hugging Face Hub dataset id."""

from __future__ import annotations

import random
from pathlib import Path

from opsynth.record import Task


class AuditInputError(ValueError):
    """The audit input could not be read; one line with the fix."""


def load_input(source: str) -> list[Task]:
    """A local task set (``opsynth.tasksets.load_task_file``), or a Hugging Face Hub dataset
    id (needs network)."""
    from opsynth.tasksets import TaskSetError, load_task_file

    path = Path(source)
    if path.exists():
        try:
            return load_task_file(path)
        except TaskSetError as exc:
            raise AuditInputError(f"--input {exc}") from None
    if source.count("/") != 1 or source.endswith(".parquet"):
        raise AuditInputError(f"--input {source}: no such file and not a Hub dataset id ORG/NAME")
    from opsynth.flows.hub_data import HubLoadError, load_hub_dataset

    try:
        rows = load_hub_dataset(source, split="train")
    except HubLoadError as exc:
        raise AuditInputError(
            f"--input {exc}; check the id and the network, or pass a local parquet file"
        ) from exc
    return [Task.from_row(dict(row)) for row in rows]


def sample_tasks(tasks: list[Task], sample: int | None, seed: int) -> list[Task]:
    """A seeded sample, kept in input order so reports read like the source."""
    if sample is None or sample >= len(tasks):
        return tasks
    keep = set(random.Random(seed).sample(range(len(tasks)), sample))
    return [t for i, t in enumerate(tasks) if i in keep]
