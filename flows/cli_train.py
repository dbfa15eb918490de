"""``opsynth train``: SFT on RFT trajectories, single-turn GRPO against the evaluator, and a
tiny offline model to smoke-test both.

Settings come from a training config (``--config``, TOML or YAML, see ``configs/trainer/``);
options given on the command line win. Under ``accelerate launch`` each process runs the same
command. Errors are one line and exit code 2, like the rest of the CLI.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

# what the `train` extra installs; a missing one is a one-line error, not a traceback
TRAIN_EXTRA = ("trl", "accelerate")

train_app = typer.Typer(
    no_args_is_help=True, help="Train a model on opsynth's tasks and trajectories (TRL)."
)

ModelOption = Annotated[
    str | None, typer.Option("--model", help="Hub id or local path (else the config's model)")
]
OutOption = Annotated[Path, typer.Option("--out", help="output directory (weights, metrics)")]
ConfigOption = Annotated[
    Path | None, typer.Option("--config", help="training config (.toml or .yaml)")
]
StepsOption = Annotated[int | None, typer.Option("--max-steps", help="optimizer steps")]
DeviceOption = Annotated[
    str | None, typer.Option("--device", help="auto | cpu | cuda (else the config's, else auto)")
]


def _settings(config: Path | None, section: str, model: str | None, **given: Any) -> dict:
    from opsynth.flows.cli_common import UserError
    from opsynth.trainer.train import load_train_config

    cfg = load_train_config(config)
    settings = {**cfg.get(section, {}), **{k: v for k, v in given.items() if v is not None}}
    settings["model"] = model or cfg.get("model")
    if not settings["model"]:
        raise UserError("give --model (a Hub id or a local path) or set model in --config")
    if section == "grpo":
        settings["eval_cfg"], settings["filters"] = cfg.get("eval"), cfg.get("filters")
    return settings


def _run(fn, **kwargs: Any) -> None:
    from opsynth.config import ConfigError
    from opsynth.filters.pool import PoolError
    from opsynth.flows.cli_common import UserError, fail
    from opsynth.trainer.train import TrainError

    try:
        metrics = fn(**kwargs)
    except (ConfigError, TrainError, UserError, PoolError, OSError, ValueError) as exc:
        fail(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        return
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in TRAIN_EXTRA:
            raise
        missing = exc.name
        fail(f"opsynth train needs the train extra ({missing} is missing): pip install '.[train]'")
        return
    typer.echo(json.dumps({k: v for k, v in metrics.items() if k != "losses"}, default=str))


@train_app.command()
def sft(
    data: Annotated[Path, typer.Option("--data", help="RFT chat JSONL (messages + tools)")],
    out: OutOption = Path("runs/sft"),
    model: ModelOption = None,
    config: ConfigOption = None,
    max_steps: StepsOption = None,
    device: DeviceOption = None,
) -> None:
    """Supervised fine-tuning on RFT trajectories (loss on the assistant's turns)."""
    from opsynth.flows.cli_common import resolve_device
    from opsynth.trainer.train import run_sft

    def go() -> dict:
        resolved = resolve_device(device) if device else None
        settings = _settings(config, "sft", model, max_steps=max_steps, device=resolved)
        return run_sft(data, settings.pop("model"), out, **settings)

    _run(go)


@train_app.command()
def grpo(
    dataset: Annotated[
        Path, typer.Option("--dataset", help="tasks: dataset .parquet, KernelBench .jsonl, .py")
    ],
    out: OutOption = Path("runs/grpo"),
    model: ModelOption = None,
    config: ConfigOption = None,
    max_steps: StepsOption = None,
    device: DeviceOption = None,
    level: Annotated[
        list[int] | None, typer.Option("--level", help="KernelBench levels (repeatable)")
    ] = None,
) -> None:
    """Single-turn GRPO: one reply per task, rewarded by the evaluator (-1..3)."""
    from opsynth.flows.cli_common import resolve_device
    from opsynth.trainer.train import run_grpo

    def go() -> dict:
        resolved = resolve_device(device) if device else None
        settings = _settings(
            config, "grpo", model, max_steps=max_steps, device=resolved, levels=level
        )
        return run_grpo(dataset, settings.pop("model"), out, **settings)

    _run(go)


@train_app.command()
def tiny(out: OutOption = Path("runs/tiny-model")) -> None:
    """Write a tiny random chat model (no download) to smoke-test sft and grpo."""
    from opsynth.trainer.tiny import build_tiny_model

    _run(lambda: {"model": str(build_tiny_model(out))})


if __name__ == "__main__":  # `accelerate launch -m opsynth.flows.cli_train sft ...`
    train_app()
