"""One episode: a ReAct loop of chat completions and tool calls in a fresh workdir, then the
solution left on disk is scored.

Nothing the model or the server does may crash a rollout of thousands of episodes: a failed
request ends the episode with a reason, a malformed tool call is answered with its error as
the observation (the model can correct itself; ``max_tool_errors`` in a row end it), and
every limit is checked before each request. Scoring always runs on the original task code,
whatever the agent did to its copy.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai

from opsynth.config import TrainerConfig
from opsynth.evaluator.solution import Solution
from opsynth.evaluator.tasks import task_key
from opsynth.record import Task, utc_now
from opsynth.trainer.prompts import system_prompt, user_prompt
from opsynth.trainer.trajectory import NO_SOLUTION, Episode, Step, ToolCallLog

WORKDIR = "workdir"  # under the episode's folder, beside trajectory.json
CHARS_PER_TOKEN = 4  # for servers that send no usage
# Tool results that mean the call itself was malformed, not that the command failed: only
# these count toward max_tool_errors, so a model iterating on compile errors is not stopped.
MALFORMED_CALLS = frozenset({"unknown_tool", "bad_arguments"})
_OVERFLOW = re.compile(
    r"context (length|window)|maximum context|too many tokens|prompt is too long|"
    r"exceeds? (the )?(context|maximum)",
    re.IGNORECASE,
)

Scorer = Callable[[Task, Solution], Any]  # -> evaluator.reward.Score or alike


def run_episode(
    client: openai.OpenAI,
    model: str,
    task: Task,
    root: Path,
    cfg: TrainerConfig,
    score: Scorer,
    index: int = 0,
) -> Episode:
    """Run one episode in ``root`` (its workdir is ``root/workdir``) and return it scored; the
    trajectory is saved to ``root/trajectory.json`` after every turn."""
    from opsynth.trainer.tools import Toolbox
    from opsynth.trainer.workdir import materialise

    root = Path(root)
    key = task_key(task)
    episode = Episode(f"{key}.{index}", task.id, key, index, model)
    wd = materialise(task, root / WORKDIR)
    toolbox = Toolbox(wd, cfg)
    episode.tools = toolbox.schemas()
    episode.messages = [
        {"role": "system", "content": system_prompt()},
        {"role": "user", "content": user_prompt(task)},
    ]
    episode.save(root)
    _loop(client, model, cfg, toolbox, episode, root)
    _score(episode, task, wd, score)
    episode.save(root)
    return episode


def _loop(client, model, cfg: TrainerConfig, toolbox, episode: Episode, root: Path) -> None:
    start = time.monotonic()
    consecutive_errors = 0
    while True:
        elapsed = time.monotonic() - start
        episode.wall_s = round(elapsed, 3)
        limit = _limit_reached(episode, cfg, elapsed)
        if limit:
            _end(episode, limit)
            return
        request_start = time.monotonic()
        try:
            response = client.chat.completions.create(
                model=model,
                messages=episode.messages,
                tools=episode.tools,
                tool_choice="auto",
                max_tokens=cfg.completion_tokens,
                temperature=cfg.temperature,
                timeout=max(1.0, min(cfg.request_timeout_s, cfg.wall_time_s - elapsed)),
            )
            choice = response.choices[0]
        except Exception as exc:  # noqa: BLE001 - any failure ends only this episode
            _end(episode, *_request_failure(exc))
            episode.wall_s = round(time.monotonic() - start, 3)
            return
        message = choice.message
        step = Step(
            turn=episode.turns,
            started_s=round(request_start - start, 3),
            request_s=round(time.monotonic() - request_start, 3),
            finish_reason=choice.finish_reason or "",
            **_usage(response, episode.messages, message),
        )
        episode.turns += 1
        episode.prompt_tokens += step.prompt_tokens
        episode.completion_tokens += step.completion_tokens
        episode.steps.append(step)
        calls = list(message.tool_calls or [])
        episode.messages.append(_assistant_message(message, calls, episode.turns))
        if not calls:
            _end(episode, "truncated" if step.finish_reason == "length" else "finished")
            episode.wall_s = round(time.monotonic() - start, 3)
            episode.save(root)
            return
        episode.save(root)  # before tools that may run for minutes
        tools_start = time.monotonic()
        consecutive_errors = _answer_calls(toolbox, episode, step, consecutive_errors)
        step.tools_s = round(time.monotonic() - tools_start, 3)
        episode.wall_s = round(time.monotonic() - start, 3)
        episode.save(root)
        if consecutive_errors >= cfg.max_tool_errors:
            _end(episode, "tool_errors", f"{consecutive_errors} malformed tool calls in a row")
            return


def _answer_calls(toolbox, episode: Episode, step: Step, consecutive_errors: int) -> int:
    """Run the last reply's tool calls in order, appending one tool message each; returns the
    count of malformed calls in a row so far."""
    for call in episode.messages[-1]["tool_calls"]:
        log, observation = _run_tool(toolbox, call)
        step.tool_calls.append(log)
        episode.tool_calls += 1
        episode.tool_errors += bool(log.error)
        episode.messages.append(
            {"role": "tool", "tool_call_id": log.id, "name": log.name, "content": observation}
        )
        consecutive_errors = consecutive_errors + 1 if log.error in MALFORMED_CALLS else 0
    return consecutive_errors


def _limit_reached(episode: Episode, cfg: TrainerConfig, elapsed: float) -> str:
    if episode.turns >= cfg.max_turns:
        return "max_turns"
    if episode.tokens >= cfg.max_tokens:
        return "max_tokens"
    if elapsed >= cfg.wall_time_s:
        return "wall_time"
    return ""


def _end(episode: Episode, reason: str, detail: str = "") -> None:
    episode.end_reason = reason
    episode.end_detail = detail


def _request_failure(exc: Exception) -> tuple[str, str]:
    """(end reason, one-line detail) for a request that got no usable answer."""
    status = getattr(exc, "status_code", None)
    text = str(getattr(exc, "message", "") or exc).strip().splitlines()
    first = text[0][:300] if text else ""
    detail = f"{type(exc).__name__}" + (f" {status}" if status else "") + f": {first}"
    if isinstance(exc, openai.BadRequestError) and _OVERFLOW.search(str(exc)):
        return "context_overflow", detail
    return "api_error", detail


def _usage(response, messages: list[dict], message) -> dict[str, Any]:
    usage = getattr(response, "usage", None)
    if usage is not None and (usage.prompt_tokens or usage.completion_tokens):
        return {
            "prompt_tokens": int(usage.prompt_tokens or 0),
            "completion_tokens": int(usage.completion_tokens or 0),
            "usage_estimated": False,
        }
    prompt = len(json.dumps(messages))
    completion = len(message.content or "") + sum(
        len(c.function.arguments or "") for c in (message.tool_calls or [])
    )
    return {
        "prompt_tokens": prompt // CHARS_PER_TOKEN,
        "completion_tokens": completion // CHARS_PER_TOKEN,
        "usage_estimated": True,
    }


def _assistant_message(message, calls: list, turn: int) -> dict[str, Any]:
    """The reply as it is sent back next turn; servers that omit call ids get stable ones,
    since every tool message must name the call it answers."""
    out: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
    if calls:
        out["tool_calls"] = [
            {
                "id": call.id or f"call_{turn}_{n}",
                "type": "function",
                "function": {
                    "name": call.function.name or "",
                    "arguments": call.function.arguments or "",
                },
            }
            for n, call in enumerate(calls)
        ]
    return out


def _run_tool(toolbox, logged: dict) -> tuple[ToolCallLog, str]:
    from opsynth.trainer.tools import ToolResult

    name, arguments = logged["function"]["name"], logged["function"]["arguments"]
    start = time.monotonic()
    try:
        result = toolbox.call(name, arguments)
    except Exception as exc:  # noqa: BLE001 - the toolbox promises not to raise; be sure
        result = ToolResult(f"internal error: {type(exc).__name__}: {exc}", "internal_error")
    observation = result.output
    if result.error and not observation:
        observation = f"error: {result.error}"
    log = ToolCallLog(
        id=logged["id"],
        name=name,
        arguments=arguments,
        error=result.error,
        observation_chars=len(observation),
        seconds=round(time.monotonic() - start, 3),
    )
    return log, observation


def _score(episode: Episode, task: Task, wd, score: Scorer) -> None:
    """Reward -1 without a solution; a scorer failure leaves the episode not done, so a
    re-run tries it again rather than recording an infrastructure fault as the model's."""
    from opsynth.trainer.workdir import collect_solution, protected_changes

    episode.protected_changes = protected_changes(wd)
    solution = collect_solution(wd)
    episode.finished_at = utc_now()
    if solution is None:
        episode.reward, episode.score_reason, episode.done = -1, NO_SOLUTION, True
        episode.score_detail = "no readable model_new.py in the workdir"
        return
    episode.solution = solution.files()
    try:
        result = score(task, solution)
    except Exception as exc:  # noqa: BLE001
        episode.score_reason = "score_error"
        episode.score_detail = f"{type(exc).__name__}: {exc}"
        return
    episode.reward = int(result.reward)
    episode.score_reason = result.reason
    episode.score_detail = result.detail
    episode.eager_ms, episode.compile_ms = result.eager_ms, result.compile_ms
    episode.solution_ms = result.solution_ms
    episode.speedup_eager, episode.speedup_compile = result.speedup_eager, result.speedup_compile
    episode.flags = list(result.flags)
    episode.done = True
