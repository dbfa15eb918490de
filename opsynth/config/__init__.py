"""All configuration in one typed place. ``configs/default.toml`` mirrors these defaults.

Every number a stage uses lives here with the reason for its default, so a run is fully
described by its config (and its hash, which keys the content-addressed stage outputs).
The sections live by concern in this package's modules (``base``, ``synthesis``,
``filtering``, ``stages``); every name is imported from here.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from opsynth.config.base import (
    ADDED_AT_DEFAULT,
    SPEED_ONLY,
    SPEED_ONLY_ADDED,
    ConfigError,
    _Section,
    added_with,
)
from opsynth.config.filtering import NEIGHBOUR_REASONS, FiltersConfig, SizingConfig
from opsynth.config.stages import (
    DecontamConfig,
    DedupConfig,
    EvalConfig,
    PublishConfig,
    RunnerConfig,
    TrainerConfig,
)
from opsynth.config.synthesis import (
    OPS6K_MIX,
    TRANSFORMERS_FAMILIES,
    ComposeConfig,
    LlmConfig,
    SeedsConfig,
)

__all__ = [
    "ADDED_AT_DEFAULT",
    "NEIGHBOUR_REASONS",
    "OPS6K_MIX",
    "SPEED_ONLY",
    "SPEED_ONLY_ADDED",
    "TRANSFORMERS_FAMILIES",
    "ComposeConfig",
    "ConfigError",
    "DecontamConfig",
    "DedupConfig",
    "EvalConfig",
    "FiltersConfig",
    "LlmConfig",
    "PublishConfig",
    "RunConfig",
    "RunnerConfig",
    "SeedsConfig",
    "SizingConfig",
    "TrainerConfig",
    "added_with",
    "load_config",
    "render_default_toml",
    "render_toml",
]


class RunConfig(_Section):
    target: int = Field(default=24, ge=1, description="accepted tasks wanted")
    max_rounds: int = Field(default=4, ge=1, description="compose-filter rounds to reach target")
    chunk_size: int = Field(
        default=512,
        ge=1,
        description="candidates of a round sized and filtered together before the next ones are "
        "sized: what a stopped run (or audit) resumes from, and how far past its target a round "
        "may go",
    )
    seeds: SeedsConfig = SeedsConfig()
    compose: ComposeConfig = ComposeConfig()
    sizing: SizingConfig = SizingConfig()
    filters: FiltersConfig = FiltersConfig()
    eval: EvalConfig = EvalConfig()
    decontam: DecontamConfig = DecontamConfig()
    dedup: DedupConfig = DedupConfig()
    publish: PublishConfig = PublishConfig()
    runner: RunnerConfig = RunnerConfig()
    trainer: TrainerConfig = TrainerConfig()

    def config_hash(self) -> str:
        """Hash of what decides the data; ``publish`` only says where it goes, ``runner``
        where it is computed and ``trainer`` what is done with it afterwards, so they are left
        out and none changes a run's hash, and neither does a speed-only setting."""
        data = self.model_dump(mode="json", exclude={"publish", "runner", "trainer"})
        for name in data:  # speed-only settings at their defaults (``work_dump``)
            section = getattr(self, name)
            if isinstance(section, _Section):
                data[name] = section.work_dump()
        blob = json.dumps(data, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def with_overrides(self, **top_level: object) -> RunConfig:
        data = self.model_dump(mode="json")
        data.update({k: v for k, v in top_level.items() if v is not None})
        return RunConfig.model_validate(data)

    def with_section(self, section: str, **values: object) -> RunConfig:
        data = self.model_dump(mode="json")
        data[section].update({k: v for k, v in values.items() if v is not None})
        return RunConfig.model_validate(data)


def load_config(path: Path | None) -> RunConfig:
    """Load a TOML config; every problem becomes one ConfigError line naming the fix."""
    if path is None:
        return RunConfig()
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; pass an existing TOML file")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML ({exc}); fix the syntax") from exc
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ConfigError(
            f"config file {path}: {where}: {first['msg']}; see configs/default.toml"
        ) from exc


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict) and not value:
        return "{}"
    if isinstance(value, dict):
        return "{ " + ", ".join(f'"{k}" = {_toml_value(v)}' for k, v in value.items()) + " }"
    raise TypeError(f"cannot render {value!r} as TOML")


def render_default_toml() -> str:
    """The documented default config, generated from the models so the two cannot drift."""
    header = [
        "# opsynth default configuration (generated by `python -m opsynth.config`).",
        "# Every key is optional; omitted keys take these values.",
    ]
    return render_toml(RunConfig(), header)


def render_toml(default: RunConfig, header: list[str]) -> str:
    """``default`` as a documented TOML file (also how a published run's config is shipped)."""
    lines = [*header, ""]

    def emit(model: BaseModel) -> None:
        for name, info in type(model).model_fields.items():
            value = getattr(model, name)
            if isinstance(value, BaseModel):
                continue
            speed = " (speed only: work files are reused across its values)"
            note = speed if info.json_schema_extra in (SPEED_ONLY, SPEED_ONLY_ADDED) else ""
            if info.description or note:
                lines.append(f"# {info.description or ''}{note}")
            lines.append(f"{name} = {_toml_value(value)}")

    def sections(model: BaseModel, prefix: str) -> None:
        for name in type(model).model_fields:
            section = getattr(model, name)
            if isinstance(section, BaseModel):
                lines.extend(["", f"[{prefix}{name}]"])
                emit(section)
                sections(section, f"{prefix}{name}.")

    emit(default)
    sections(default, "")
    return "\n".join(lines) + "\n"
