"""A scripted OpenAI-compatible chat server on loopback, for tests of the agent loop.

It speaks ``POST /v1/chat/completions`` and ``GET /v1/models`` over real HTTP, so the
unmodified ``openai`` client is what the tests exercise. The request's ``model`` picks a
script: a function of the request's messages returning the next assistant ``Reply`` (text,
tool calls, or an HTTP error). Scripts decide from the conversation alone (the turn is the
number of assistant messages so far), so concurrent episodes need no shared state.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str | dict  # a dict is sent as its JSON text; a str as it is (broken JSON too)


@dataclass(frozen=True)
class Reply:
    text: str = ""
    calls: tuple[Call, ...] = ()
    finish_reason: str = ""  # "" = tool_calls when there are calls, else stop
    status: int = 200  # anything else is sent as an OpenAI-style error body
    error: str = ""
    prompt_tokens: int | None = None  # None = characters / 4
    delay_s: float = 0.0


Script = Callable[[list[dict[str, Any]]], Reply]


def turn_of(messages: list[dict[str, Any]]) -> int:
    return sum(m.get("role") == "assistant" for m in messages)


def scripted(*replies: Reply, then: Reply = Reply("done")) -> Script:
    """The replies in order, one per turn, then ``then`` for ever."""

    def script(messages: list[dict[str, Any]]) -> Reply:
        turn = turn_of(messages)
        return replies[turn] if turn < len(replies) else then

    return script


def always(reply: Reply) -> Script:
    return lambda messages: reply


def reference_for(messages: list[dict[str, Any]]) -> str:
    """A correct model_new.py for the task in the user prompt's code block: its own Model as
    ModelNew (``evaluator.tasks.reference_solution``). Only lenient scoring passes it; strict
    scoring needs a compiled kernel, which takes minutes on CPU."""
    from opsynth.evaluator.tasks import reference_solution
    from opsynth.record import Task

    prompt = next(m["content"] for m in messages if m["role"] == "user")
    code = prompt.split("```python\n", 1)[1].split("\n```", 1)[0]
    return reference_solution(Task(ops=["t"], data_source="file", code=code + "\n")).model_new


# The bad-input modes the agent loop must survive.
UNKNOWN_TOOL = always(Reply(calls=(Call("teleport", {"to": "the answer"}),)))
BROKEN_JSON = always(Reply(calls=(Call("write", '{"path": "model_new.py", "content": '),)))
ENDLESS = always(Reply(calls=(Call("glob", {"pattern": "*"}),)))
HTTP_500 = always(Reply(status=500, error="the server had an error while processing"))
OVERFLOW = always(
    Reply(
        status=400,
        error="This model's maximum context length is 512 tokens. However, you requested "
        "9000 tokens. Please reduce the length of the messages.",
    )
)


@dataclass
class Seen:
    model: str
    body: dict[str, Any]
    at: float = field(default_factory=time.monotonic)


class ChatServer(ThreadingHTTPServer):
    """``with ChatServer({"model": script}) as chat:`` serves on ``chat.url`` (ends in /v1)."""

    daemon_threads = True

    def __init__(self, scripts: dict[str, Script]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.scripts = scripts
        self.url = f"http://127.0.0.1:{self.server_address[1]}/v1"
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    def __enter__(self) -> ChatServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()

    def requests_for(self, model: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s.body for s in self.seen if s.model == model]


class _Handler(BaseHTTPRequestHandler):
    server: ChatServer

    def log_message(self, *args: object) -> None:  # keep pytest output clean
        pass

    def do_GET(self) -> None:
        if self.path.rstrip("/") != "/v1/models":
            return self._error(404, f"no route {self.path}")
        models = [
            {"id": name, "object": "model", "owned_by": "tests"} for name in self.server.scripts
        ]
        self._json(200, {"object": "list", "data": models})

    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/v1/chat/completions":
            return self._error(404, f"no route {self.path}")
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            return self._error(400, "the body is not JSON")
        model = body.get("model", "")
        script = self.server.scripts.get(model)
        if script is None:
            return self._error(404, f"The model `{model}` does not exist.")
        with self.server.lock:
            self.server.seen.append(Seen(model, body))
        reply = script(body.get("messages") or [])
        if reply.delay_s:
            time.sleep(reply.delay_s)
        if reply.status != 200:
            return self._error(reply.status, reply.error or "scripted failure")
        self._json(200, completion(model, body, reply))

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        kind = "invalid_request_error" if status < 500 else "server_error"
        self._json(status, {"error": {"message": message, "type": kind, "code": None}})


def completion(model: str, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
    turn = turn_of(body.get("messages") or [])
    calls = [
        {
            "id": f"call_{turn}_{n}",
            "type": "function",
            "function": {
                "name": call.name,
                "arguments": call.arguments
                if isinstance(call.arguments, str)
                else json.dumps(call.arguments),
            },
        }
        for n, call in enumerate(reply.calls)
    ]
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if calls:
        message["tool_calls"] = calls
    prompt = reply.prompt_tokens
    if prompt is None:
        prompt = len(json.dumps(body.get("messages") or [])) // 4
    written = len(reply.text) + sum(len(c["function"]["arguments"]) for c in calls)
    return {
        "id": f"chatcmpl-{turn}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": reply.finish_reason or ("tool_calls" if calls else "stop"),
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": written // 4 + 1,
            "total_tokens": prompt + written // 4 + 1,
        },
    }
