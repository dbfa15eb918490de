"""Rollouts, resume, the RFT export, the CLI and publishing, against real servers on loopback:
the scripted chat server (tests/chatserver.py), the Hub-compatible server (tests/hubserver.py)
and llama.cpp with a tiny model. Scoring is the evaluator's sandboxed pool on CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import openai
import pyarrow.parquet as pq
import pytest
import typer
from chatserver import ENDLESS, Call, ChatServer, Reply, reference_for, turn_of
from evaluator_cases import task
from hubserver import HubServer
from llamaserver import MODEL as LLAMA_MODEL
from llamaserver import free_port, serve
from typer.testing import CliRunner

from opsynth.config import EvalConfig, FiltersConfig, TrainerConfig
from opsynth.flows.cli_rollout import rft, rollout
from opsynth.record import Task
from opsynth.store import write_tasks
from opsynth.trainer.rft import export_sft, select, sft_row, well_formed
from opsynth.trainer.rollout import (
    SUMMARY,
    TRAJECTORIES,
    PoolScorer,
    episode_dir,
    read_episodes,
    run_rollout,
)
from opsynth.trainer.trajectory import TRAJECTORY, Episode, load_episode

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "hf_test_secret_token_0123456789"

TANH = """\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.tanh(x) * 2


def get_inputs():
    return [torch.randn(32, 128)]


def get_init_inputs():
    return []
