"""Shared test set-up: a private catalogue cache for the session, one small set of real
catalogue seeds (every operator kind the composer handles) extracted once per session, one
sandboxed CPU worker pool, and one Prefect server that the CLI runs a test starts can share."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

# Operators the composer tests draw from: modules and functions, multi-input ops, an index
# and a mask input, tuple outputs, a loss with a target, padding, interpolation, attention.
TEST_OPERATORS = [
    "nn.Linear",
    "nn.Conv2d",
    "nn.ConvTranspose1d",
    "nn.BatchNorm2d",
    "nn.LayerNorm",
    "nn.LSTM",
    "nn.MaxPool2d",
    "nn.MultiheadAttention",
    "nn.MSELoss",
    "nn.Embedding",
    "F.gelu",
    "nn.Dropout",
    "F.softmax",
    "F.pad",
    "F.interpolate",
    "torch.relu",
    "torch.tanh",
    "torch.sum",
    "torch.cumsum",
    "torch.topk",
    "torch.max",
    "torch.add",
    "torch.cat",
    "torch.where",
    "torch.gather",
    "torch.bmm",
    "torch.transpose",
    "torch.exp",
]


def pytest_configure(config: pytest.Config) -> None:
    if "OPSYNTH_CACHE" not in os.environ:
        os.environ["OPSYNTH_CACHE"] = tempfile.mkdtemp(prefix="opsynth-test-cache-")


@pytest.fixture(scope="session")
def catalogue_seeds():
    from opsynth.synth.catalog.extract import seeds_in_process

    return seeds_in_process(TEST_OPERATORS)


# The compile cache's trusted layer the sandboxed tests share (built once per checkout).
TEST_COMPILE_CACHE = Path(__file__).resolve().parent.parent / ".cache" / "test-compile"


@pytest.fixture(scope="session")
def cpu_pool() -> Iterator[object]:
    """One sandboxed CPU pool (two workers, a 600 s wall clock per job) for the tests that
    only need a pool to run on, not one configured their own way: each pool's start costs
    seconds on two cores."""
    from opsynth.config import FiltersConfig
    from opsynth.filters.pool import WorkerPool

    cfg = FiltersConfig(workers=2, cache_dir=str(TEST_COMPILE_CACHE), task_timeout_s=600.0)
    with WorkerPool(cfg, "cpu") as pool:
        yield pool


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The environment that points an ``opsynth`` CLI run at one Prefect server (``prefect
    server start``, offline, its database in a temp dir) shared by the session. Without it,
    each run starts Prefect's temporary server with a fresh database of its own: seconds of
    start-up per run on two cores. Tests of that start-up path leave this fixture out."""
    from opsynth.flows.prefect_env import OFFLINE_DEFAULTS

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    home = tmp_path_factory.mktemp("prefect-server")
    env = {**os.environ, **OFFLINE_DEFAULTS, "PREFECT_HOME": str(home)}
    env.pop("PREFECT_API_URL", None)
    prefect = Path(sys.executable).with_name("prefect")
    args = ["server", "start", "--host", "127.0.0.1", "--port", str(port), "--no-services"]
    with open(home / "server.log", "wb") as log:
        server = subprocess.Popen([str(prefect), *args], env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None, (home / "server.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the Prefect server did not start in 180 s"
            time.sleep(0.25)
        yield {"PREFECT_API_URL": url}
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
