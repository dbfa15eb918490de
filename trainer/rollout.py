"""Rollouts: ``episodes_per_task`` episodes per task, ``concurrency`` at a time, scored on one
warm worker pool, resumable, and publishable as a Hub dataset.

Layout of ``out``::

    episodes/<task key>/<k>/workdir/          the agent's directory as it left it
    episodes/<task key>/<k>/trajectory.json   the episode, rewritten after every turn
    trajectories.parquet                      one row per scored episode
    summary.json                              counts, reward histogram, end reasons, means
    publish/                                  the folder last pushed to the Hub

A re-run skips every episode already scored and restarts the others from scratch (a partial
conversation cannot be continued faithfully: the server's sampling state is gone). Episodes
that ended on an API error are retried too, since an unreachable server says nothing about
the model.
"""

from __future__ import annotations

import io
import json
import shutil
import statistics
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from opsynth.config import PublishConfig, TrainerConfig
from opsynth.evaluator.score import ScoringPool
from opsynth.evaluator.solution import Solution
from opsynth.evaluator.tasks import group_of, task_key
from opsynth.record import Task
from opsynth.store import write_bytes_atomic
from opsynth.trainer.trajectory import Episode, load_episode

EPISODES = "episodes"
TRAJECTORIES = "trajectories.parquet"
SUMMARY = "summary.json"
EXPORT_DIR = "publish"
DATA_PATH = "data/train-00000-of-00001.parquet"
RETRIED = ("api_error",)

ROW_SCHEMA = pa.schema(
    [
        ("episode_id", pa.string()),
        ("task_id", pa.string()),
        ("task_key", pa.string()),
        ("index", pa.int64()),
        ("model", pa.string()),
        ("messages", pa.string()),
        ("tools", pa.string()),
        ("steps", pa.string()),
        ("end_reason", pa.string()),
        ("end_detail", pa.string()),
        ("done", pa.bool_()),
        ("reward", pa.int64()),
        ("score_reason", pa.string()),
        ("score_detail", pa.string()),
        ("eager_ms", pa.float64()),
        ("compile_ms", pa.float64()),
        ("solution_ms", pa.float64()),
        ("speedup_eager", pa.float64()),
        ("speedup_compile", pa.float64()),
        ("flags", pa.string()),
        ("protected_changes", pa.string()),
        ("solution", pa.string()),
        ("turns", pa.int64()),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("tool_calls", pa.int64()),
        ("tool_errors", pa.int64()),
        ("wall_s", pa.float64()),
        ("started_at", pa.string()),
        ("finished_at", pa.string()),
        ("format", pa.int64()),
    ]
)


class PoolScorer(ScoringPool):
    """The evaluator on one warm pool shared by every episode thread (``ScoringPool``); the
    pool starts on the first solution, so a rollout that produces none never pays for it."""

    def __call__(self, task: Task, solution: Solution):
        scores, _ = self.score([(task, solution)], group_of)
        return scores[0]
        self._thread.shutdown()


@dataclass
class Rollout:
    out: Path
    episodes: list[Episode]  # every scored episode, this run's and earlier ones
    ran: int = 0
    skipped: int = 0
    failed: list[str] = field(default_factory=list)  # "<episode dir>: <error>"
    summary: dict[str, Any] = field(default_factory=dict)


def episode_dir(out: Path, task: Task, k: int) -> Path:
    return Path(out) / EPISODES / task_key(task) / str(k)


def run_rollout(
    tasks: Sequence[Task],
    client,
    model: str,
    out: Path,
    cfg: TrainerConfig,
    score: Callable[[Task, Solution], Any],
    progress: Callable[[Episode], None] | None = None,
) -> Rollout:
    """Run what is missing under ``out`` and write the parquet and summary of all of it."""
    from opsynth.trainer.agent import run_episode

    out = Path(out)
    unique = list({task_key(t): t for t in tasks}.values())
    result = Rollout(out, [])
    todo = []
    for task in unique:
        for k in range(cfg.episodes_per_task):
            folder = episode_dir(out, task, k)
            saved = load_episode(folder)
            if saved is not None and saved.done and saved.end_reason not in RETRIED:
                result.episodes.append(saved)
                result.skipped += 1
            else:
                todo.append((task, k, folder))
    lock = threading.Lock()

    def one(task: Task, k: int, folder: Path) -> None:
        if folder.exists():
            shutil.rmtree(folder)
        try:
            episode = run_episode(client, model, task, folder, cfg, score, index=k)
        except Exception as exc:  # noqa: BLE001 - one broken episode must not stop the rest
            with lock:
                result.failed.append(f"{folder}: {type(exc).__name__}: {exc}")
            return
        with lock:
            result.ran += 1
            if episode.done:
                result.episodes.append(episode)
            else:
                result.failed.append(f"{folder}: {episode.score_reason}: {episode.score_detail}")
        if progress is not None:
            progress(episode)

    with ThreadPoolExecutor(max_workers=cfg.concurrency, thread_name_prefix="episode") as pool:
        for future in [pool.submit(one, *job) for job in todo]:
            future.result()
    result.episodes.sort(key=lambda e: (e.task_key, e.index))
    result.summary = summarise(result.episodes, len(unique), cfg.episodes_per_task)
    result.summary["failed"] = len(result.failed)
    write_outputs(out, result.episodes, result.summary)
    return result


