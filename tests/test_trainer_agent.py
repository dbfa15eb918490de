"""The agent loop against a real HTTP server on loopback: the scripted OpenAI-compatible server
of tests/chatserver.py, for exact sequences and every bad input (a real model runs in
tests/test_trainer_rollout.py). Solutions are scored by the evaluator's sandboxed pool on
CPU, where a correct solution earns 1 (CPU is not timed).
"""

from __future__ import annotations

import socket
from pathlib import Path

import openai
import pytest
from chatserver import (
    BROKEN_JSON,
    ENDLESS,
    HTTP_500,
    OVERFLOW,
    UNKNOWN_TOOL,
    Call,
    ChatServer,
    Reply,
    always,
    reference_for,
    turn_of,
)
from evaluator_cases import task

from opsynth.config import EvalConfig, FiltersConfig, TrainerConfig
from opsynth.trainer.agent import WORKDIR, run_episode
from opsynth.trainer.rollout import PoolScorer
from opsynth.trainer.trajectory import END_REASONS, NO_SOLUTION, load_episode

TOOL_NAMES = {"bash", "read", "write", "edit", "multi_edit", "glob", "grep"}


def good(messages: list[dict]) -> Reply:
    turn = turn_of(messages)
    if turn == 0:
        return Reply("Reading the reference first.", (Call("read", {"path": "model.py"}),))
    if turn == 1:
        content = reference_for(messages)
        return Reply(calls=(Call("write", {"path": "model_new.py", "content": content}),))
    if turn == 2:
        return Reply(
            calls=(Call("bash", {"command": "python -m opsynth.trainer.commands verify"}),)
        )
    return Reply("ModelNew is in model_new.py.")


def record_log(seen: list[int], folder: Path):
    """ENDLESS, noting how many messages trajectory.json held when each request arrived."""

    def script(messages: list[dict]) -> Reply:
        saved = load_episode(folder)
        seen.append(len(saved.messages) if saved else -1)
        return ENDLESS(messages)

    return script


@pytest.fixture(scope="module")
def scorer():
    with PoolScorer(EvalConfig(strict=False), FiltersConfig(device="cpu", workers=1), "cpu") as s:
        yield s


@pytest.fixture(scope="module")
def chat():
    scripts = {
        "good": good,
        "unknown": UNKNOWN_TOOL,
        "broken": BROKEN_JSON,
        "endless": ENDLESS,
        "http500": HTTP_500,
        "overflow": OVERFLOW,
        "hungry": always(Reply(calls=(Call("glob", {"pattern": "*"}),), prompt_tokens=600)),
        "slow": always(Reply(calls=(Call("glob", {"pattern": "*"}),), delay_s=0.4)),
        "chatty": always(Reply("unfinished thou", finish_reason="length")),
    }
    with ChatServer(scripts) as server:
        yield server


@pytest.fixture(scope="module")
def client(chat):
    return openai.OpenAI(base_url=chat.url, api_key="EMPTY", max_retries=0)


def no_scoring(task, solution):
    raise AssertionError("nothing to score in this episode")


def check_saved(episode, folder: Path) -> None:
    saved = load_episode(folder)
    assert saved is not None and saved.to_dict() == episode.to_dict()
    assert episode.end_reason in END_REASONS and episode.done


