"""One warm ``WorkerPool`` per process, for the Dask workers of a scale-out run.

An engine worker runs many filter shards over its life; starting a pool per shard would pay
the sandboxed workers' torch import every time, so the pool is kept and reused while the
settings stay the same. Every pool call runs on one dedicated, never-exiting thread because
bwrap's ``--die-with-parent`` ties the sandboxed workers to the thread that started them, and
an engine's task threads may come and go. ``OPSYNTH_CPUS`` (a core list, e.g. ``0-7``) pins
that thread, so the pool sizes itself from its share of the host and its workers inherit it.

Shards overlap: an engine worker running two shard tasks at once (a local Dask worker's
``runner.shards_per_worker`` threads) queues the second shard on the pool while the first is
still running, so the pool's driver hands its candidates to the workers the first shard's
slowest candidates leave idle. One shard at a time, every shard ended with workers idling
through its tail (16-candidate shards on 16 workers: 1.44x on 2 GPUs where the whole set
at once on each would be nearly 2x).
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from opsynth.config import FiltersConfig
from opsynth.filters.pool import MEASURE_OVERRIDES, WorkerPool
from opsynth.record import Task, Verdict

CPUS_ENV = "OPSYNTH_CPUS"
# The filters config and device (JSON) a local Dask worker starts its pool with (dask_setup).
WARM_ENV = "OPSYNTH_WARM_POOL"

_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="opsynth-pool")
_state: dict[str, Any] = {"key": None, "pool": None, "outstanding": 0}
_lock = threading.Lock()
# Notified when a shard is collected: a shard with other settings waits for the pool to be idle.
_collected = threading.Condition(_lock)


def parse_cpus(text: str) -> set[int]:
    """``"0-3,8"`` -> {0, 1, 2, 3, 8}: the cpu-list format of taskset and /proc."""
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def format_cpus(cpus: list[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def _env_gpus() -> list[str] | None:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None or not env.strip():
        return None
    return [x.strip() for x in env.split(",") if x.strip()]


def warm_spec(cfg: FiltersConfig, device: str) -> str:
    """The value of ``WARM_ENV`` that makes a worker process start the pool a shard with these
    settings will ask for."""
    return json.dumps({"filters": cfg.model_dump(mode="json"), "device": device})


def dask_setup(worker: Any = None) -> tuple[FiltersConfig, str] | None:
    """Dask's preload hook: start this process's pool as the worker starts, in the background,
    so it is warm when the first shard arrives instead of starting then (a pool's sandboxed
    workers take tens of seconds to import torch). Reads ``WARM_ENV``; without it, nothing.
    A pool that fails to start here is started again, and its error raised, by the first
    shard. Returns the settings it started the pool for."""
    spec = os.environ.get(WARM_ENV)
    if not spec:
        return None
    data = json.loads(spec)
    cfg, device = FiltersConfig.model_validate(data["filters"]), str(data["device"])
    _thread.submit(_pool_for, cfg, device)
    return cfg, device


def _pool_for(cfg: FiltersConfig, device: str) -> WorkerPool:
    """The process's pool for these settings (and this engine-assigned GPU set); a change
    closes the old pool first. Runs on the pool thread only."""
    gpus = _env_gpus()
    key = _key(cfg, device)
    if _state["key"] != key:
        _close()
        cpus = os.environ.get(CPUS_ENV, "").strip()
        if cpus:
            os.sched_setaffinity(0, parse_cpus(cpus))  # this thread; its children inherit it
        pool = WorkerPool(cfg, device, gpus=gpus)
        pool.start()
        _state.update(key=key, pool=pool)
    return _state["pool"]


def _key(cfg: FiltersConfig, device: str) -> str:
    return json.dumps([cfg.model_dump(mode="json"), device, _env_gpus()], sort_keys=True)


def _close() -> None:
    pool = _state["pool"]
    _state.update(key=None, pool=None)
    if pool is not None:
        pool.close()


def evaluate(
    cfg: FiltersConfig,
    device: str,
    tasks: list[Task],
    overrides: dict[str, Any] | None = None,
) -> dict[str, list[Verdict]]:
    """``WorkerPool.evaluate`` on this process's warm pool (with ``overrides`` of the check
    settings, as ``WorkerPool.submit`` takes them). Any number of threads may call this at
    once: each shard is queued on the pool at once (``WorkerPool.submit``, any thread) and
    collected on the pool thread (``WorkerPool.wait``), whose driving also starts the shards
    queued behind it. A shard with other settings waits until the pool is idle."""
    key = _key(cfg, device)
    with _collected:
        while _state["outstanding"] and _state["key"] != key:
            _collected.wait()
        # the pool thread may be busy collecting another shard: reuse the pool without it
        pool = _state["pool"] if _state["key"] == key else None
        if pool is None:
            pool = _thread.submit(_pool_for, cfg, device).result()
        ticket = pool.submit(tasks, None, overrides)
        _state["outstanding"] += 1
    try:
        return _thread.submit(pool.wait, ticket).result()
    finally:
        with _collected:
            _state["outstanding"] -= 1
            _collected.notify_all()


def measure(
    cfg: FiltersConfig, device: str, tasks: list[Task], overrides: dict[str, Any] | None = None
) -> dict[str, list[Verdict]]:
    """``WorkerPool.measure`` (sizing probes) on this process's warm pool."""
    return evaluate(cfg, device, tasks, overrides or MEASURE_OVERRIDES)


def stats() -> dict[str, Any]:
    """The current pool's stats (waiting for a pool start in progress); {} without a pool."""
    _thread.submit(lambda: None).result()
    pool = _state["pool"]
    return dict(pool.stats) if pool is not None else {}


def engine_stats() -> dict[str, Any]:
    """``stats`` with which engine worker (host and process) and GPUs they are: a shard's
    result carries them back, so the orchestrator knows every pool of a run."""
    return {
        **stats(),
        "engine": f"{socket.gethostname()}:{os.getpid()}",
        "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
    }


def shutdown() -> None:
    """Close the pool (its sandboxed workers exit); the next ``evaluate`` starts a new one."""
    with _lock:
        _thread.submit(_close).result()


# At exit the pool thread is already joined; closing kills processes, which any thread can.
atexit.register(_close)
