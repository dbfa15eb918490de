"""Prefect task runners for scaling the filter shards out (``[runner]``, ``--runner``).

``local`` needs nothing: the flow keeps one in-process pool. ``dask`` (prefect-dask) connects
to ``runner.address`` or starts a local cluster with one worker per GPU set, each seeing only
its GPUs (``CUDA_VISIBLE_DEVICES``) and an equal share of the cores (``OPSYNTH_CPUS``, see
``filters.process_pool``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from opsynth.config import FiltersConfig, RunnerConfig
from opsynth.filters.process_pool import CPUS_ENV, WARM_ENV, format_cpus, warm_spec


class RunnerError(RuntimeError):
    """The requested runner cannot be used here (a missing package); one line for the user."""


def plan_workers(
    runner: RunnerConfig, device: str, cores: list[int], gpus: list[str]
) -> list[dict[str, str]]:
    """The environment of each worker of a local cluster: disjoint core sets and, on cuda,
    disjoint GPU sets of ``gpus_per_worker``. Pure."""
    per = runner.gpus_per_worker
    if device == "cuda" and gpus:
        count = runner.workers or max(1, len(gpus) // per)
    else:
        count = runner.workers or 2
    count = max(1, min(count, len(cores)))
    share = len(cores) // count
    plans = []
    for i in range(count):
        env = {CPUS_ENV: format_cpus(cores[i * share : (i + 1) * share])}
        if device == "cuda" and gpus:
            chosen = [gpus[(i * per + j) % len(gpus)] for j in range(per)]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(chosen)
        plans.append(env)
    return plans


def local_dask_cluster(plans: list[dict[str, str]], threads: int = 1, **kwargs: Any):
    """A Dask cluster on this host with one worker process per plan, each with that plan's
    environment and ``threads`` task threads (prefect-dask calls this as its
    ``cluster_class``). The threads run shards side by side on the worker's one warm pool
    (``filters.process_pool``). Two task threads once failed with "Server process did not
    start" when each worker started a temporary Prefect server of its own; the workers now
    share the orchestrator's (``share_prefect_server``)."""
    from distributed import Nanny, Scheduler, SpecCluster

    local = {"host": "127.0.0.1", "dashboard": False}
    scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard": False}}
    options = {**local, "nthreads": threads, "preload": ["opsynth.filters.process_pool"]}
    workers = {
        f"opsynth-{i}": {"cls": Nanny, "options": {**options, "env": env}}
        for i, env in enumerate(plans)
    }
    return SpecCluster(workers=workers, scheduler=scheduler, **kwargs)


def task_runner(runner: RunnerConfig, device: str, filters: FiltersConfig | None = None):
    """The flow's task runner for ``runner.kind``; None for local (Prefect's default). With
    ``filters``, the workers of a local Dask cluster start their pools for those settings as
    they start (``process_pool.dask_setup``), while the orchestrator is still prefiltering."""
    if runner.kind == "local":
        return None
    dask_runner = _runner_class("prefect_dask", "DaskTaskRunner", "dask")
    if runner.address:
        return dask_runner(address=runner.address)
    plans = plan_workers(runner, device, sorted(os.sched_getaffinity(0)), _gpus(device))
    if filters is not None:
        plans = [{**env, WARM_ENV: warm_spec(filters, device)} for env in plans]
    share_prefect_server()
    cluster = {"plans": plans, "threads": runner.shards_per_worker}
    return dask_runner(cluster_class=local_dask_cluster, cluster_kwargs=cluster)


def share_prefect_server() -> None:
    """Start Prefect's temporary server now and hand its URL to the local cluster's workers.
    They are new processes: without an API URL each starts a temporary server of its own on
    its first task (seconds each, several servers on one SQLite file). Nothing to do when the
    user set ``PREFECT_API_URL`` or turned the temporary server off. This process keeps using
    the same server: Prefect keeps one temporary server per process."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    server.start()
    os.environ["PREFECT_API_URL"] = server.api_url


def _runner_class(module: str, name: str, kind: str):
    import importlib

    package = module.replace("_", "-")
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise RunnerError(
            f"--runner {kind} needs {package} ({exc}); pip install {package} (the {kind} extra)"
        ) from exc


class LocalOnly:
    """A callable flow parameter (the CLI's progress bar) that stays in the orchestrator.
    Prefect sends the flow run's parameters with every task it submits to Dask, and a
    progress bar holds locks that cannot be pickled; this pickles as a no-op instead, which is
    all a remote task needs, since only the orchestrator reports progress."""

    def __init__(self, fn: Callable[..., None]) -> None:
        self.fn = fn

    def __call__(self, *args: Any) -> None:
        self.fn(*args)

    def __reduce__(self):
        return (LocalOnly, (_ignore,))


def _ignore(*args: Any) -> None:
    return None


def _gpus(device: str) -> list[str]:
    if device != "cuda":
        return []
    from opsynth.filters.pool import visible_gpus

    return visible_gpus()
