"""The Hub dataset's layout: which configs exist, which files hold them, which columns each
has, and reading a published revision back as a ``RunData``.

``default`` is Ops-6K compatible (``ops`` as a JSON-encoded list string, ``data_source``,
``code``; split ``train``), so code written for ``BytedTsinghua-SIA/CUDA-Agent-Ops-6K`` loads it
unchanged. ``full`` adds provenance and the filters' measurements, flattened from the accepted
rows' ``meta.filters`` and run.json; ``rejected`` and ``verdicts`` carry the audit trail, and
``opsynth/run.json`` the run's manifest, so the report can be rebuilt from the Hub alone.
"""

from __future__ import annotations

import json
from typing import Any

import polars as pl

from opsynth.rundata import RunData
from opsynth.store import TASK_SCHEMA

OPS6K_COLUMNS = ["ops", "data_source", "code"]
TASK_COLUMNS = TASK_SCHEMA.names
SPLIT = "train"
MANIFEST_PATH = "opsynth/run.json"
# the release re-check's run.json (``opsynth publish --recheck``), when there is one
RECHECK_MANIFEST_PATH = "opsynth/recheck.json"
# the re-check's config, to repeat it with `opsynth audit --config`
RECHECK_CONFIG_PATH = "opsynth/recheck.toml"
CARD_PATH = "README.md"
CONFIG_PATH = "config.toml"  # the run's config, to regenerate it with `--config`


CONFIGS = ["default", "full", "rejected", "verdicts"]


def folder_of(config: str) -> str:
    """``default`` lives in ``data/``, as on the Hub; the others in a folder of their name."""
    return "data" if config == "default" else config


CONFIG_FOLDERS = [folder_of(c) for c in CONFIGS]


def data_path(config: str) -> str:
    """The config's one parquet shard."""
    return f"{folder_of(config)}/{SPLIT}-00000-of-00001.parquet"


# full config: column -> (stages in meta.filters, first with the measure wins; key; dtype).
# A run with ``filters.timing_in_verify`` times in verify alone; its compile stage does not.
TIMED = ("runtime", "verify")
COMPILE_TIMED = ("compile", "verify")
MEASURE_COLUMNS: dict[str, tuple[tuple[str, ...], str, Any]] = {
    "eager_ms": (TIMED, "eager_ms_median", pl.Float64),
    "eager_ms_min": (TIMED, "eager_ms_min", pl.Float64),
    "eager_ms_scaled": (TIMED, "scaled_ms", pl.Float64),
    "speed_factor": (TIMED, "speed_factor", pl.Float64),
    "compiled_ms": (COMPILE_TIMED, "compiled_ms_median", pl.Float64),
    "compile_speedup": (COMPILE_TIMED, "speedup", pl.Float64),
    "compile_s": (("compile",), "compile_s", pl.Float64),
    "compile_max_abs_diff": (("compile",), "max_abs_diff", pl.Float64),
    "kb_similarity": (("decontam",), "kb_similarity", pl.Float64),
    "kb_nearest_level": (("decontam",), "kb_nearest_level", pl.Int64),
    "kb_nearest_problem_id": (("decontam",), "kb_nearest_problem_id", pl.Int64),
    "kb_nearest_name": (("decontam",), "kb_nearest_name", pl.String),
    "kb_opseq_match": (("decontam",), "kb_opseq_match", pl.String),
    "exact_cluster": (("dedup",), "exact_cluster", pl.String),
    "near_cluster": (("dedup",), "near_cluster", pl.String),
    "structural_cluster": (("dedup",), "structural_cluster", pl.String),
}
VERSION_COLUMNS = {"opsynth_version": "opsynth", "cuda_version": "cuda"}


def default_frame(data: RunData) -> pl.DataFrame:
    return data.accepted.select(OPS6K_COLUMNS)


def full_frame(data: RunData) -> pl.DataFrame:
    """The accepted tasks with every Task column and the measurements as typed columns;
    ``device`` / ``torch_version`` are those the filters ran on, the versions from run.json."""
    filters = [json.loads(m or "{}").get("filters", {}) for m in data.accepted["meta"]]
    measures = {
        name: pl.Series(name, [_measure(f, stages, key) for f in filters], dtype, strict=False)
        for name, (stages, key, dtype) in MEASURE_COLUMNS.items()
    }
    versions = data.manifest.get("versions", {})
    extra = {
        "device": pl.Series("device", [f.get("device", "") for f in filters], pl.String),
        "torch_version": pl.Series("torch_version", [f.get("torch_version", "") for f in filters]),
        **{
            name: pl.Series(name, [str(versions.get(key, ""))] * data.accepted.height, pl.String)
            for name, key in VERSION_COLUMNS.items()
        },
    }
    return data.accepted.select(TASK_COLUMNS).with_columns(*measures.values(), *extra.values())


def _measure(filters: dict[str, Any], stages: tuple[str, ...], key: str) -> Any:
    """``key`` of the first of ``stages`` whose measures hold it, else None."""
    for stage in stages:
        value = filters.get(stage, {}).get(key)
        if value is not None:
            return value
    return None


def rejected_frame(data: RunData) -> pl.DataFrame:
    """Every rejected candidate with the stage, reason and detail that stopped it."""
    stops = data.rejections().select("id", "stage", "reason", "detail")
    return data.rejected.select(TASK_COLUMNS).join(stops, on="id", how="left")


def verdicts_frame(data: RunData) -> pl.DataFrame:
    return data.verdicts


def config_frames(data: RunData, include_rejected: bool) -> dict[str, pl.DataFrame]:
    """Each config's rows, by config name; ``default`` first."""
    frames = {"default": default_frame(data), "full": full_frame(data)}
    if include_rejected:
        frames |= {"rejected": rejected_frame(data), "verdicts": verdicts_frame(data)}
    return frames


def load_revision(repo_id: str, revision: str = "main") -> RunData:
    """A published revision as a ``RunData`` (needs the ``rejected`` and ``verdicts``
    configs, i.e. ``publish.include_rejected``); reads through ``datasets`` and the Hub cache."""
    import datasets
    from huggingface_hub import hf_hub_download

    def load(config: str) -> pl.DataFrame:
        rows = datasets.load_dataset(repo_id, config, split=SPLIT, revision=revision)
        return pl.from_arrow(rows.data.table)

    manifest_file = hf_hub_download(repo_id, MANIFEST_PATH, repo_type="dataset", revision=revision)
    with open(manifest_file) as fh:
        manifest = json.load(fh)
    accepted = load("full").select(TASK_COLUMNS)
    rejected = load("rejected").select(TASK_COLUMNS)
    return RunData(
        manifest=manifest,
        candidates=pl.concat([accepted, rejected]),
        accepted=accepted,
        verdicts=load("verdicts"),
        source=f"{repo_id}@{revision}",
    )
