"""The wheel, as a user installs it: built from the checkout, installed into a fresh virtual
environment, run from a folder outside the checkout. It installs one import name (opsynth),
carries the committed data (the KernelBench index, the profiles), and ``decontam`` and a
2-candidate CPU ``run`` work from it.

The fresh environment gets the wheel alone (``--no-deps``); the dependencies it needs are
made visible through a ``.pth`` line naming this interpreter's site-packages, where they are
installed already (downloading torch again would prove nothing about the wheel). A ``.pth``
line adds a folder, not the install hooks inside it, so the checkout's editable install does
not come along: every ``opsynth`` module must come from the wheel, which the test checks.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from runfactory import make_task
from test_regenerate_e2e import TINY as REGENERATE_TINY

from opsynth.store import write_tasks

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
# the end-to-end tests' small config, two tasks
TINY = REGENERATE_TINY.replace("target = 3\n", "target = 2\n", 1)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel, the fresh environment's bin folder)."""
    base = tmp_path_factory.mktemp("wheel")
    # built from a copy: setuptools writes build/ and *.egg-info into the folder it builds
    source = base / "source"
    skip = shutil.ignore_patterns(".*", "runs", "build", "dist", "*.egg-info", "__pycache__")
    shutil.copytree(ROOT, source, ignore=skip)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(base / "dist"), str(source)],
        capture_output=True,
        text=True,
        cwd=base,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = (base / "dist").glob("opsynth-*.whl")
    env = base / "env"
    venv.EnvBuilder(with_pip=True).create(env)
    python = env / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "opsynth-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        cwd=base,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return wheel, env / "bin"


def run(bin_dir: Path, *args: str, cwd: Path, timeout: float = 900):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(
        [str(bin_dir / args[0]), *args[1:]],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**env, "PYTHONUNBUFFERED": "1"},
        timeout=timeout,
    )


def test_the_wheel_installs_one_import_name_and_its_data(installed) -> None:
    wheel, bin_dir = installed
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    tops = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert tops == {"opsynth"}, tops
    assert "opsynth/data/kernelbench_index.json.gz" in names
    assert "opsynth/data/profiles/ops6k.json" in names
    assert "opsynth/synth/llm/prompts/system.md" in names
    probe = (
        "import json, opsynth, opsynth.filters.worker, opsynth.flows.cli, opsynth.trainer;"
        "from opsynth.ast_dedup.index import DEFAULT_INDEX_PATH as i;"
        "from opsynth.profile import SHIPPED as p;"
        "print(json.dumps([opsynth.filters.worker.__file__, opsynth.flows.cli.__file__,"
        " str(i), i.is_file(), p['ops6k'].is_file()]))"
    )
    proc = run(bin_dir, "python", "-c", probe, cwd=wheel.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    worker, cli, index, has_index, has_profile = json.loads(proc.stdout)
    for path in (worker, cli, index):
        assert str(bin_dir.parent) in path and str(ROOT) not in path, path
    assert has_index and has_profile
    for bare in ("flows", "filters", "evaluator"):
        missing = run(bin_dir, "python", "-c", f"import {bare}", cwd=wheel.parent)
        assert missing.returncode != 0, f"{bare} is importable from the wheel's environment"


def test_decontam_and_a_small_run_work_from_the_wheel(installed, tmp_path) -> None:
    _, bin_dir = installed
    tasks = tmp_path / "tasks.parquet"
    write_tasks([make_task(random.Random(0), 0, audit=True)], tasks)
    proc = run(bin_dir, "opsynth", "decontam", "--input", str(tasks), "--out", "d", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [verdict] = pq.read_table(tmp_path / "d" / "verdicts.parquet").to_pylist()
    # the committed index was found in the wheel: the row names its nearest KernelBench problem
    assert verdict["reason"] in ("ok", "kernelbench_similar"), verdict
    assert json.loads(verdict["measures"])["kb_nearest_name"]

    config = tmp_path / "tiny.toml"
    config.write_text(TINY)
    proc = run(bin_dir, "opsynth", "run", "--out", "r", "--config", str(config), cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    run_info = json.loads((tmp_path / "r" / "run.json").read_text())
    assert run_info, "run.json is written"
    accepted = pq.read_table(tmp_path / "r" / "accepted.parquet").num_rows
    assert accepted >= 1, proc.stdout[-2000:]
