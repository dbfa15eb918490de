"""The LLM composer against a scripted OpenAI-compatible server on loopback.

The server is stdlib ``http.server`` in a thread; each test scripts its answers exactly (429
then success, a hang, malformed JSON, fences, wrong op lists, 401, ...), so every reason code
and the retry, cache and concurrency behaviour are checked against real HTTP through the real
``openai`` client.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from opsynth.config import ComposeConfig, FiltersConfig, LlmConfig
from opsynth.filters.pool import WorkerPool
from opsynth.filters.static_check import StaticCheck
from opsynth.funnel import funnel_rows
from opsynth.record import Task
from opsynth.synth.composers import run_composer, summary
from opsynth.synth.llm import prompts
from opsynth.synth.llm.parse import Rejected, parse_reply

CACHE = Path(__file__).resolve().parent.parent / ".cache" / "test-compile"

GOOD_BODY = """\
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.features = features

    def forward(self, x):
{forward}
        return x

batch_size = 64
features = 256

def get_inputs():
    return [torch.randn(batch_size, features)]

def get_init_inputs():
    return [features]
"""

# forward lines that use any one sampled op, by name: enough for the composer's checks
FORWARD = {
    "nn.": "        x = nn.{name}(self.features)(x)",
    "F.": "        x = torch.nn.functional.{name}(x)",
    "torch.": "        x = torch.{name}(x)",
}

Reply = tuple[int, dict[str, str], bytes, float]  # status, headers, body, delay before answering
Script = Callable[[dict, int], Reply]


def sampled_ops(request: dict) -> list[str]:
    """The op list the prompt asks for, read back from its last line."""
    last = request["messages"][-1]["content"].strip().splitlines()[-1]
    return json.loads(last.removeprefix("OPS:").strip())


def good_code(ops: list[str]) -> str:
    lines = []
    for op in ops:
        prefix, name = op.split(".", 1)
        lines.append(FORWARD[prefix + "."].format(name=name))
    return GOOD_BODY.format(forward="\n".join(lines))


def completion(text: str, status: int = 200, delay: float = 0.0, finish: str = "stop") -> Reply:
    body = {
        "id": "cmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "scripted",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
            }
        ],
        "usage": {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150},
    }
    return status, {"Content-Type": "application/json"}, json.dumps(body).encode(), delay


def error(status: int, message: str, **headers: str) -> Reply:
    body = json.dumps({"error": {"message": message, "type": "scripted", "code": status}})
    return status, {"Content-Type": "application/json", **headers}, body.encode(), 0.0


def fenced(ops: list[str], code: str | None = None, listed: list[str] | None = None) -> Reply:
    code = good_code(ops) if code is None else code
    listed = ops if listed is None else listed
    return completion(f"Here it is.\n```python\n{code}```\nOPS: {json.dumps(listed)}\n")


class ScriptedServer:
    """``/v1/chat/completions`` answered by ``script(request_json, call_number)``."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.calls: list[dict] = []
        self.keys: list[str] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                request = json.loads(self.rfile.read(length))
                with outer.lock:
                    outer.calls.append(request)
                    outer.keys.append(self.headers.get("Authorization", ""))
                    number = len(outer.calls)
                status, headers, body, delay = outer.script(request, number)
                time.sleep(delay)
                try:
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the client gave up (timeout test)
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve():
    servers: list[ScriptedServer] = []

    def start(script: Script) -> ScriptedServer:
        servers.append(ScriptedServer(script))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def config(url: str, **llm: object) -> ComposeConfig:
    values: dict[str, object] = {
        "base_url": url,
        "model": "scripted",
        "api_key_env": "OPSYNTH_TEST_KEY",
        "max_retries": 2,
        "backoff_s": 0.01,
        "timeout_s": 5.0,
        "concurrency": 2,
        "max_tokens": 256,
    }
    values.update(llm)
    return ComposeConfig(composer="llm", mix={"torch#2": 1.0}, llm=LlmConfig(**values))