"""

WRONG = """\
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x * 3
"""


def tasks() -> list[Task]:
    return [task(), Task(ops=["torch.tanh"], data_source="torch#1", code=TANH)]


def solver(messages: list[dict]) -> Reply:
    """Read, write (a correct solution for the relu task, a wrong one for tanh), stop."""
    turn = turn_of(messages)
    if turn == 0:
        return Reply(calls=(Call("read", {"path": "model.py"}),))
    if turn == 1:
        wrong = "tanh" in messages[1]["content"]
        content = WRONG if wrong else reference_for(messages)
        return Reply(calls=(Call("write", {"path": "model_new.py", "content": content}),))
    return Reply("done")


@pytest.fixture(scope="module")
def scorer():
    with PoolScorer(EvalConfig(strict=False), FiltersConfig(device="cpu", workers=1), "cpu") as s:
        yield s


@pytest.fixture(scope="module")
def chat():
    with ChatServer({"solver": solver, "endless": ENDLESS}) as server:
        yield server


@pytest.fixture(scope="module")
def rolled(chat, scorer, tmp_path_factory):
    """2 tasks x 2 episodes, 2 at a time."""
    out = tmp_path_factory.mktemp("rollout")
    client = openai.OpenAI(base_url=chat.url, api_key="EMPTY", max_retries=0)
    cfg = TrainerConfig(episodes_per_task=2, concurrency=2)
    return out, client, cfg, run_rollout(tasks(), client, "solver", out, cfg, scorer)


def test_rollout_scores_every_episode(rolled):
    out, _, _, result = rolled
    assert (result.ran, result.skipped, result.failed) == (4, 0, [])
    rewards = {(e.task_key, e.index): e.reward for e in result.episodes}
    relu, tanh = (t.id for t in tasks())
    assert rewards == {(relu, 0): 1, (relu, 1): 1, (tanh, 0): -1, (tanh, 1): -1}
    for t in tasks():
        for k in range(2):
            folder = episode_dir(out, t, k)
            assert (folder / TRAJECTORY).is_file() and (folder / "workdir" / "model.py").is_file()
    rows = pq.read_table(out / TRAJECTORIES).to_pylist()
    assert [(r["task_key"], r["index"]) for r in rows] == sorted(rewards)
    assert all(r["end_reason"] == "finished" and r["turns"] == 3 for r in rows)
    assert json.loads(rows[0]["messages"])[0]["role"] == "system"
    assert read_episodes(out)[0].to_dict() == result.episodes[0].to_dict()
    summary = json.loads((out / SUMMARY).read_text())
    assert summary["episodes"] == 4 and summary["reward_histogram"] == {"-1": 2, "1": 2}
    assert summary["end_reasons"] == {"finished": 4} and summary["tasks_solved"] == 1
    assert summary["mean_turns"] == 3 and summary["failed"] == 0


def test_rerun_resumes_and_restarts_only_the_unfinished(rolled, chat, scorer):
    out, client, cfg, first = rolled
    asked = len(chat.requests_for("solver"))
    again = run_rollout(tasks(), client, "solver", out, cfg, scorer)
    assert (again.ran, again.skipped) == (0, 4)
    assert len(chat.requests_for("solver")) == asked, "nothing is asked twice"
    assert [e.to_dict() for e in again.episodes] == [e.to_dict() for e in first.episodes]

    folder = episode_dir(out, tasks()[1], 1)  # as if killed mid-episode
    saved = json.loads((folder / TRAJECTORY).read_text())
    saved.update(done=False, end_reason="", reward=None)
    (folder / TRAJECTORY).write_text(json.dumps(saved))
    (folder / "workdir" / "stray.txt").write_text("left by the killed run")
    third = run_rollout(tasks(), client, "solver", out, cfg, scorer)
    assert (third.ran, third.skipped) == (1, 3)
    assert not (folder / "workdir" / "stray.txt").exists()
    assert load_episode(folder).done and len(read_episodes(out)) == 4


def test_a_scorer_failure_is_retried_not_recorded_as_the_models(chat, scorer, tmp_path):
    client = openai.OpenAI(base_url=chat.url, api_key="EMPTY", max_retries=0)
    cfg = TrainerConfig()

    def broken(task, solution):
        raise RuntimeError("pool lost")

    first = run_rollout([task()], client, "solver", tmp_path, cfg, broken)
    assert first.episodes == [] and len(first.failed) == 1 and "pool lost" in first.failed[0]
    saved = load_episode(episode_dir(tmp_path, task(), 0))
    assert saved.end_reason == "finished" and not saved.done and saved.reward is None
    second = run_rollout([task()], client, "solver", tmp_path, cfg, scorer)
    assert second.ran == 1 and second.episodes[0].reward == 1


def episode(key: str, index: int, reward: int, tokens: int, arguments: str = "{}") -> Episode:
    call = {"id": "c0", "type": "function", "function": {"name": "glob", "arguments": arguments}}
    return Episode(
        f"{key}.{index}",
        key,
        key,
        index,
        "m",
        messages=[
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c0", "name": "glob", "content": "x"},
            {"role": "assistant", "content": "done"},
        ],
        done=True,
        reward=reward,
        prompt_tokens=tokens,
    )


def test_rft_selection_rules():
    pool = [
        episode("a", 0, 2, 900),
        episode("a", 1, 3, 5000),
        episode("a", 2, 3, 1000),  # best: highest reward, then fewest tokens
        episode("a", 3, 3, 800, '{"pattern": '),  # malformed call: never kept
        episode("b", 0, 1, 10),
        episode("b", 1, 2, 400),
        episode("b", 2, 2, 300),
        episode("c", 0, -1, 10),
    ]
    assert not well_formed(pool[3])
    assert [e.episode_id for e in select(pool, 2, 1)] == ["a.2", "b.2"]
    assert [e.episode_id for e in select(pool, 1, 2)] == ["a.2", "a.1", "b.2", "b.1"]
    assert [e.episode_id for e in select(pool, -1, 1)] == ["a.2", "b.2", "c.0"]
    assert select(pool, 3, 5) == [pool[2], pool[1]]


def test_rft_export_is_trl_conversational_with_tools(rolled, tmp_path):
    out = rolled[0]
    target = tmp_path / "sft.jsonl"
    stats = export_sft(read_episodes(out), target, min_reward=1, per_task=1)
    assert stats["selected"] == 1 and stats["episode_ids"] == [f"{task().id}.0"]
    (row,) = [json.loads(line) for line in target.read_text().splitlines()]
    assert set(row) == {"messages", "tools"}
    assert {t["function"]["name"] for t in row["tools"]} >= {"bash", "read", "write"}
    roles = [m["role"] for m in row["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    call = row["messages"][2]["tool_calls"][0]
    assert call["function"] == {"name": "read", "arguments": {"path": "model.py"}}
    assert row["messages"][3]["tool_call_id"] == call["id"]
    assert json.loads((tmp_path / "sft.jsonl.stats.json").read_text())["selected"] == 1
    # the chat template of a tool-calling model renders it
    from opsynth.trainer.tiny import CHAT_TEMPLATE

    rendered = _render(CHAT_TEMPLATE, row)
    assert "model_new.py" in rendered and '"path": "model.py"' in rendered
    assert sft_row(read_episodes(out)[0]) == row


def _render(template: str, row: dict) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        conversations=[row["messages"]], tools=row["tools"], chat_template=template
    )
    return rendered[0]


# ---------------------------------------------------------------------------------- CLI


def cli() -> typer.Typer:
    app = typer.Typer(add_completion=False)
    app.command(name="rollout")(rollout)
    app.command(name="rft")(rft)
    return app


def invoke(*args: str):
    return CliRunner().invoke(cli(), list(args))


def one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_cli_rollout_and_rft(chat, rolled, tmp_path):
    dataset = tmp_path / "tasks.parquet"
    write_tasks(tasks(), dataset)
    config = tmp_path / "cfg.toml"
    config.write_text("[trainer]\nmax_turns = 2\n")
    out = tmp_path / "out"
    common = ["--dataset", str(dataset), "--base-url", chat.url, "--out", str(out)]
    result = invoke(
        "rollout", *common, "--model", "endless", "--config", str(config), "--limit", "1",
        "--concurrency", "2", "--device", "cpu",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "rollout: 1 episodes of 1 tasks" in result.output and "end: max_turns" in result.output
    assert json.loads((out / SUMMARY).read_text())["reward_histogram"] == {"-1": 1}

    sft = tmp_path / "sft.jsonl"
    done = invoke("rft", "--rollouts", str(rolled[0]), "--out", str(sft), "--min-reward", "1")
    assert done.exit_code == 0, done.output
    assert "kept 1 of 4 trajectories" in done.output and len(sft.read_text().splitlines()) == 1
    none = invoke("rft", "--rollouts", str(out), "--out", str(tmp_path / "x.jsonl"))
    assert none.exit_code == 1 and "nothing passed" in none.output


def test_cli_bad_inputs_are_one_line(chat, tmp_path):
    dataset = tmp_path / "tasks.parquet"
    write_tasks(tasks(), dataset)
    ok = ["--dataset", str(dataset), "--model", "solver", "--out", str(tmp_path / "o")]
    dead = f"http://127.0.0.1:{free_port()}/v1"
    one_line_error(invoke("rollout", *ok, "--base-url", "ftp://x"), "not an http(s) URL")
    one_line_error(invoke("rollout", *ok, "--base-url", dead), "cannot reach")
    one_line_error(
        invoke("rollout", *ok, "--base-url", chat.url, "--concurrency", "0"), "--concurrency"
    )
    missing = ["--dataset", str(tmp_path / "nope.parquet"), "--model", "m"]
    one_line_error(invoke("rollout", *missing, "--base-url", chat.url), "no such file")
    one_line_error(
        invoke("rollout", *ok, "--base-url", chat.url, "--push-to", "not a repo"), "repo-id"
    )
    one_line_error(invoke("rft", "--rollouts", str(tmp_path / "none"), "--out", "x"), "no such")
    one_line_error(
        invoke("rft", "--rollouts", str(tmp_path), "--out", "x", "--min-reward", "0"),
        "--min-reward",
    )
    one_line_error(invoke("rft", "--rollouts", str(tmp_path), "--out", "x"), "no scored")


# ------------------------------------------------------------------------------ publish

PUBLISH = """
import json, sys
from pathlib import Path
import datasets
from opsynth.trainer.rollout import publish_rollout
out, repo = Path(sys.argv[1]), sys.argv[2]
first = publish_rollout(out, repo, "1.0.0")
second = publish_rollout(out, repo, "1.0.0")
rows = datasets.load_dataset(repo, split="train", revision="v1.0.0")
print(json.dumps({"changed": [first.changed, second.changed], "tag": first.tag,
                  "rows": rows.num_rows, "columns": rows.column_names}))