def test_known_good_sequence_earns_a_reward(client, chat, scorer, tmp_path):
    episode = run_episode(client, "good", task(), tmp_path, TrainerConfig(), scorer)
    assert episode.end_reason == "finished", episode.end_detail
    assert (episode.reward, episode.score_reason) == (1, "ok"), episode.score_detail
    assert episode.turns == 4 and len(episode.steps) == 4
    calls = [c for s in episode.steps for c in s.tool_calls]
    assert [c.name for c in calls] == ["read", "write", "bash"]
    assert calls[0].error == calls[1].error == ""
    # strict verify refuses the reference's torch ops; the agent is told, the score is lenient
    assert calls[2].error in ("", "nonzero_exit")
    assert all(c.observation_chars > 0 and c.seconds >= 0 for c in calls)
    roles = [m["role"] for m in episode.messages]
    assert roles == ["system", "user"] + ["assistant", "tool"] * 3 + ["assistant"]
    tool_ids = [m["tool_call_id"] for m in episode.messages if m["role"] == "tool"]
    asked = [m["tool_calls"][0]["id"] for m in episode.messages if m.get("tool_calls")]
    assert tool_ids == asked
    assert "class Model" in episode.messages[3]["content"]  # the read observation
    assert episode.solution and "ModelNew = Model" in episode.solution["model_new.py"]
    assert episode.protected_changes == []
    assert episode.prompt_tokens > 0 and episode.completion_tokens > 0 and episode.wall_s > 0
    assert all(not s.usage_estimated for s in episode.steps)
    assert (tmp_path / WORKDIR / "model_new.py").is_file()
    check_saved(episode, tmp_path)
    first = chat.requests_for("good")[0]
    assert {t["function"]["name"] for t in first["tools"]} == TOOL_NAMES
    assert first["tool_choice"] == "auto" and first["max_tokens"] == 4096


@pytest.mark.parametrize(
    ("model", "error"), [("unknown", "unknown_tool"), ("broken", "bad_arguments")]
)
def test_malformed_tool_calls_end_with_tool_errors(client, model, error, tmp_path):
    cfg = TrainerConfig(max_tool_errors=3)
    episode = run_episode(client, model, task(), tmp_path, cfg, no_scoring)
    assert episode.end_reason == "tool_errors" and episode.turns == 3
    assert [c.error for s in episode.steps for c in s.tool_calls] == [error] * 3
    observations = [m["content"] for m in episode.messages if m["role"] == "tool"]
    assert len(observations) == 3 and all(observations)
    assert (episode.reward, episode.score_reason) == (-1, NO_SOLUTION)
    assert episode.tool_errors == 3
    check_saved(episode, tmp_path)


def test_a_model_that_never_stops_hits_max_turns_and_is_logged_as_it_goes(chat, tmp_path):
    seen: list[int] = []
    chat.scripts["recorded"] = record_log(seen, tmp_path)
    client = openai.OpenAI(base_url=chat.url, api_key="EMPTY", max_retries=0)
    episode = run_episode(
        client, "recorded", task(), tmp_path, TrainerConfig(max_turns=4), no_scoring
    )
    assert episode.end_reason == "max_turns" and episode.turns == 4
    assert all(c.error == "" for s in episode.steps for c in s.tool_calls)
    # before every request, the file already held the conversation so far
    assert seen == [2, 4, 6, 8]
    assert (episode.reward, episode.score_reason) == (-1, NO_SOLUTION)
    check_saved(episode, tmp_path)


@pytest.mark.parametrize(
    ("model", "cfg", "reason"),
    [
        ("hungry", TrainerConfig(max_tokens=1000), "max_tokens"),
        ("slow", TrainerConfig(wall_time_s=1.0), "wall_time"),
        ("chatty", TrainerConfig(), "truncated"),
        ("endless", TrainerConfig(max_turns=1), "max_turns"),
    ],
)
def test_limits(client, model, cfg, reason, tmp_path):
    episode = run_episode(client, model, task(), tmp_path, cfg, no_scoring)
    assert episode.end_reason == reason
    if reason == "max_tokens":
        assert episode.turns == 2 and episode.tokens >= 1000
    check_saved(episode, tmp_path)


@pytest.mark.parametrize(
    ("model", "reason"), [("http500", "api_error"), ("overflow", "context_overflow")]
)
def test_request_failures_end_the_episode_not_the_rollout(client, model, reason, tmp_path):
    episode = run_episode(client, model, task(), tmp_path, TrainerConfig(), no_scoring)
    assert episode.end_reason == reason and episode.turns == 0
    status = "500" if model == "http500" else "400"
    assert status in episode.end_detail, episode.end_detail
    assert (episode.reward, episode.score_reason) == (-1, NO_SOLUTION)
    check_saved(episode, tmp_path)


def test_an_unreachable_server_is_an_api_error(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
    episode = run_episode(client, "any", task(), tmp_path, TrainerConfig(), no_scoring)
    assert episode.end_reason == "api_error" and "APIConnectionError" in episode.end_detail
