"""TRL training wiring on CPU with a tiny offline model: one SFT step on RFT chats, one GRPO
step rewarded by the sandboxed evaluator, the reward function itself, the CLI's errors.

A random 30k-parameter model proves the plumbing (template, masks, generation, reward, step,
saving), not that anything learns.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opsynth.config import EvalConfig, FiltersConfig
from opsynth.flows.cli_train import train_app
from opsynth.trainer.single_turn import KernelReward, parse_solution, prompt_for
from opsynth.trainer.tiny import build_tiny_model
from opsynth.trainer.train import encode_chats, load_chats, load_train_config, run_grpo, run_sft
from tests.evaluator_cases import TASK, model_new, task

CACHE = Path(__file__).resolve().parent.parent / ".cache" / "test-compile"
CONFIGS = Path(__file__).resolve().parent.parent / "configs" / "trainer"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "run a shell command in the workdir",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


def rft_row(i: int) -> dict:
    """One trajectory as the RFT export writes it: OpenAI messages, arguments as a string."""
    call = {"id": f"call_{i}", "type": "function"}
    call["function"] = {"name": "bash", "arguments": json.dumps({"command": f"nvcc k{i}.cu"})}
    return {
        "messages": [
            {"role": "system", "content": "You write CUDA kernels."},
            {"role": "user", "content": f"Optimise task {i}."},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": "built ok"},
            {"role": "assistant", "content": f"Done with task {i}."},
        ],
        "tools": TOOLS,
    }


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny")))


@pytest.fixture
def chats(tmp_path: Path) -> Path:
    path = tmp_path / "rft.jsonl"
    path.write_text("".join(json.dumps(rft_row(i)) + "\n" for i in range(3)))
    return path


def kernelbench(path: Path, n: int = 2) -> Path:
    code = [TASK.replace("[2.0]", f"[{i}.5]") for i in range(n)]
    rows = [{"level": 1, "problem_id": i, "name": f"relu_{i}", "code": code[i]} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_assistant_mask_covers_the_tool_call_and_nothing_it_was_told(tiny, chats) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    (row, *_) = encode_chats(load_chats(chats), tokenizer)
    ids, mask = row["input_ids"], row["assistant_masks"]
    learned = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert '{"name": "bash", "arguments": {"command": "nvcc k0.cu"}}' in learned
    assert "Done with task 0." in learned and learned.count("<|im_end|>") == 2
    assert "built ok" not in learned and "Optimise" not in learned and "# Tools" not in learned


def test_one_sft_step_on_rft_chats(tiny, chats, tmp_path) -> None:
    out = tmp_path / "sft"
    metrics = run_sft(chats, tiny, out, max_steps=1, batch=2, max_length=512, device="cpu")
    assert metrics["global_step"] == 1 and metrics["conversations"] == 3
    assert math.isfinite(metrics["loss"]) and metrics["loss"] > 0
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert json.loads((out / "metrics.json").read_text())["global_step"] == 1
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 1


def test_one_grpo_step_logs_the_rewards_the_function_gives(tiny, tmp_path) -> None:
    dataset = kernelbench(tmp_path / "tasks.jsonl")
    out = tmp_path / "grpo"
    filters = FiltersConfig(workers=1, cache_dir=str(CACHE))
    metrics = run_grpo(
        dataset,
        tiny,
        out,
        max_steps=1,
        num_generations=2,
        max_completion_length=32,
        batch=4,
        device="cpu",
        filters=filters,
    )
    assert metrics["global_step"] == 1 and metrics["tasks"] == 2
    assert math.isfinite(metrics["loss"]) and metrics["reward_calls"] == 1
    assert (out / "model.safetensors").is_file() and (out / "metrics.json").is_file()
    rows = [json.loads(line) for line in (out / "rewards.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and len({r["task_id"] for r in rows}) == 2
    # the same completions through a fresh reward function: a random model writes no solution
    again = KernelReward(task_list(dataset), EvalConfig(), filters, "cpu")(
        [None] * 4, [r["completion"] for r in rows], task_id=[r["task_id"] for r in rows]
    )
    assert again == [r["reward"] for r in rows] == [-1.0] * 4
    assert metrics["reward_mean"] == [sum(again) / len(again)]


def task_list(dataset: Path):
    from opsynth.evaluator.tasks import load_tasks

    return load_tasks(dataset)


def test_reward_scores_completions_in_one_warm_pool() -> None:
    """Real sandboxed scoring, lenient so a plain-PyTorch ModelNew counts as correct (strict
    scoring needs a compiled extension, minutes of g++ on a small CPU)."""
    t = task()
    correct = model_new("return torch.relu(x) * self.scale + x")
    wrong = model_new("return torch.relu(x) * self.scale - x")
    completions = [
        f"Sure.\n```python\n{correct}```\nThis fuses the ops.",
        [{"role": "assistant", "content": f"```python\n{wrong}```"}],
        "garbage ``` no code here",
        f"```python\n{correct}",  # cut off before the closing fence
        f"```python\n{correct}```",
    ]
    ids = [t.id] * 4 + ["no-such-task"]
    filters = FiltersConfig(workers=2, cache_dir=str(CACHE))
    with KernelReward([t], EvalConfig(strict=False), filters, "cpu") as reward:
        assert reward([None] * 5, completions, task_id=ids) == [1.0, -1.0, -1.0, -1.0, -1.0]
        pool = reward._scoring._pool
        assert pool is not None
        assert reward([None], [completions[0]], task_id=[t.id]) == [1.0]
        assert reward._scoring._pool is pool  # kept warm between calls
    assert reward._scoring._pool is None
    with KernelReward([t], EvalConfig(), filters, "cpu") as idle:
        assert idle([None] * 2, ["no code", "```python\nx = 1\n```"], task_id=[t.id] * 2) == [
            -1.0,
            -1.0,
        ]
        assert idle._scoring._pool is None  # nothing worth scoring never starts a sandbox


def test_parse_solution_takes_the_last_block_defining_model_new() -> None:
    first, last = model_new("return x"), model_new("return x + 0")
    text = f"```python\n{first}```\ntext\n```py\n{last}```\n```\nprint('not it')\n```"
    assert parse_solution(text).model_new == last
    assert parse_solution("```python\nclass ModelNew(:\n```") is None
    assert parse_solution("```python\nModelNew = 1\n```") is None
    prompt = prompt_for(task(), "cuda")
    assert prompt[1]["content"].count("class Model(") == 1 and "CUDA" in prompt[1]["content"]


RECIPES = sorted(p.name for p in CONFIGS.glob("*.*ml") if not p.name.startswith("accelerate"))


@pytest.mark.parametrize("name", RECIPES)
def test_bundled_configs_build_trl_configs(name: str) -> None:
    from trl import GRPOConfig, SFTConfig

    from opsynth.trainer.train import _args

    cfg = load_train_config(CONFIGS / name)
    assert cfg["model"]
    sft, grpo = cfg.get("sft", {}), cfg.get("grpo", {})
    SFTConfig(**_args("unused", 0, "cpu", sft.get("trl"), max_length=sft.get("max_length")))
    per_device = grpo.get("batch") or grpo.get("num_generations", 8)
    GRPOConfig(
        **_args(
            "unused",
            0,
            "cpu",
            grpo.get("trl"),
            num_generations=grpo.get("num_generations", 8),
            per_device_train_batch_size=per_device,
        )
    )


def test_accelerate_config_is_a_multi_gpu_launch() -> None:
    from accelerate.commands.config.config_args import ClusterConfig

    cfg = ClusterConfig.from_yaml_file(CONFIGS / "accelerate_multi_gpu.yaml")
    assert cfg.distributed_type == "MULTI_GPU" and cfg.num_processes == 8
    assert cfg.mixed_precision == "bf16"


def cli(*args: str):
    result = CliRunner().invoke(train_app, list(args))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    return result.exit_code, lines


def test_cli_sft_takes_the_config_and_lets_options_win(tiny, chats, tmp_path) -> None:
    cfg = tmp_path / "train.yaml"
    cfg.write_text("model: no/such-model\nsft:\n  max_steps: 5\n  batch: 2\n  max_length: 512\n")
    out = tmp_path / "sft"
    args = ["sft", "--data", str(chats), "--config", str(cfg), "--model", tiny, "--out", str(out)]
    result = CliRunner().invoke(train_app, [*args, "--max-steps", "1", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.stdout.strip().splitlines()[-1])
    assert metrics["global_step"] == 1 and metrics["model"] == tiny
    assert (out / "model.safetensors").is_file()


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("missing", "no such file"),
        ("empty", "no conversation with an assistant message"),
        ("model", "no such directory"),
        ("config", "unknown key"),
        ("dataset", "--dataset"),
    ],
)
def test_cli_bad_input_is_one_line(case, needle, chats, tmp_path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    bad_cfg = tmp_path / "bad.toml"
    bad_cfg.write_text('model = "x"\nepochs = 3\n')
    out = str(tmp_path / "o")
    args = {
        "missing": ["sft", "--data", str(tmp_path / "nope.jsonl"), "--model", "m", "--out", out],
        "empty": ["sft", "--data", str(empty), "--model", "m", "--out", out],
        "model": ["sft", "--data", str(chats), "--model", str(tmp_path / "no-model")],
        "config": ["sft", "--data", str(chats), "--config", str(bad_cfg)],
        "dataset": ["grpo", "--dataset", str(tmp_path / "t.txt"), "--model", "m"],
    }[case]
    code, lines = cli(*args)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error:") and needle in lines[0], lines


def test_missing_train_extra_is_one_line(tiny, chats, tmp_path) -> None:
    """Without trl installed (hidden from this interpreter) `opsynth train sft` says what to
    install instead of printing a traceback."""
    import subprocess
    import sys

    hide = (
        "import sys, importlib.abc\n"
        "class Hide(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] == 'trl':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Hide())\n"
        "from flows.cli import main\n"
        "main()\n"
    )
    args = ["train", "sft", "--data", str(chats), "--model", str(tiny), "--out", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-c", hide, *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "needs the train extra (trl is missing)" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