@pytest.fixture
def run(catalogue_seeds):
    """Compose from the session's catalogue seeds with a reply cache under ``tmp_path``."""

    def compose(cfg: ComposeConfig, tmp_path: Path, n: int = 1, **kwargs: object):
        return run_composer(catalogue_seeds, cfg, n, cache_dir=tmp_path / "cache", **kwargs)

    return compose


def reasons(result) -> list[str]:
    return [v.reason for v in result.verdicts]


def test_valid_fenced_reply_becomes_a_task_with_provenance(serve, tmp_path, run):
    server = serve(lambda req, n: fenced(sampled_ops(req)))
    result = run(config(server.url), tmp_path, n=3, config_hash="cafe")
    assert reasons(result) == ["ok"] * 3 and result.complete
    for task, verdict in zip(result.tasks, result.verdicts, strict=True):
        assert task.data_source == "torch#2" and len(task.ops) == 2
        assert task.composer == "llm" and task.config_hash == "cafe"
        assert task.code.startswith("import torch") and "```" not in task.code
        assert task.meta["model"] == "scripted"
        assert task.meta["prompt_hash"] == prompts.TEMPLATE_HASH
        assert task.meta["adapters"] == [] and task.meta["reply_ops"] == task.ops
        assert verdict.measures["prompt_tokens"] == 100 and not verdict.measures["cached"]
        assert StaticCheck().filter(task).keep
    assert len({tuple(t.ops) for t in result.tasks}) == 3
    stats = summary(result.verdicts)
    assert stats["prompt_tokens"] == 300 and stats["completion_tokens"] == 150
    request = server.calls[0]
    assert request["model"] == "scripted" and request["max_tokens"] == 256
    assert "KernelBench" in request["messages"][0]["content"]


def test_429_then_success_is_retried(serve, tmp_path, run):
    server = serve(
        lambda req, n: (
            error(429, "slow down", **{"Retry-After": "0"}) if n == 1 else fenced(sampled_ops(req))
        )
    )
    result = run(config(server.url), tmp_path)
    assert reasons(result) == ["ok"]
    assert result.verdicts[0].measures["retries"] == 1 and len(server.calls) == 2


def test_5xx_until_retries_are_spent(serve, tmp_path, run):
    server = serve(lambda req, n: error(503, "overloaded"))
    result = run(config(server.url, max_retries=2), tmp_path)
    assert reasons(result) == ["llm_server_error"] and not result.complete
    assert len(server.calls) == 3 and "503" in result.verdicts[0].detail


def test_timeout(serve, tmp_path, run):
    server = serve(lambda req, n: fenced(sampled_ops(req))[:3] + (3.0,))
    start = time.monotonic()
    result = run(config(server.url, timeout_s=0.3, max_retries=1), tmp_path)
    assert reasons(result) == ["llm_timeout"]
    assert len(server.calls) == 2 and time.monotonic() - start < 5


def test_malformed_json(serve, tmp_path, run):
    server = serve(lambda req, n: (200, {"Content-Type": "application/json"}, b"{not json", 0.0))
    result = run(config(server.url), tmp_path)
    assert reasons(result) == ["llm_bad_response"]


def test_reply_without_choices(serve, tmp_path, run):
    body = json.dumps({"id": "x", "object": "chat.completion", "choices": []}).encode()
    server = serve(lambda req, n: (200, {"Content-Type": "application/json"}, body, 0.0))
    assert reasons(run(config(server.url), tmp_path)) == ["llm_bad_response"]


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (lambda ops: completion(""), "empty_reply"),
        (lambda ops: completion("I cannot help with that."), "no_code"),
        (lambda ops: fenced(ops, code="class Model(nn.Module:\n    pass\n"), "syntax_error"),
        (lambda ops: fenced(ops, code="x = " + "(" * 5000 + "1" + ")" * 5000), "syntax_error"),
        (
            lambda ops: fenced(ops, code=good_code(ops).replace("def get_inputs", "def inputs")),
            "missing_symbol",
        ),
        (lambda ops: fenced(ops, listed=[ops[0]]), "op_list_mismatch"),
        (lambda ops: fenced(ops, listed=["torch.nope", *ops[1:]]), "op_list_mismatch"),
        (lambda ops: completion(f"```python\n{good_code(ops)}```\n"), "no_op_list"),
        (lambda ops: fenced(ops, code=good_code(ops[:1])), "op_unused"),
        (
            lambda ops: completion(f"```python\n{good_code(ops)[:150]}", finish="length"),
            "truncated",
        ),
    ],
)
def test_bad_replies_get_a_reason(serve, tmp_path, reply, reason, run):
    server = serve(lambda req, n: reply(sampled_ops(req)))
    result = run(config(server.url), tmp_path)
    assert reasons(result) == [reason] and result.complete
    assert result.kept() == [] and len(result.tasks) == 1
    rows = funnel_rows(result.verdicts)
    assert rows == [{"stage": "compose", "entered": 1, "passed": 0, "reasons": {reason: 1}}]


