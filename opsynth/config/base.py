"""What every configuration section shares: the one-line error, and the marks that decide
which settings a work file's key and a run's config hash leave out."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A config problem, reported to the user as one line."""


# Marks a setting that changes how fast or where work runs, never what it decides: work files'
# keys (``_Section.work_dump``) hash it at its default, so tuning it reuses the work done.
SPEED_ONLY: dict[str, object] = {"speed_only": True}
# Marks a SPEED_ONLY setting added after runs were made: left out of work keys and config
# hashes whatever its value (it decides nothing), so adding it changes no recorded hash.
SPEED_ONLY_ADDED: dict[str, object] = {"speed_only": True, "added_later": True}
# Marks a setting added after runs were made, whose default keeps what they did: left out of
# work keys and config hashes while at its default, so adding it invalidates no work on disk
# and no recorded hash (a release made over several invocations resumes); set otherwise, it is
# hashed like any setting that decides.
ADDED_AT_DEFAULT: dict[str, object] = {"added_at_default": True}


def added_with(earlier: object) -> dict[str, object]:
    """Marks a setting added after runs were made whose default changes what runs do:
    left out of work keys and config hashes while at ``earlier``, what runs did before it
    existed, so a run made then resumes with the setting pinned to ``earlier`` in its config
    (its keys and hash unchanged), and a new run hashes the new default like any setting."""
    return {"added_with": earlier}


def _left_out_of_keys(extra: dict[str, object], value: object, default: object) -> bool:
    if extra == ADDED_AT_DEFAULT:
        return value == default
    return "added_with" in extra and value == extra["added_with"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def work_dump(self) -> dict[str, object]:
        """The section as JSON with every ``SPEED_ONLY`` setting at its default (a
        ``SPEED_ONLY_ADDED`` one left out) and every
        ``ADDED_AT_DEFAULT`` one left out while at its default (an ``added_with`` one while at
        its earlier value): what a work file's key hashes,
        so a resumed run with more workers, another shard size or process reuse finds the work
        an earlier invocation wrote, and so does one made before a setting was added (at the
        defaults, ``model_dump`` less the added settings)."""
        data = self.model_dump(mode="json")
        defaults = type(self)().model_dump(mode="json")
        for name, field in type(self).model_fields.items():
            extra = field.json_schema_extra or {}
            if extra == SPEED_ONLY_ADDED:
                del data[name]
            elif extra == SPEED_ONLY:
                data[name] = defaults[name]
            elif _left_out_of_keys(extra, data[name], defaults[name]):
                del data[name]
        return data
