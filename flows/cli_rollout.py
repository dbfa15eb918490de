"""``opsynth rollout`` (agent episodes against an OpenAI-compatible server, scored by the
bundled evaluator, optionally pushed to the Hub) and ``opsynth rft`` (the best rewarded
trajectories as chat-format SFT data). Thin: the work is in ``trainer.rollout`` and
``trainer.rft``. The API key is read from ``OPENAI_API_KEY`` only, never from an option, so it
stays out of shell histories; local servers accept any, hence the default ``EMPTY``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

API_KEY_ENV = "OPENAI_API_KEY"
_URL = re.compile(r"^https?://\S+$")
_VERSION = re.compile(r"^\d+\.\d+\.\d+$")


def rollout(
    dataset: Annotated[
        Path,
        typer.Option("--dataset", help="tasks: a dataset .parquet, KernelBench .jsonl or a .py"),
    ],
    model: Annotated[str, typer.Option("--model", help="model name the server knows")],
    base_url: Annotated[
        str | None,
        typer.Option("--base-url", help="OpenAI-compatible endpoint (default $OPENAI_BASE_URL)"),
    ] = None,
    episodes_per_task: Annotated[
        int | None,
        typer.Option(
            "--episodes-per-task", help="rollouts per task (default: trainer.episodes_per_task)"
        ),
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option("--concurrency", help="episodes at once (default: trainer.concurrency)"),
    ] = None,
    out: Annotated[Path, typer.Option("--out", help="rollout directory (resumed if present)")] = (
        Path("runs/rollouts")
    ),
    limit: Annotated[int | None, typer.Option("--limit", help="only the first N tasks")] = None,
    levels: Annotated[
        list[int] | None, typer.Option("--level", help="KernelBench levels (repeatable)")
    ] = None,
    device: Annotated[str, typer.Option("--device", help="scoring: auto | cpu | cuda")] = "auto",
    config: Annotated[Path | None, typer.Option("--config", help="TOML config file")] = None,
    push_to: Annotated[
        str | None, typer.Option("--push-to", help="also publish to this Hub dataset ORG/NAME")
    ] = None,
    version: Annotated[
        str, typer.Option("--version", help="X.Y.Z of the published dataset")
    ] = "1.0.0",
) -> None:
    """Run agent episodes on every task and score them; re-running resumes."""
    from opsynth.config import ConfigError, load_config
    from opsynth.evaluator.solution import SolutionError
    from opsynth.evaluator.tasks import load_tasks
    from opsynth.flows.cli_common import UserError, fail, resolve_device
    from opsynth.publish.errors import PublishError
    from opsynth.trainer.rollout import PoolScorer, publish_rollout, run_rollout

    try:
        cfg = load_config(config)
        trainer = cfg.trainer.model_copy(
            update=_positive(episodes_per_task=episodes_per_task, concurrency=concurrency)
        )
        _positive(limit=limit)
        url = _base_url(base_url)
        if not model.strip():
            raise UserError("--model is empty; give the model name the server serves")
        if push_to is not None:
            _check_push(push_to, version)
        resolved = resolve_device(device if device != "auto" else cfg.filters.device)
        tasks = load_tasks(dataset, levels)[:limit]
        if not tasks:
            raise UserError(f"--dataset {dataset} holds no tasks")
        client = _client(url, trainer.request_timeout_s)
    except (ConfigError, SolutionError, UserError, PublishError, ValueError) as exc:
        fail(str(exc))
        return
    err = Console(stderr=True)

    def progress(episode) -> None:
        err.print(
            f"{episode.episode_id}: reward {episode.reward} ({episode.score_reason}), "
            f"{episode.end_reason} after {episode.turns} turns, {episode.tokens} tokens",
            highlight=False,
        )

    with PoolScorer(cfg.eval, cfg.filters, resolved) as scorer:
        result = run_rollout(tasks, client, model, out, trainer, scorer, progress)
    _print_summary(result.summary, out)
    for line in result.failed[:10]:
        err.print(f"[yellow]episode failed:[/] {line}", highlight=False)
    if push_to is not None:
        try:
            pushed = publish_rollout(out, push_to, version, cfg.publish)
        except PublishError as exc:
            fail(str(exc))
            return
        state = "published" if pushed.changed else "already published with these files:"
        Console().print(f"{state} {pushed.tag}: {pushed.url}", highlight=False)
    api_errors = result.summary["end_reasons"].get("api_error", 0)
    if api_errors:
        err.print(
            f"[yellow]warning:[/] {api_errors} episode(s) ended on an API error; re-running "
            "retries them",
            highlight=False,
        )
    if result.failed:
        err.print(f"[yellow]warning:[/] {len(result.failed)} episode(s) failed; re-run to retry")
        raise typer.Exit(1)


def rft(
    rollouts: Annotated[
        Path, typer.Option("--rollouts", help="a rollout directory or its trajectories.parquet")
    ],
    out: Annotated[Path, typer.Option("--out", help="SFT JSONL to write")],
    min_reward: Annotated[
        int | None,
        typer.Option("--min-reward", help="keep rewards >= this (default: trainer.rft_min_reward)"),
    ] = None,
    per_task: Annotated[
        int | None, typer.Option("--per-task", help="best per task (default: trainer.rft_per_task)")
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", help="TOML config file")] = None,
) -> None:
    """Export the best rewarded trajectories as chat-format SFT data (messages + tools)."""
    from opsynth.config import ConfigError, load_config
    from opsynth.flows.cli_common import UserError, fail
    from opsynth.store import RunDirError
    from opsynth.trainer.rft import export_sft, stats_path
    from opsynth.trainer.rollout import read_episodes

    try:
        cfg = load_config(config).trainer
        threshold = cfg.rft_min_reward if min_reward is None else min_reward
        if threshold not in (-1, 1, 2, 3):
            raise UserError(f"--min-reward must be -1, 1, 2 or 3, got {threshold}")
        keep = _positive(per_task=per_task).get("rft_per_task", cfg.rft_per_task)
        if not rollouts.exists():
            raise UserError(f"--rollouts {rollouts}: no such directory or file")
        episodes = read_episodes(rollouts)
        if not episodes:
            raise UserError(f"--rollouts {rollouts} holds no scored episodes")
        stats = export_sft(episodes, out, threshold, keep)
    except (ConfigError, UserError, RunDirError, OSError, ValueError) as exc:
        fail(str(exc).strip().splitlines()[0])
        return
    Console().print(
        f"kept {stats['selected']} of {stats['episodes']} trajectories "
        f"({stats['tasks_selected']} of {stats['tasks']} tasks, reward >= {threshold}) "
        f"-> {out} (stats: {stats_path(out)})",
        highlight=False,
    )
    if not stats["selected"]:
        Console(stderr=True).print("[yellow]warning:[/] nothing passed; lower --min-reward")
        raise typer.Exit(1)


_FIELDS = {"episodes_per_task": "episodes_per_task", "concurrency": "concurrency"}
_FIELDS.update(per_task="rft_per_task")


def _positive(**given: int | None) -> dict[str, int]:
    """The options given, checked >= 1, keyed by their ``TrainerConfig`` field."""
    from opsynth.flows.cli_common import UserError

    checked = {}
    for name, value in given.items():
        if value is None:
            continue
        if value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
        checked[_FIELDS.get(name, name)] = value
    return checked


def _base_url(given: str | None) -> str:
    from opsynth.flows.cli_common import UserError

    url = (given or os.environ.get("OPENAI_BASE_URL", "")).strip()
    if not url:
        raise UserError("give --base-url, e.g. http://127.0.0.1:8000/v1, or set OPENAI_BASE_URL")
    if not _URL.match(url):
        raise UserError(f"--base-url {url!r} is not an http(s) URL")
    return url


def _check_push(repo_id: str, version: str) -> None:
    from opsynth.flows.cli_common import UserError
    from opsynth.publish.hub import check_repo_id

    check_repo_id(repo_id)
    if not _VERSION.match(version):
        raise UserError(f"--version {version!r} must be X.Y.Z")


def _client(url: str, timeout_s: float):
    """The client, once the server has answered: an unreachable server or a refused key is
    one line now rather than an api_error on every episode."""
    import openai

    from opsynth.flows.cli_common import UserError

    client = openai.OpenAI(
        base_url=url,
        api_key=os.environ.get(API_KEY_ENV) or "EMPTY",
        timeout=timeout_s,
        max_retries=2,
    )
    try:
        client.with_options(max_retries=0, timeout=30.0).models.list()
    except openai.APIConnectionError as exc:
        raise UserError(f"cannot reach {url} ({type(exc).__name__}); is the server up?") from exc
    except openai.AuthenticationError as exc:
        raise UserError(f"{url} refused the API key (401); set {API_KEY_ENV}") from exc
    except openai.APIStatusError:
        pass  # a server without /models can still serve chat completions
    return client


def _print_summary(summary: dict, out: Path) -> None:
    table = Table(title=f"rollout: {summary['episodes']} episodes of {summary['tasks']} tasks")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("mean reward", summary["mean_reward"]),
        ("pass rate", summary["pass_rate"]),
        ("tasks solved", summary["tasks_solved"]),
        ("mean turns", summary["mean_turns"]),
        ("mean tokens", summary["mean_tokens"]),
        ("mean wall s", summary["mean_wall_s"]),
        ("protected files changed", summary["protected_changed"]),
        ("failed", summary.get("failed", 0)),
    ]
    rows += [(f"reward {r}", n) for r, n in summary["reward_histogram"].items()]
    rows += [(f"end: {r}", n) for r, n in summary["end_reasons"].items()]
    for name, value in rows:
        table.add_row(name, "-" if value is None else str(value))
    console = Console()
    console.print(table)
    console.print(f"-> {out / 'trajectories.parquet'}, {out / 'summary.json'}", highlight=False)
