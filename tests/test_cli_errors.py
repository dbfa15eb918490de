"""Bad input gets one line naming the problem and the fix, exit code 2, and loses nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def opsynth(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "opsynth.flows.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error:")
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_unknown_device(tmp_path):
    proc = opsynth("run", "--out", str(tmp_path / "r"), "--device", "tpu", cwd=tmp_path)
    assert_one_line_error(proc, "unknown device 'tpu'", "auto, cpu, cuda")


def test_malformed_config(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[filters]\ntimed_runs = 'many'\n")
    proc = opsynth("run", "--out", str(tmp_path / "r"), "--config", str(cfg), cwd=tmp_path)
    assert_one_line_error(proc, "filters.timed_runs", "default.toml")


def test_missing_config(tmp_path):
    proc = opsynth("run", "--config", str(tmp_path / "none.toml"), cwd=tmp_path)
    assert_one_line_error(proc, "does not exist")


def test_out_is_a_file(tmp_path):
    target = tmp_path / "file"
    target.write_text("precious")
    proc = opsynth("run", "--out", str(target), cwd=tmp_path)
    assert_one_line_error(proc, "is a file")
    assert target.read_text() == "precious"


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_unwritable_out(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    proc = opsynth("run", "--out", str(locked / "run"), cwd=tmp_path)
    assert_one_line_error(proc, "writable")


def test_unwritable_out_under_read_only_path(tmp_path):
    # /proc is read-only for everyone, root included
    proc = opsynth("run", "--out", "/proc/opsynth-run", cwd=tmp_path)
    assert_one_line_error(proc, "/proc/opsynth-run")


def test_status_of_missing_dir(tmp_path):
    proc = opsynth("status", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert_one_line_error(proc, "not an opsynth run directory")


def test_bad_target(tmp_path):
    proc = opsynth("run", "--out", str(tmp_path / "r"), "--target", "0", cwd=tmp_path)
    assert_one_line_error(proc, "--target")


def test_corrupt_work_file_is_named_and_kept(tmp_path):
    run = tmp_path / "run"
    (run / "work").mkdir(parents=True)
    (run / "run.json").write_text('{"status": "running"}')
    corrupt = run / "work" / "filter-0123456789abcdef.parquet"
    corrupt.write_bytes(b"PAR1 this is not parquet")
    proc = opsynth("status", str(run), cwd=tmp_path)
    assert_one_line_error(proc, corrupt.name, "delete it")
    assert corrupt.read_bytes() == b"PAR1 this is not parquet"


def test_cuda_on_a_cluster_at_an_address_needs_no_gpu_here() -> None:
    """A cluster at an address has the GPUs, and sizing and filtering run there, so the
    orchestrator needs none; the local pool or a local cluster runs here, and does."""
    torch = pytest.importorskip("torch")
    from opsynth.config import RunnerConfig
    from opsynth.flows.cli_common import UserError, resolve_device

    remote = RunnerConfig(kind="dask", address="tcp://scheduler:8786")
    assert resolve_device("cuda", remote) == "cuda"
    assert resolve_device("cpu", remote) == "cpu"
    if not torch.cuda.is_available():
        for runner in (None, RunnerConfig(), RunnerConfig(kind="dask")):
            with pytest.raises(UserError, match="no CUDA device"):
                resolve_device("cuda", runner)
