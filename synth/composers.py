"""One entry point for the compose stage, whichever composer the config picks.

Both composers return every candidate with one ``compose`` verdict, so the funnel counts the
LLM's rejected replies like any other stage's rejections. ``complete`` is false when some
request got no answer at all (server down, key refused, retries spent): such a result is
used for this run but not stored as the stage's final output, so a re-run asks again (the
reply cache keeps what did arrive).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opsynth.config import ComposeConfig
from opsynth.record import Task, Verdict
from opsynth.synth.llm.reasons import TRANSPORT

STAGE = "compose"


@dataclass
class ComposeResult:
    tasks: list[Task]
    verdicts: list[Verdict]

    @property
    def complete(self) -> bool:
        return not any(v.reason in TRANSPORT for v in self.verdicts)

    def kept(self) -> list[Task]:
        passed = {v.task_id for v in self.verdicts if v.passed}
        return [t for t in self.tasks if t.id in passed]


def run_composer(
    seeds: Sequence[Task],
    cfg: ComposeConfig,
    n: int,
    *,
    round_index: int = 0,
    config_hash: str = "",
    produced: Iterable[Sequence[str]] = (),
    cache_dir: Path | None = None,
) -> ComposeResult:
    """n candidates from ``cfg.composer``; a task made twice in one call is kept once."""
    if cfg.composer == "llm":
        from opsynth.synth.llm.compose import compose_llm

        if cache_dir is None:
            raise ValueError("the llm composer needs a reply cache directory")
        pairs = compose_llm(
            seeds,
            cfg,
            n,
            cache_dir=cache_dir,
            round_index=round_index,
            config_hash=config_hash,
            produced=produced,
        )
    else:
        from opsynth.synth.compose import COMPOSER, compose

        tasks = compose(list(seeds), cfg, n, round_index, config_hash, produced)
        pairs = [(t, Verdict(t.id, STAGE, True, measures={"composer": COMPOSER})) for t in tasks]
    unique: dict[str, tuple[Task, Verdict]] = {}
    for task, verdict in pairs:
        unique.setdefault(task.id, (task, verdict))
    return ComposeResult([t for t, _ in unique.values()], [v for _, v in unique.values()])


def summary(verdicts: Iterable[Verdict]) -> dict[str, Any]:
    """Compose-stage stats for ``run.json``, from its verdict rows alone: candidates, passed,
    reasons, and for LLM replies the token counts and how many came from the reply cache."""
    rows = [v for v in verdicts if v.stage == STAGE]
    replies = [v.measures for v in rows if "prompt_tokens" in v.measures]
    return {
        "candidates": len(rows),
        "passed": sum(v.passed for v in rows),
        "reasons": dict(Counter(v.reason for v in rows if not v.passed)),
        "replies": len(replies),
        "cache_hits": sum(bool(m.get("cached")) for m in replies),
        "retries": sum(int(v.measures.get("retries", 0)) for v in rows),
        "prompt_tokens": sum(int(m["prompt_tokens"]) for m in replies),
        "completion_tokens": sum(int(m["completion_tokens"]) for m in replies),
    }
