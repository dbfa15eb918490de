"""Chunked process-parallel map with per-worker state, or a plain loop when that is cheaper.

Scoring is pure Python (GIL-bound), so threads do not help; processes do. Workers are started
with ``forkserver`` where available: forking the orchestrator itself is unsafe once it runs
threads (Prefect does), and ``forkserver`` still avoids a full interpreter start per worker.
Each worker builds its state once (e.g. the interned KernelBench index) from picklable
arguments and keeps it for all its chunks.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_STATE: Any = None


def resolve_workers(workers: int) -> int:
    """``0`` means one worker per available core."""
    if workers > 0:
        return workers
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _init(factory: Callable[..., Any], args: tuple) -> None:
    global _STATE
    _STATE = factory(*args)
    gc.freeze()  # the state lives as long as the worker: keep it out of every collection


def _run(payload: tuple[Callable[[Any, Sequence[Any]], list[Any]], Sequence[Any]]) -> list[Any]:
    fn, chunk = payload
    with paused_gc():
        return fn(_STATE, chunk)


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector.

    Batch work allocates millions of short-lived objects (AST nodes, verdicts, LSH buckets),
    and each allocation burst triggers a collection that walks every long-lived object (interned
    trees, memos, the tasks themselves): measured, that doubled the cost of parsing. Nothing
    here creates reference cycles, so reference counting frees it all; the collector resumes
    afterwards."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def map_chunks(
    factory: Callable[..., Any],
    args: tuple,
    fn: Callable[[Any, Sequence[T]], list[R]],
    items: Sequence[T],
    *,
    workers: int = 1,
    chunk_size: int = 256,
    min_parallel: int = 2000,
) -> list[R]:
    """``fn(state, chunk)`` over consecutive chunks of ``items``, results in input order.

    ``factory(*args)`` builds the state, once per worker. ``factory`` and ``fn`` must be
    module-level functions so that workers can import them. Fewer than ``min_parallel`` items
    run in this process, where starting workers would cost more than it saves."""
    workers = resolve_workers(workers)
    chunks = [items[i : i + chunk_size] for i in range(0, len(items), chunk_size)]
    out: list[R] = []
    if workers <= 1 or len(items) < min_parallel or len(chunks) < 2:
        state = factory(*args)
        with paused_gc():
            for chunk in chunks:
                out.extend(fn(state, chunk))
        return out
    methods = mp.get_all_start_methods()
    ctx = mp.get_context("forkserver" if "forkserver" in methods else "spawn")
    pool = ctx.Pool(min(workers, len(chunks)), initializer=_init, initargs=(factory, args))
    with pool, paused_gc():
        for result in pool.imap(_run, [(fn, chunk) for chunk in chunks]):
            out.extend(result)
    return out