"""


def test_rollouts_publish_to_the_hub_as_a_version(rolled, tmp_path):
    with HubServer({TOKEN: ["org"]}) as hub:
        env = {
            **os.environ,
            "HF_ENDPOINT": hub.url,
            "HF_TOKEN": TOKEN,
            "HF_HOME": str(tmp_path / "hf"),
            "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
            "NO_PROXY": "127.0.0.1",
            "PYTHONPATH": str(ROOT),
        }
        proc = subprocess.run(
            [sys.executable, "-c", PUBLISH, str(rolled[0]), "org/rollouts"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = json.loads(proc.stdout.strip().splitlines()[-1])
    assert done["changed"] == [True, False] and done["tag"] == "v1.0.0"
    assert done["rows"] == 4 and {"messages", "reward", "end_reason"} <= set(done["columns"])
    assert TOKEN not in proc.stdout + proc.stderr
    card = (rolled[0] / "publish" / "README.md").read_text()
    assert card.startswith("---\n") and "| finished | 4 |" in card


# ---------------------------------------------------------------------------- llama.cpp


@pytest.fixture(scope="module")
def llama_url(tmp_path_factory):
    """llama.cpp's server with its ChatML function-calling format: the tiny model's own
    template has no tools, and this one lets any model choose between a message and calls."""
    yield from serve(tmp_path_factory.mktemp("llama"), chat_format="chatml-function-calling")


def test_a_real_model_rollout(llama_url, scorer, tmp_path):
    client = openai.OpenAI(base_url=llama_url, api_key="EMPTY", max_retries=0)
    cfg = TrainerConfig(
        max_turns=3,
        completion_tokens=128,
        request_timeout_s=240.0,
        max_tool_errors=2,
        episodes_per_task=2,
        concurrency=1,  # the second episode reuses the server's prompt cache
    )
    start = time.monotonic()
    result = run_rollout([task()], client, LLAMA_MODEL, tmp_path, cfg, scorer)
    for e in result.episodes:
        calls = [
            c.name + (f"({c.error})" if c.error else "") for s in e.steps for c in s.tool_calls
        ]
        print(
            f"\nllama.cpp {e.episode_id}: {e.end_reason} after {e.turns} turns, {e.tokens} "
            f"tokens, reward {e.reward} ({e.score_reason}), tools {calls}"
        )
    print(f"{time.monotonic() - start:.1f} s")
    assert result.failed == [] and len(result.episodes) == 2
    for e in result.episodes:
        assert e.end_reason not in ("api_error", "") and 1 <= e.turns <= 3, e.end_detail
        assert e.reward in (-1, 1, 2, 3) and e.prompt_tokens > 0
        assert e.messages[2]["role"] == "assistant"
    assert pq.read_table(tmp_path / TRAJECTORIES).num_rows == 2
