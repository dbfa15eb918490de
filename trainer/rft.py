"""Rejection-sampling fine-tuning data: the best rewarded trajectories as chat-format SFT rows.

Each row is TRL's conversational language-modelling format with tools,
``{"messages": [...], "tools": [...]}``: system, user, assistant turns with ``tool_calls``
(arguments as JSON objects, which is what chat templates render) and ``tool`` turns answering
them, plus the tool schemas the episode was offered, for the template's tool preamble.

Per task, trajectories with at least ``min_reward`` are ranked by reward, then by fewer
tokens (the cheaper way to the same result is the one worth imitating), and the best
``per_task`` are kept. A trajectory with a malformed tool call (arguments that are not a JSON
object) is never kept, whatever its reward: it would teach the model to write them.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opsynth.store import write_bytes_atomic
from opsynth.trainer.trajectory import Episode

STATS_SUFFIX = ".stats.json"


def well_formed(episode: Episode) -> bool:
    for message in episode.messages:
        for call in message.get("tool_calls") or []:
            try:
                if not isinstance(json.loads(call["function"]["arguments"] or "{}"), dict):
                    return False
            except (ValueError, TypeError, KeyError):
                return False
    return True


def select(episodes: Sequence[Episode], min_reward: int, per_task: int) -> list[Episode]:
    """The kept trajectories, ordered by task key, then rank."""
    by_task: dict[str, list[Episode]] = defaultdict(list)
    for e in episodes:
        if e.done and e.reward is not None and e.reward >= min_reward and well_formed(e):
            by_task[e.task_key].append(e)
    kept = []
    for key in sorted(by_task):
        ranked = sorted(by_task[key], key=lambda e: (-e.reward, e.tokens, e.index))
        kept.extend(ranked[:per_task])
    return kept


def sft_row(episode: Episode) -> dict[str, Any]:
    messages = []
    for message in episode.messages:
        row: dict[str, Any] = {"role": message["role"], "content": message.get("content") or ""}
        if message.get("tool_calls"):
            row["tool_calls"] = [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {
                        "name": call["function"]["name"],
                        "arguments": json.loads(call["function"]["arguments"] or "{}"),
                    },
                }
                for call in message["tool_calls"]
            ]
        if message["role"] == "tool":
            row["tool_call_id"] = message.get("tool_call_id", "")
            row["name"] = message.get("name", "")
        messages.append(row)
    return {"messages": messages, "tools": episode.tools}


def export_sft(episodes: Sequence[Episode], out: Path, min_reward: int, per_task: int) -> dict:
    """Write ``out`` (JSONL) and ``<out>.stats.json``; return the stats."""
    out = Path(out)
    kept = select(episodes, min_reward, per_task)
    lines = [json.dumps(sft_row(e), ensure_ascii=False) for e in kept]
    write_bytes_atomic(out, ("\n".join(lines) + "\n" if lines else "").encode())
    rewarded = [e for e in episodes if e.reward is not None and e.reward >= min_reward]
    stats = {
        "episodes": len(episodes),
        "tasks": len({e.task_key for e in episodes}),
        "eligible": len(rewarded),
        "malformed_skipped": sum(not well_formed(e) for e in rewarded),
        "selected": len(kept),
        "tasks_selected": len({e.task_key for e in kept}),
        "min_reward": min_reward,
        "per_task": per_task,
        "reward_histogram": {str(r): n for r, n in sorted(Counter(e.reward for e in kept).items())},
        "mean_turns": round(sum(e.turns for e in kept) / len(kept), 2) if kept else None,
        "mean_tokens": round(sum(e.tokens for e in kept) / len(kept), 1) if kept else None,
        "episode_ids": [e.episode_id for e in kept],
    }
    write_bytes_atomic(stats_path(out), json.dumps(stats, indent=2).encode())
    return stats


def stats_path(out: Path) -> Path:
    return Path(out).with_name(Path(out).name + STATS_SUFFIX)
