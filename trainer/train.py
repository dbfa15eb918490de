"""TRL training on opsynth's outputs: SFT on RFT trajectories, single-turn GRPO on tasks.

SFT conversations are tokenized here rather than by TRL: RFT rows carry OpenAI-format tool
calls whose ``arguments`` are JSON strings and whose shapes differ per tool, which an Arrow
column would merge into one struct padded with nulls (rendered into the text). Rendering each
row through the chat template first, with ``{% generation %}`` markers for the assistant-only
mask, keeps every conversation exactly as the model will see it at inference.

Both entry points run unchanged under ``accelerate launch`` (one process per GPU); on a host
without CUDA they train on the CPU in fp32, which is what the tests exercise.
"""

from __future__ import annotations

import inspect
import json
import os
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opsynth.config import ConfigError, EvalConfig, FiltersConfig


class TrainError(ValueError):
    """Bad training input (data, model, config); the message is one line."""


# ----------------------------------------------------------------------------- configs


def load_train_config(path: Path | None) -> dict[str, Any]:
    """A training config (TOML or YAML): ``model``, ``[sft]`` and ``[grpo]`` keyword arguments
    of ``run_sft``/``run_grpo`` (``trl`` inside either: extra TRL config fields), ``[eval]``
    and ``[filters]`` as in opsynth's run config (GRPO scoring)."""
    if path is None:
        return {}
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"training config {path} does not exist")
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(path.read_text()) or {}
        else:
            data = tomllib.loads(path.read_text())
    except Exception as exc:
        raise ConfigError(f"training config {path} cannot be parsed: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"training config {path} must be a table of settings")
    allowed = {"model", "sft", "grpo", "eval", "filters"}
    extra = sorted(set(data) - allowed)
    if extra:
        raise ConfigError(f"training config {path}: unknown key(s) {extra}; use {sorted(allowed)}")
    for section, fn in (("sft", run_sft), ("grpo", run_grpo)):
        known = set(inspect.signature(fn).parameters) - {"data", "dataset", "model", "out"}
        unknown = sorted(set(data.get(section, {})) - known)
        if unknown:
            raise ConfigError(f"training config {path}: [{section}] has no setting {unknown}")
    try:
        data["eval"] = EvalConfig.model_validate(data.get("eval", {}))
        data["filters"] = FiltersConfig.model_validate(data.get("filters", {}))
    except Exception as exc:
        raise ConfigError(f"training config {path}: {str(exc).splitlines()[0]}") from exc
    return data


def _precision(device: str) -> dict[str, Any]:
    import torch

    cuda = device != "cpu" and torch.cuda.is_available()
    return {"bf16": cuda, "use_cpu": not cuda}


def _args(
    out: Path, seed: int, device: str, extra: dict[str, Any] | None, **explicit: Any
) -> dict[str, Any]:
    """TRL config fields: ours, then the config's ``trl`` table, which wins on a clash."""
    return {
        "output_dir": str(out),
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "seed": seed,
        "disable_tqdm": True,
        **_precision(device),
        **explicit,
        **(extra or {}),
    }


def _check_model(model: str) -> None:
    """A local-looking path that is missing is a typo, not a Hub id: say so before
    transformers tries the network and fails with a long trace."""
    if Path(model).expanduser().exists():
        return
    if not model or model.startswith((".", "/", "~")) or model.count("/") > 1:
        raise TrainError(f"--model {model}: no such directory and not a Hub id (ORG/NAME)")


def _finish(trainer, out: Path, extra: dict[str, Any]) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    trainer.save_model(str(out))  # every rank must call it (sharded states gather here)
    state = trainer.state
    losses = [row["loss"] for row in state.log_history if "loss" in row]
    metrics = {
        "global_step": state.global_step,
        "loss": losses[-1] if losses else None,
        "losses": losses,
        **extra,
    }
    if trainer.accelerator.is_main_process:
        state.save_to_json(str(out / "trainer_state.json"))
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str))
    return metrics


# ----------------------------------------------------------------------------- SFT


