"""Publishing a finished run as a versioned Hugging Face Hub dataset with a generated card.

``publish_run`` is the whole job, used by ``opsynth publish`` and by the ``publish`` stage of
``opsynth run``: check the run, write the export folder (``layout``, ``card``, ``export``),
then push it (``hub``) unless it is a dry run. Plain functions; no Prefect.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from opsynth.config import PublishConfig
from opsynth.publish.errors import PublishError
from opsynth.publish.export import Export, export_run
from opsynth.publish.hub import Pushed, check_repo_id, push
from opsynth.publish.recheck import load_recheck
from opsynth.rundata import load_run
from opsynth.store import COMPLETE, RunDirError

EXPORT_DIR = "publish"  # <run>/publish/: the folder last pushed (or being retried)


@dataclass(frozen=True)
class Published:
    export: Export
    pushed: Pushed | None  # None for a dry run


def recorded_settings(manifest: dict) -> PublishConfig:
    """The ``[publish]`` section the run was made with (defaults for runs made without one)."""
    try:
        return PublishConfig.model_validate(manifest.get("config", {}).get("publish", {}))
    except ValidationError:
        return PublishConfig()


def publish_run(
    run: Path,
    repo_id: str | None = None,
    version: str | None = None,
    private: bool | None = None,
    dry_run: Path | None = None,
    recheck: Path | None = None,
) -> Published:
    """Export ``run`` and push it as ``version`` of ``repo_id`` (``dry_run``: only write the
    export there); what is not given comes from the run's ``[publish]`` config. ``recheck``:
    an audit of the run's accepted rows, which the card states (``publish.recheck``). Raises
    ``PublishError`` (one line) for anything the user must fix."""
    try:
        data = load_run(run)
    except RunDirError as exc:
        raise PublishError(str(exc)) from exc
    overrides = {"repo_id": repo_id, "version": version, "private": private}
    values = {k: v for k, v in overrides.items() if v is not None}
    try:
        settings = recorded_settings(data.manifest).model_copy(update=values)
        settings = PublishConfig.model_validate(settings.model_dump())
    except ValidationError as exc:
        field = exc.errors()[0]["loc"][0]
        raise PublishError(
            f"--{str(field).replace('_', '-')} {values.get(field)!r} is "
            "malformed; use ORG/NAME for --repo-id and X.Y.Z for --version"
        ) from exc
    if not settings.repo_id:
        raise PublishError("no repo to publish to; pass --repo-id ORG/NAME")
    check_repo_id(settings.repo_id)
    status = data.manifest.get("status")
    if status != COMPLETE:
        raise PublishError(
            f"{run} is {status}: it did not reach its target; raise max_rounds or "
            "compose.oversample and re-run it before publishing"
        )
    checked = load_recheck(recheck, data) if recheck is not None else None
    folder = Path(dry_run) if dry_run is not None else Path(run) / EXPORT_DIR
    export = export_run(data, folder, settings.repo_id, settings.version, settings, checked)
    if dry_run is not None:
        return Published(export, None)
    hash_ = data.manifest.get("config_hash", "")
    message = f"opsynth {settings.version}: {data.accepted.height} tasks (config {hash_})"
    pushed = push(folder, settings.repo_id, settings.version, settings.private, message)
    return Published(export, pushed)


__all__ = ["PublishError", "Published", "publish_run"]