def test_bad_key_fails_fast_and_names_the_variable(serve, tmp_path, monkeypatch, run):
    monkeypatch.delenv("OPSYNTH_TEST_KEY", raising=False)
    server = serve(lambda req, n: error(401, "invalid api key"))
    result = run(config(server.url, concurrency=1), tmp_path, n=4)
    assert reasons(result) == ["llm_auth_failed"] * 4
    assert len(server.calls) == 1, "after one refusal the rest are not sent"
    assert "$OPSYNTH_TEST_KEY is unset" in result.verdicts[0].detail
    assert "not sent" in result.verdicts[1].detail


def test_key_comes_from_the_named_variable(serve, tmp_path, monkeypatch, run):
    monkeypatch.setenv("OPSYNTH_TEST_KEY", "sk-test-123")
    server = serve(lambda req, n: fenced(sampled_ops(req)))
    run(config(server.url), tmp_path)
    assert server.keys == ["Bearer sk-test-123"]


def test_unreachable_server(tmp_path, run):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends: nothing listens there
    result = run(config(f"http://127.0.0.1:{port}/v1", max_retries=1), tmp_path, n=3)
    assert reasons(result) == ["llm_unreachable"] * 3 and not result.complete
    assert all(t.code.startswith("# no reply: llm_unreachable") for t in result.tasks)
    assert len({t.id for t in result.tasks}) == 3


def test_cache_answers_a_rerun_without_a_request(serve, tmp_path, run):
    server = serve(lambda req, n: fenced(sampled_ops(req)))
    cfg = config(server.url)
    first = run(cfg, tmp_path, n=4)
    assert len(server.calls) == 4
    again = run(cfg, tmp_path, n=4)
    assert len(server.calls) == 4, "every reply came from the cache"
    assert [t.id for t in again.tasks] == [t.id for t in first.tasks]
    assert all(v.measures["cached"] for v in again.verdicts)
    assert summary(again.verdicts)["cache_hits"] == 4
    other = run(cfg.model_copy(update={"seed": 1}), tmp_path, n=1)
    assert len(server.calls) == 5 and other.tasks[0].id not in {t.id for t in first.tasks}


def test_failed_requests_are_not_cached(serve, tmp_path, run):
    state = {"up": False}
    server = serve(lambda req, n: fenced(sampled_ops(req)) if state["up"] else error(500, "down"))
    cfg = config(server.url, max_retries=0)
    assert reasons(run(cfg, tmp_path, n=2)) == ["llm_server_error"] * 2
    state["up"] = True
    assert reasons(run(cfg, tmp_path, n=2)) == ["ok", "ok"]


def test_requests_run_concurrently_and_results_keep_plan_order(serve, tmp_path, run):
    active, peak = [0], [0]
    lock = threading.Lock()

    def slow(req, n):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.2)
        with lock:
            active[0] -= 1
        return fenced(sampled_ops(req))

    server = serve(slow)
    result = run(config(server.url, concurrency=3), tmp_path, n=6)
    assert peak[0] == 3 and reasons(result) == ["ok"] * 6
    asked = [tuple(sampled_ops(c)) for c in server.calls]
    assert sorted(asked) == sorted(tuple(t.ops) for t in result.tasks)
    serial = run(config(server.url, concurrency=1), tmp_path / "serial", n=6)
    assert [t.id for t in serial.tasks] == [t.id for t in result.tasks]


