"""The LLM composer against a real OpenAI-compatible server: llama.cpp with a tiny model.

``python -m llama_cpp.server`` serves Gemma 3 270M (a GGUF shipped inside PyPI packages,
installed by ``make test``) on loopback. The model writes poor code; what matters is that
every reply becomes a valid task or a rejection with a reply reason, never a crash or a
transport failure, and that a second run is answered from the reply cache. Few, short
completions keep it to well under a minute on two cores.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest
from llamaserver import MODEL, serve

from opsynth.config import ComposeConfig, LlmConfig
from opsynth.funnel import funnel_rows
from opsynth.synth.composers import run_composer, summary
from opsynth.synth.llm.reasons import REPLY

N = 3


@pytest.fixture(scope="module")
def llama_url(tmp_path_factory):
    yield from serve(tmp_path_factory.mktemp("llama"), chat_format="gemma")


def test_tiny_model_replies_become_tasks_or_reasoned_rejections(
    llama_url, tmp_path, catalogue_seeds
):
    seeds = catalogue_seeds
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