def load_chats(path: Path) -> list[dict[str, Any]]:
    """RFT JSONL rows ({"messages": [...], "tools": [...]}) normalised for chat templates:
    tool-call arguments as objects, text-part lists joined, missing content as ""."""
    path = Path(path)
    if not path.is_file():
        raise TrainError(f"--data {path}: no such file")
    rows = []
    with open(path) as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                messages = [_message(m) for m in row["messages"]]
                tools = row.get("tools") or None
                tools = json.loads(tools) if isinstance(tools, str) else tools
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
                raise TrainError(f"{path}:{line_no} is not a chat row ({exc!r})") from exc
            if any(m["role"] == "assistant" for m in messages):
                rows.append({"messages": messages, "tools": tools})
    if not rows:
        raise TrainError(f"--data {path}: no conversation with an assistant message")
    return rows


def _message(raw: dict[str, Any]) -> dict[str, Any]:
    content = raw.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    message = {"role": str(raw["role"]), "content": content or ""}
    if raw.get("tool_calls"):
        message["tool_calls"] = [_tool_call(c) for c in raw["tool_calls"]]
    for key in ("name", "tool_call_id"):
        if raw.get(key):
            message[key] = raw[key]
    return message


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    fn = dict(call.get("function") or call)
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            parsed = json.loads(args) if args.strip() else {}
            fn["arguments"] = parsed if isinstance(parsed, dict) else args
        except json.JSONDecodeError:
            pass  # a malformed call is part of the trajectory; render it as written
    out = {"type": "function", "function": {"name": fn["name"], "arguments": fn["arguments"]}}
    if call.get("id"):
        out["id"] = call["id"]
    return out


def training_template(tokenizer) -> str | None:
    """The chat template with ``{% generation %}`` markers (the tokenizer's own, or TRL's
    training variant of a known family); None when the template already has them."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    if tokenizer.chat_template is None:
        raise TrainError("the model's tokenizer has no chat template; SFT needs one")
    if has_generation_markers(tokenizer.chat_template):
        return None
    try:
        return get_training_chat_template(tokenizer)
    except ValueError as exc:
        raise TrainError(
            "no assistant-only training template is known for this model's chat template; "
            "set assistant_only = false in [sft] or give a tokenizer whose template marks "
            "{% generation %}"
        ) from exc


def encode_chats(rows: Sequence[dict[str, Any]], tokenizer, assistant_only: bool = True):
    """``input_ids`` (and ``assistant_masks``) per conversation, for TRL's pre-tokenized path."""
    template = training_template(tokenizer) if assistant_only else None
    encoded = []
    for row in rows:
        out = tokenizer.apply_chat_template(
            row["messages"],
            tools=row["tools"],
            chat_template=template,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=assistant_only,
        )
        item = {"input_ids": list(out["input_ids"])}
        if assistant_only:
            item["assistant_masks"] = list(out["assistant_masks"])
            if not any(item["assistant_masks"]):
                raise TrainError("the chat template marks no assistant tokens in a conversation")
        encoded.append(item)
    return encoded


def run_sft(
    data: Path,
    model: str,
    out: Path,
    *,
    max_steps: int = -1,
    epochs: float = 1.0,
    lr: float = 1e-5,
    batch: int = 1,
    grad_accum: int = 1,
    max_length: int | None = 16384,
    assistant_only: bool = True,
    chat_template: str | None = None,
    device: str = "auto",
    seed: int = 0,
    trl: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Fine-tune ``model`` (Hub id or path) on RFT conversations; saves the model, tokenizer,
    ``trainer_state.json`` and ``metrics.json`` under ``out`` and returns the metrics. Loss is on
    assistant tokens only (its tool calls included) unless ``assistant_only`` is off.
    ``chat_template``: a .jinja file replacing the tokenizer's (for a family TRL has no
    training template for). ``device`` cpu keeps training off the GPUs."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    rows = load_chats(data)
    _check_model(model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    if chat_template:
        if not Path(chat_template).is_file():
            raise TrainError(f"chat_template {chat_template}: no such file")
        tokenizer.chat_template = Path(chat_template).read_text()
    encoded = encode_chats(rows, tokenizer, assistant_only)
    lengths = [len(e["input_ids"]) for e in encoded]
    args = SFTConfig(
        **_args(
            out,
            seed,
            device,
            trl,
            max_steps=max_steps,
            num_train_epochs=epochs,
            learning_rate=lr,
            per_device_train_batch_size=batch,
            gradient_accumulation_steps=grad_accum,
            max_length=max_length,
            assistant_only_loss=False,  # the masks come pre-computed in assistant_masks
        )
    )
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(encoded),
        processing_class=tokenizer,
    )
    result = trainer.train()
    return _finish(
        trainer,
        Path(out),
        {
            "mode": "sft",
            "model": model,
            "conversations": len(rows),
            "tokens_max": max(lengths),
            "truncated": sum(n > max_length for n in lengths) if max_length else 0,
            "train_loss": result.training_loss,
            "runtime_s": result.metrics.get("train_runtime"),
        },
    )