def summarise(episodes: Sequence[Episode], tasks: int, per_task: int) -> dict[str, Any]:
    rewards = [e.reward for e in episodes if e.reward is not None]

    def mean(values: list[float]) -> float | None:
        return round(statistics.fmean(values), 4) if values else None

    best: dict[str, int] = {}
    for e in episodes:
        if e.reward is not None:
            best[e.task_id] = max(best.get(e.task_id, -1), e.reward)
    return {
        "tasks": tasks,
        "episodes_per_task": per_task,
        "episodes": len(episodes),
        "models": sorted({e.model for e in episodes}),
        "reward_histogram": {str(r): n for r, n in sorted(Counter(rewards).items())},
        "end_reasons": dict(Counter(e.end_reason for e in episodes).most_common()),
        "score_reasons": dict(Counter(e.score_reason for e in episodes).most_common()),
        "mean_reward": mean(rewards),
        "pass_rate": mean([r >= 1 for r in rewards]),
        "tasks_solved": sum(r >= 1 for r in best.values()),
        "mean_turns": mean([e.turns for e in episodes]),
        "mean_tokens": mean([e.tokens for e in episodes]),
        "mean_wall_s": mean([e.wall_s for e in episodes]),
        "protected_changed": sum(bool(e.protected_changes) for e in episodes),
    }


def episodes_table(episodes: Sequence[Episode]) -> pa.Table:
    return pa.Table.from_pylist([e.to_row() for e in episodes], schema=ROW_SCHEMA)


def write_outputs(out: Path, episodes: Sequence[Episode], summary: dict[str, Any]) -> None:
    write_bytes_atomic(Path(out) / TRAJECTORIES, parquet_bytes(episodes_table(episodes)))
    write_bytes_atomic(Path(out) / SUMMARY, json.dumps(summary, indent=2).encode())


def parquet_bytes(table: pa.Table) -> bytes:
    """Fixed settings and no clock, so the same episodes give the same bytes and publishing
    them again is a no-op."""
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def read_episodes(path: Path) -> list[Episode]:
    """Episodes from a rollout directory (its parquet, else its trajectory files) or a
    trajectories parquet, e.g. one downloaded from the Hub."""
    path = Path(path)
    parquet = path / TRAJECTORIES if path.is_dir() else path
    if parquet.is_file():
        return [Episode.from_row(row) for row in pq.read_table(parquet).to_pylist()]
    found = (load_episode(p.parent) for p in sorted(path.glob(f"{EPISODES}/*/*/trajectory.json")))
    return [e for e in found if e is not None and e.done]


def publish_rollout(out: Path, repo_id: str, version: str, settings: PublishConfig | None = None):
    """Push the rollout's parquet and a dataset card as ``version`` of ``repo_id`` through the
    pipeline's own Hub code (same tags, same immutability, same one-line errors)."""
    import yaml

    from opsynth.publish.hub import check_repo_id, push

    settings = settings or PublishConfig()
    check_repo_id(repo_id)
    out = Path(out)
    summary = json.loads((out / SUMMARY).read_text())
    folder = out / EXPORT_DIR
    if folder.exists():
        shutil.rmtree(folder)
    write_bytes_atomic(folder / DATA_PATH, (out / TRAJECTORIES).read_bytes())
    meta = {
        "license": settings.license,
        "pretty_name": settings.pretty_name or repo_id.split("/")[1],
        "task_categories": ["text-generation"],
        "tags": ["cuda", "kernels", "agent-trajectories", "tool-use"],
        "configs": [
            {"config_name": "default", "data_files": [{"split": "train", "path": DATA_PATH}]}
        ],
    }
    card = "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n\n" + _card_body(summary)
    write_bytes_atomic(folder / "README.md", card.encode())
    message = f"rollouts {version}: {summary['episodes']} episodes of {summary['tasks']} tasks"
    return push(folder, repo_id, version, settings.private, message)


def _card_body(summary: dict[str, Any]) -> str:
    rows = "\n".join(f"| {r} | {n} |" for r, n in summary["reward_histogram"].items())
    ends = "\n".join(f"| {r} | {n} |" for r, n in summary["end_reasons"].items())
    return (
        "# Kernel-writing agent trajectories\n\n"
        "Episodes of an agent writing CUDA kernels for KernelBench-format tasks, one row per "
        "episode: the full conversation with tool calls (`messages`, JSON), the tools offered "
        "(`tools`), per-turn timings and usage (`steps`), why it ended, the solution files and "
        "the evaluator's reward (-1 incorrect, 1 correct, 2 faster than eager, 3 faster than "
        "eager and torch.compile).\n\n"
        f"Models: {', '.join(summary['models']) or '-'}; {summary['tasks']} tasks, "
        f"{summary['episodes']} episodes, mean reward {summary['mean_reward']}, "
        f"mean turns {summary['mean_turns']}, mean tokens {summary['mean_tokens']}.\n\n"
        f"| reward | episodes |\n| --- | --- |\n{rows}\n\n"
        f"| end reason | episodes |\n| --- | --- |\n{ends}\n"
    )
