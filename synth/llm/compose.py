"""The LLM composer: sample ops, ask the server for the fused task, keep or reject each reply.

Sampling is the offline composer's (``synth.sampling``, same mix and weights, transformers
seeds passed through as is); the plan of every request, including its sampling seed, is fixed
before any request is sent, so the same config asks the same questions whatever order the
replies come back in, and the reply cache can answer a resumed run. Requests run
``cfg.llm.concurrency`` at a time. Every candidate gets one ``compose`` verdict: ``ok``, a
transport reason (no usable answer) or a reply reason (an answer that is not a task for the
sampled ops); rejected candidates keep the raw reply as their code, for inspection only.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opsynth import synth
from opsynth.config import ComposeConfig
from opsynth.record import Task, Verdict, utc_now
from opsynth.synth.compose import standalone_task
from opsynth.synth.llm import prompts
from opsynth.synth.llm.cache import ReplyCache, request_key
from opsynth.synth.llm.client import ChatClient, Completion, LlmFailure, request_params
from opsynth.synth.llm.parse import Rejected, parse_reply
from opsynth.synth.sampling import TRANSFORMERS, Sampler, chain_length, split_seeds

COMPOSER = "llm"
STAGE = "compose"
# What a reply cut off by max_tokens looks like; reported as ``truncated`` instead.
CUT_SHORT = frozenset({"no_code", "syntax_error", "missing_symbol", "no_op_list"})


@dataclass(frozen=True)
class Request:
    source: str
    seeds: tuple[Task, ...]
    ops: tuple[str, ...]
    novel: bool
    messages: prompts.Messages
    params: dict[str, Any]
    key: str


@dataclass(frozen=True)
class Answer:
    completion: Completion | None = None
    failure: LlmFailure | None = None
    cached: bool = False
    elapsed_s: float = 0.0


def plan(
    seeds: Sequence[Task],
    cfg: ComposeConfig,
    n: int,
    round_index: int,
    produced: Iterable[Sequence[str]],
) -> list[Request | Task]:
    """n candidates to make: a Request per chain to ask for, a seed Task per transformers draw."""
    rng = random.Random(f"opsynth.compose-llm:{cfg.seed}:{round_index}")
    chainable, standalone = split_seeds(seeds)
    sampler = Sampler(chainable, standalone, cfg, rng, produced)
    planned: list[Request | Task] = []
    for source in sampler.sources(n):
        if source == TRANSFORMERS:
            seed = sampler.standalone_seed()
            if seed is not None:
                sampler.mark(seed.ops)
                planned.append(seed)
                continue
            source = sampler.fallback_source()
        picks, ops, novel = sampler.pick_novel(chain_length(source))
        sampler.mark(ops)
        chosen = tuple(chainable[i] for i in picks)
        messages = prompts.render(ops, [s.code for s in chosen])
        params = request_params(cfg.llm, rng.randrange(2**31))
        key = request_key(messages, cfg.llm.model, params)
        planned.append(Request(source, chosen, ops, novel, messages, params, key))
    return planned


def ask(request: Request, client: ChatClient, cache: ReplyCache, model: str) -> Answer:
    """The cached reply, else one from the server (stored before it is judged)."""
    start = time.perf_counter()
    stored = cache.get(request.key)
    if stored is not None:
        fields = {
            k: stored[k] for k in ("text", "finish_reason", "prompt_tokens", "completion_tokens")
        }
        return Answer(Completion(**fields), cached=True)
    try:
        completion = client.complete(request.messages, request.params)
    except LlmFailure as failure:
        return Answer(failure=failure, elapsed_s=time.perf_counter() - start)
    cache.put(request.key, {**completion.record(), "model": model, "created_at": utc_now()})
    return Answer(completion, elapsed_s=time.perf_counter() - start)


def judge(
    request: Request, answer: Answer, cfg: ComposeConfig, round_index: int, config_hash: str
) -> tuple[Task, Verdict]:
    """The candidate row and its compose verdict for one answered (or failed) request."""
    completion, failure = answer.completion, answer.failure
    measures: dict[str, Any] = {
        "model": cfg.llm.model,
        "cached": answer.cached,
        "request_key": request.key[:16],
    }
    meta: dict[str, Any] = {
        "model": cfg.llm.model,
        "prompt_hash": prompts.TEMPLATE_HASH,
        "request_key": request.key,
        "round": round_index,
        "novel_ops": request.novel,
    }
    reason, detail, code = "ok", "", ""
    if failure is not None:
        reason, detail = failure.reason, failure.detail
        measures["retries"] = failure.retries
        code = f"# no reply: {reason}\n# request {request.key}\n"
    else:
        assert completion is not None
        measures.update(
            prompt_tokens=completion.prompt_tokens,
            completion_tokens=completion.completion_tokens,
            retries=completion.retries,
            finish_reason=completion.finish_reason,
        )
        try:
            parsed = parse_reply(completion.text, request.ops)
        except Rejected as rejected:
            reason, detail = rejected.reason, rejected.detail
            if completion.finish_reason == "length" and reason in CUT_SHORT:
                reason, detail = "truncated", f"hit max_tokens={cfg.llm.max_tokens}: {detail}"
            code = completion.text or f"# empty reply\n# request {request.key}\n"
        except Exception as exc:  # a parser bug must not lose the candidate or the run
            reason, detail = "filter_error", f"{type(exc).__name__}: {exc}"
            code = completion.text
        else:
            code = parsed.code
            meta.update(adapters=parsed.extra_ops, reply_ops=parsed.ops)
    task = Task(
        ops=list(request.ops),
        data_source=request.source,
        code=code,
        seed_ids=[s.id for s in request.seeds],
        composer=COMPOSER,
        composer_version=synth.__version__,
        config_hash=config_hash,
        meta=meta,
    )
    verdict = Verdict(
        task_id=task.id,
        stage=STAGE,
        passed=reason == "ok",
        reason=reason,
        detail=detail[:2000],
        measures=measures,
        elapsed_s=round(answer.elapsed_s, 6),
    )
    return task, verdict


def compose_llm(
    seeds: Sequence[Task],
    cfg: ComposeConfig,
    n: int,
    *,
    cache_dir: Path,
    round_index: int = 0,
    config_hash: str = "",
    produced: Iterable[Sequence[str]] = (),
    client: ChatClient | None = None,
) -> list[tuple[Task, Verdict]]:
    """n candidates, each with its compose verdict, in plan order."""
    if not seeds:
        raise ValueError("compose needs at least one seed task")
    planned = plan(seeds, cfg, n, round_index, produced)
    requests = [p for p in planned if isinstance(p, Request)]
    cache = ReplyCache(cache_dir)
    client = client or (ChatClient(cfg.llm) if requests else None)
    with ThreadPoolExecutor(max_workers=cfg.llm.concurrency) as pool:
        answers = iter(list(pool.map(lambda r: ask(r, client, cache, cfg.llm.model), requests)))
    results = []
    for item in planned:
        if isinstance(item, Request):
            results.append(judge(item, next(answers), cfg, round_index, config_hash))
        else:
            meta = {"novel_ops": True, "round": round_index}
            task = standalone_task(item, COMPOSER, config_hash, meta)
            results.append((task, Verdict(task.id, STAGE, True, measures={"standalone": True})))
    return results