# ----------------------------------------------------------------------------- GRPO


def _rank_gpus(device: str) -> list[str] | None:
    """Under a multi-GPU launch each rank scores on its own GPU, beside its training."""
    if device != "cuda" or "LOCAL_RANK" not in os.environ:
        return None
    from opsynth.filters.pool import visible_gpus

    gpus = visible_gpus()
    rank = int(os.environ["LOCAL_RANK"])
    return [gpus[rank % len(gpus)]] if gpus else None


def run_grpo(
    dataset: Path,
    model: str,
    out: Path,
    *,
    max_steps: int = 200,
    num_generations: int = 8,
    max_completion_length: int = 4096,
    device: str = "auto",
    lr: float = 1e-6,
    batch: int | None = None,
    grad_accum: int = 1,
    temperature: float = 1.0,
    beta: float = 0.0,
    levels: list[int] | None = None,
    limit: int | None = None,
    eval_cfg: EvalConfig | None = None,
    filters: FiltersConfig | None = None,
    seed: int = 0,
    trl: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Single-turn GRPO on the tasks of ``dataset`` (anything ``load_tasks`` reads): each
    prompt asks for a complete ``ModelNew``; the evaluator's reward (-1..3) scores every
    completion on ``device`` through one warm sandboxed pool per process. ``batch`` is
    completions per device per step (default ``num_generations``: one task per step)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from opsynth.evaluator.solution import SolutionError
    from opsynth.evaluator.tasks import load_tasks
    from opsynth.filters.pool import resolve_device
    from opsynth.trainer.single_turn import KernelReward, prompt_for

    try:
        tasks = load_tasks(Path(dataset), levels)
    except SolutionError as exc:
        raise TrainError(str(exc).replace("--tasks", "--dataset")) from exc
    tasks = tasks[:limit] if limit else tasks
    if not tasks:
        raise TrainError(f"--dataset {dataset}: no tasks")
    _check_model(model)
    filters = filters or FiltersConfig()
    scoring = resolve_device(device if device != "auto" else filters.device)
    out = Path(out)
    rank = os.environ.get("RANK")
    log = out / ("rewards.jsonl" if rank in (None, "0") else f"rewards.rank{rank}.jsonl")
    rows = [{"prompt": prompt_for(t, scoring), "task_id": t.id} for t in tasks]
    args = GRPOConfig(
        **_args(
            out,
            seed,
            scoring,
            trl,
            max_steps=max_steps,
            num_generations=num_generations,
            max_completion_length=max_completion_length,
            per_device_train_batch_size=batch or num_generations,
            gradient_accumulation_steps=grad_accum,
            learning_rate=lr,
            temperature=temperature,
            beta=beta,
        )
    )
    reward = KernelReward(
        tasks,
        eval_cfg or EvalConfig(),
        filters,
        scoring,
        gpus=_rank_gpus(scoring),
        log_path=log,
    )
    with reward:
        trainer = GRPOTrainer(
            model=model, reward_funcs=[reward], args=args, train_dataset=Dataset.from_list(rows)
        )
        result = trainer.train()
    history = trainer.state.log_history
    key = f"rewards/{reward.__name__}/mean"
    rewards = [row[key] for row in history if key in row]
    return _finish(
        trainer,
        out,
        {
            "mode": "grpo",
            "model": model,
            "tasks": len(tasks),
            "device": scoring,
            "reward_mean": rewards,
            "reward_calls": reward.calls,
            "train_loss": result.training_loss,
            "runtime_s": result.metrics.get("train_runtime"),
        },
    )
