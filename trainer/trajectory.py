"""The record of one episode: every message, every turn's timings and usage, every tool call,
why it ended, and what the evaluator made of the solution it left.

It is rewritten after every turn, so a killed rollout keeps what happened up to the kill; an
episode counts as done only once it is scored (``done``), which is what resuming checks. The
same record is one row of the rollout's parquet (nested parts as JSON strings, so the columns
stay flat for the Hub viewer) and the source of the RFT export.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opsynth.record import utc_now
from opsynth.store import write_bytes_atomic

TRAJECTORY = "trajectory.json"
FORMAT = 1

# Why an episode ended. Stable strings, like the pipeline's reason codes.
END_REASONS = (
    "finished",  # the model answered without a tool call
    "truncated",  # that answer was cut at completion_tokens
    "max_turns",
    "max_tokens",
    "wall_time",
    "tool_errors",  # max_tool_errors malformed tool calls in a row
    "context_overflow",  # the server refused the conversation as too long
    "api_error",  # any other failed request: unreachable, 5xx, refused, unparseable
)
NO_SOLUTION = "no_solution"  # score reason when the workdir holds no readable solution

# Parts of the record stored as JSON strings in a parquet row.
JSON_COLUMNS = ("messages", "tools", "steps", "flags", "protected_changes", "solution")


@dataclass
class ToolCallLog:
    id: str
    name: str
    arguments: str  # raw, as the model wrote it
    error: str  # "" = ok, else a reason code
    observation_chars: int
    seconds: float


@dataclass
class Step:
    turn: int
    started_s: float  # since the episode started
    request_s: float
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    usage_estimated: bool  # the server sent no usage; counts are chars / 4
    tool_calls: list[ToolCallLog] = field(default_factory=list)
    tools_s: float = 0.0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Step:
        calls = [ToolCallLog(**c) for c in data.get("tool_calls", [])]
        return cls(**{**data, "tool_calls": calls})


@dataclass
class Episode:
    episode_id: str
    task_id: str
    task_key: str
    index: int
    model: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)  # the schemas offered
    steps: list[Step] = field(default_factory=list)
    end_reason: str = ""  # "" while running
    end_detail: str = ""
    done: bool = False  # ended and scored
    reward: int | None = None
    score_reason: str = ""
    score_detail: str = ""
    eager_ms: float | None = None
    compile_ms: float | None = None
    solution_ms: float | None = None
    speedup_eager: float | None = None
    speedup_compile: float | None = None
    flags: list[str] = field(default_factory=list)
    protected_changes: list[str] = field(default_factory=list)
    solution: dict[str, str] | None = None  # model_new.py and kernels/..., as scored
    turns: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    wall_s: float = 0.0
    started_at: str = field(default_factory=utc_now)
    finished_at: str = ""
    format: int = FORMAT

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Episode:
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["steps"] = [Step.from_dict(s) for s in values.get("steps", [])]
        return cls(**values)

    def to_row(self) -> dict[str, Any]:
        row = self.to_dict()
        for name in JSON_COLUMNS:
            row[name] = json.dumps(row[name])
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Episode:
        data = dict(row)
        for name in JSON_COLUMNS:
            if isinstance(data.get(name), str):
                data[name] = json.loads(data[name])
        return cls.from_dict(data)

    def save(self, folder: Path) -> None:
        """Atomic, so a reader (or a resume after a kill) never sees half a file."""
        blob = json.dumps(self.to_dict(), indent=1, default=str).encode()
        write_bytes_atomic(Path(folder) / TRAJECTORY, blob)


def load_episode(folder: Path) -> Episode | None:
    """The episode saved in ``folder``; None when there is none or it cannot be read (a file
    from a crash mid-write cannot exist, but a hand-edited one can)."""
    path = Path(folder) / TRAJECTORY
    try:
        return Episode.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        return None
