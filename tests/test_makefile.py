"""The set-up commands: what ``make`` would do, read with ``make -n`` (nothing installs)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def plan(venv: Path, spec: str) -> str:
    done = subprocess.run(
        ["make", "-n", f"VENV={venv}", f"TORCH_SPEC={spec}", "run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def test_a_changed_torch_spec_reinstalls_torch_on_an_existing_venv(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    assert 'pip install -q "torch==1.0"' in plan(venv, "torch==1.0")
    # the install as `make` leaves it: the stamp newer than everything it depends on
    earlier = time.time() - 60
    os.utime(venv / ".opsynth-torch-spec", (earlier, earlier))
    (venv / ".opsynth-installed").touch()
    assert "pip install" not in plan(venv, "torch==1.0"), "an unchanged spec installs nothing"
    assert 'pip install -q "torch==2.0"' in plan(venv, "torch==2.0")