def test_produced_op_sequences_are_not_asked_again(serve, tmp_path, run):
    server = serve(lambda req, n: fenced(sampled_ops(req)))
    first = run(config(server.url), tmp_path, n=5)
    later = run(config(server.url), tmp_path, n=5, produced=[t.ops for t in first.tasks])
    assert not {tuple(t.ops) for t in first.tasks} & {tuple(t.ops) for t in later.tasks}


def test_hostile_replies_parse_and_are_left_to_the_filters(serve, tmp_path, run):
    """The composer never runs a reply: ``import os`` and an endless loop are valid answers
    here; the static check and the sandbox reject them downstream."""

    def script(req, n):
        ops = sampled_ops(req)
        code = good_code(ops)
        if n == 1:
            code = "import os\n" + code
        else:
            loop = "    def forward(self, x):\n        while True:\n            pass\n"
            code = code.replace("    def forward(self, x):\n", loop)
        return fenced(ops, code=code)

    server = serve(script)
    result = run(config(server.url, concurrency=1), tmp_path, n=2)
    assert reasons(result) == ["ok", "ok"]
    importing, looping = result.tasks
    decision = StaticCheck().filter(importing)
    assert not decision.keep and decision.reason == "forbidden_import"
    assert StaticCheck().filter(looping).keep and "while True" in looping.code
    cfg = FiltersConfig(workers=1, task_timeout_s=3.0, grace_s=5.0, cache_dir=str(CACHE))
    with WorkerPool(cfg, "cpu") as pool:
        rows = pool.evaluate([looping])[looping.id]
    assert (rows[-1].stage, rows[-1].reason) == ("eager", "timeout")


def test_transformers_seeds_pass_through_without_a_request(serve, tmp_path, catalogue_seeds):
    server = serve(lambda req, n: fenced(sampled_ops(req)))
    block = Task(
        ops=["LlamaMLP"],
        data_source="transformers",
        code="# a transformers block\n",
        meta={"seed": {"library": "transformers", "name": "LlamaMLP"}},
    )
    cfg = config(server.url).model_copy(update={"mix": {"transformers": 1.0, "torch#2": 1e-9}})
    result = run_composer([*catalogue_seeds, block], cfg, 2, cache_dir=tmp_path)
    assert result.tasks[0].id == block.id and result.tasks[0].composer == "llm"
    assert result.tasks[1].data_source == "torch#2", "used up: a chain instead"
    assert len(server.calls) == 1
    only = cfg.model_copy(update={"mix": {"transformers": 1.0}})
    with pytest.raises(RuntimeError, match="every transformers seed is used"):
        run_composer([*catalogue_seeds, block], only, 2, cache_dir=tmp_path)


def test_parse_is_lenient_about_form_not_content():
    ops = ["nn.Linear", "torch.sum"]
    code = GOOD_BODY.format(
        forward="        x = torch.nn.Linear(self.features, 8)(x)\n        x = x.sum(dim=1)"
    )
    parsed = parse_reply(f"```py\n{code}```\n**OPS:** {json.dumps(ops[::-1])}", ops)
    assert parsed.ops == ops[::-1] and parsed.extra_ops == []
    unfenced = parse_reply(f"{code}\nOPS: {json.dumps(ops)}", ops)
    assert unfenced.code.strip().endswith("return [features]")
    wrapped = code.replace(
        "x = x.sum(dim=1)",
        "x = nn.Conv1d(1, 1, 1)(x.unsqueeze(1)).squeeze(1)\n        x = x.sum(1)",
    )
    assert parse_reply(f"```python\n{wrapped}```\nOPS: {json.dumps(ops)}", ops).extra_ops == [
        "torch.nn.Conv1d"
    ]
    with pytest.raises(Rejected) as err:
        parse_reply("```python\nclass Model: pass\n```\nOPS: not json", ops)
    assert err.value.reason == "missing_symbol"
