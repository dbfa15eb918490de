"""The one record type that flows through every stage: a task row and its verdict rows.

A task row is Ops-6K compatible (``ops``, ``data_source``, ``code``) plus provenance. Every
stage that judges a task appends a ``Verdict``; rejected tasks keep all their verdicts so an
audit can explain every rejection. Rows are plain dataclasses so every package can be tested
without Prefect, polars or a GPU; ``opsynth.store`` converts them to and from parquet.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

SCHEMA_VERSION = 1


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def content_id(code: str, ops: list[str], data_source: str) -> str:
    """Content hash of what a task *is*; provenance and timestamps are excluded on purpose,
    so the same task produced twice gets the same id and is computed once."""
    payload = json.dumps({"ops": ops, "data_source": data_source, "code": code}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


@dataclass
class Task:
    """A KernelBench-format task (``class Model``, ``get_inputs``, ``get_init_inputs``)."""

    ops: list[str]
    data_source: str
    code: str
    seed_ids: list[str] = field(default_factory=list)
    composer: str = ""
    composer_version: str = ""
    config_hash: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    created_at: str = field(default_factory=utc_now)
    id: str = ""

    def __post_init__(self) -> None:
        expected = content_id(self.code, self.ops, self.data_source)
        if not self.id:
            self.id = expected
        elif self.id != expected:
            raise ValueError(f"task id {self.id} does not match its content hash {expected}")

    def to_row(self) -> dict[str, Any]:
        row = dataclasses.asdict(self)
        row["ops"] = json.dumps(self.ops)
        row["seed_ids"] = json.dumps(self.seed_ids)
        row["meta"] = json.dumps(self.meta, sort_keys=True)
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Task:
        return cls(
            id=row.get("id") or "",
            ops=_json_list(row["ops"]),
            data_source=row["data_source"],
            code=row["code"],
            seed_ids=_json_list(row.get("seed_ids") or "[]"),
            composer=row.get("composer") or "",
            composer_version=row.get("composer_version") or "",
            config_hash=row.get("config_hash") or "",
            meta=json.loads(row.get("meta") or "{}"),
            created_at=row.get("created_at") or utc_now(),
        )


@dataclass
class Verdict:
    """One stage's judgement of one task. ``reason`` is a stable code (see ARCHITECTURE.md);
    ``measures`` holds the numbers the decision was based on, so a rejection can be checked."""

    task_id: str
    stage: str
    passed: bool
    reason: str = "ok"
    detail: str = ""
    measures: dict[str, Any] = field(default_factory=dict)
    device: str = ""
    torch_version: str = ""
    elapsed_s: float = 0.0
    created_at: str = field(default_factory=utc_now)

    def to_row(self) -> dict[str, Any]:
        row = dataclasses.asdict(self)
        row["measures"] = json.dumps(self.measures, sort_keys=True, default=str)
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Verdict:
        row = dict(row)
        row["measures"] = json.loads(row.get("measures") or "{}")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in row.items() if k in names})


def _json_list(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    parsed = json.loads(value)
    if not isinstance(parsed, list):
        raise ValueError(f"expected a JSON list, got {value!r}")
    return [str(v) for v in parsed]
