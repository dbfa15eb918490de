"""``opsynth publish`` against a Hub-compatible server on loopback (tests/hubserver.py), with
the real, unmodified ``huggingface_hub`` and ``datasets`` clients in subprocesses (both read
HF_ENDPOINT when imported): versions round-trip through ``datasets.load_dataset``, a version
is immutable, and every bad input is one line with exit code 2.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hubserver import HubServer, client_env
from runfactory import make_run

TOKEN = "hf_test_secret_token_0123456789"
REPO = "org/kernels"
ROOT = Path(__file__).resolve().parents[1]

LOAD = """
import json, sys
import datasets
repo, config, revision = sys.argv[1], sys.argv[2], sys.argv[3]
rows = datasets.load_dataset(repo, config, split="train", revision=revision)
print(json.dumps({"columns": rows.column_names, "rows": rows.to_list(),
                  "features": {k: str(v) for k, v in rows.features.items()}}))
"""


@pytest.fixture(scope="module")
def hub():
    with HubServer({TOKEN: ["org"]}) as server:
        yield server


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    return {
        "v1": make_run(base / "v1", seed=1),
        "v2": make_run(base / "v2", seed=2, target=5),
        "audit": make_run(base / "audit", seed=3, audit=True),
    }


@pytest.fixture(scope="module")
def env(hub, tmp_path_factory):
    return client_env(hub, TOKEN, str(tmp_path_factory.mktemp("hf")))


def opsynth(env: dict, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "opsynth.flows.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert TOKEN not in proc.stdout + proc.stderr
    return proc


def load(env: dict, config: str, revision: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", LOAD, REPO, config, revision],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def accepted(run: Path) -> list[dict]:
    rows = pq.read_table(run / "accepted.parquet").to_pylist()
    return [{k: r[k] for k in ("ops", "data_source", "code")} for r in rows]


def one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def published(env, runs):
    """v1.0.0 from one run, then v1.1.0 from another: the round trip's two versions."""
    first = opsynth(env, "publish", str(runs["v1"]), "--repo-id", REPO, "--version", "1.0.0")
    assert first.returncode == 0, first.stderr
    assert "published v1.0.0" in first.stdout
    second = opsynth(env, "publish", str(runs["v2"]), "--repo-id", REPO, "--version", "1.1.0")
    assert second.returncode == 0, second.stderr
    return runs


def test_versions_round_trip_through_datasets(env, published, hub):
    v1 = load(env, "default", "v1.0.0")
    v2 = load(env, "default", "v1.1.0")
    assert v1["columns"] == ["ops", "data_source", "code"]
    assert set(v1["features"].values()) == {"Value('string')"}
    assert v1["rows"] == accepted(published["v1"])
    assert v2["rows"] == accepted(published["v2"])
    assert v1["rows"] != v2["rows"]
    assert load(env, "default", "main")["rows"] == v2["rows"]
    full = load(env, "full", "v1.0.0")
    ids = [r["id"] for r in pq.read_table(published["v1"] / "accepted.parquet").to_pylist()]
    assert [r["id"] for r in full["rows"]] == ids
    assert all(r["eager_ms"] > 0 and r["kb_similarity"] < 0.9 for r in full["rows"])
    assert {r["device"] for r in full["rows"]} == {"cpu:Test CPU"}
    rejected = load(env, "rejected", "v1.1.0")
    assert {r["reason"] for r in rejected["rows"]} >= {"forbidden_import", "over_target"}
    assert set(hub.state.repos[REPO].tags) == {"v1.0.0", "v1.1.0"}


def test_republishing_a_version_is_a_no_op(env, published, hub):
    commits = len(hub.state.repos[REPO].commits)
    again = opsynth(env, "publish", str(published["v1"]), "--repo-id", REPO, "--version", "1.0.0")
    assert again.returncode == 0, again.stderr
    assert "already published" in again.stdout
    assert len(hub.state.repos[REPO].commits) == commits


def test_a_version_never_changes(env, published):
    proc = opsynth(env, "publish", str(published["v2"]), "--repo-id", REPO, "--version", "1.0.0")
    one_line_error(proc, "v1.0.0 with other content", "--version 1.0.1")


def test_dry_run_writes_exactly_what_is_pushed(env, published, hub, tmp_path):
    from huggingface_hub import HfApi

    from opsynth.publish.hub import same_files

    out = tmp_path / "dry"
    commits = len(hub.state.repos[REPO].commits)
    proc = opsynth(env, "publish", str(published["v1"]), "--repo-id", REPO, "--dry-run", str(out))
    assert proc.returncode == 0, proc.stderr
    assert len(hub.state.repos[REPO].commits) == commits
    api = HfApi(endpoint=hub.url, token=TOKEN)
    assert same_files(api, REPO, "v1.0.0", out)
    card = (out / "README.md").read_text()
    for needed in ("configs:", "license: mit", "size_categories", "Filter funnel", "Table 3"):
        assert needed in card
    assert "arXiv:2602.24286" in card and "KernelBench" in card


def test_audit_run_publishes(env, runs, hub):
    proc = opsynth(env, "publish", str(runs["audit"]), "--repo-id", "org/audit", "--private")
    assert proc.returncode == 0, proc.stderr
    assert hub.state.repos["org/audit"].private
    assert (
        "opsynth audit --input ops6k.parquet" in (runs["audit"] / "publish/README.md").read_text()
    )


def test_failed_push_keeps_the_export_and_retries(env, runs, hub, tmp_path):
    run = make_run(tmp_path / "retry", seed=4)
    hub.state.fail_commits = True
    try:
        proc = opsynth(env, "publish", str(run), "--repo-id", "org/retry")
    finally:
        hub.state.fail_commits = False
    one_line_error(proc, "HTTP 500", "kept", "re-run")
    assert (run / "publish" / "README.md").is_file()
    assert "v1.0.0" not in hub.state.repos["org/retry"].tags
    proc = opsynth(env, "publish", str(run), "--repo-id", "org/retry")
    assert proc.returncode == 0, proc.stderr
    assert "v1.0.0" in hub.state.repos["org/retry"].tags


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bad_input_is_one_line(env, runs, tmp_path):
    run = str(runs["v1"])
    no_token = {k: v for k, v in env.items() if k != "HF_TOKEN"}
    no_token["HF_HOME"] = str(tmp_path / "empty-home")
    one_line_error(opsynth(no_token, "publish", run, "--repo-id", REPO), "HF_TOKEN", "auth login")
    one_line_error(opsynth(env, "publish", run, "--repo-id", "other/x"), "403", "other")
    bad_token = {**env, "HF_TOKEN": "hf_wrong"}
    one_line_error(opsynth(bad_token, "publish", run, "--repo-id", REPO), "401", "auth login")
    one_line_error(opsynth(env, "publish", run, "--repo-id", "no slash here"), "ORG/NAME")
    one_line_error(opsynth(env, "publish", run, "--repo-id", REPO, "--version", "2"), "X.Y.Z")
    one_line_error(opsynth(env, "publish", run), "--repo-id")
    down = {**env, "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}
    one_line_error(opsynth(down, "publish", run, "--repo-id", REPO), "cannot reach", "re-run")


def test_unfinished_or_old_runs_are_refused(env, tmp_path):
    running = make_run(tmp_path / "running")
    manifest = json.loads((running / "run.json").read_text())
    (running / "run.json").write_text(json.dumps({**manifest, "status": "running"}))
    one_line_error(opsynth(env, "publish", str(running), "--repo-id", REPO), "not finished")
    short = make_run(tmp_path / "short")
    (short / "run.json").write_text(json.dumps({**manifest, "status": "short"}))
    one_line_error(opsynth(env, "publish", str(short), "--repo-id", REPO), "short", "max_rounds")
    old = make_run(tmp_path / "old")
    table = pq.read_table(old / "accepted.parquet")
    pq.write_table(
        table.replace_schema_metadata({b"opsynth_schema": b"0"}), old / "accepted.parquet"
    )
    one_line_error(opsynth(env, "publish", str(old), "--repo-id", REPO), "record schema 0")
    one_line_error(opsynth(env, "publish", str(tmp_path), "--repo-id", REPO), "no run.json")
    assert isinstance(table, pa.Table)


def test_notebook_renders_a_hub_revision(env, published, tmp_path):
    from nbrun import execute, outputs

    hub_env = {k: env[k] for k in ("HF_ENDPOINT", "HF_TOKEN", "HF_HOME", "HF_HUB_DISABLE_XET")}
    hub_env |= {"OPSYNTH_HUB_REPO": REPO, "OPSYNTH_HUB_REVISION": "v1.0.0"}
    text, images = outputs(execute(tmp_path, hub_env))
    assert f"'accepted': {len(accepted(published['v1']))}" in text
    assert images == 6


STAGE = """
import sys
from pathlib import Path
from opsynth.flows.stages import publish_stage
from opsynth.config import RunConfig
from opsynth.store import RunDir
cfg = RunConfig().with_section("publish", repo_id=sys.argv[2], version="2.0.0")
print(publish_stage.fn(RunDir(Path(sys.argv[1])), cfg))
"""


def test_publish_stage_of_regenerate(env, tmp_path, hub):
    run = make_run(tmp_path / "staged", seed=7)
    manifest = json.loads((run / "run.json").read_text())
    manifest["config"]["publish"] |= {"repo_id": "org/staged", "version": "2.0.0"}
    (run / "run.json").write_text(json.dumps(manifest))
    cmd = [sys.executable, "-c", STAGE, str(run), "org/staged"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "'tag': 'v2.0.0'" in proc.stdout and "v2.0.0" in hub.state.repos["org/staged"].tags
    down = {**env, "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}
    proc = subprocess.run(cmd, cwd=ROOT, env=down, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "'error': 'cannot reach" in proc.stdout


def test_publish_settings_leave_the_config_hash():
    from opsynth.config import RunConfig

    base = RunConfig()
    moved = base.with_section("publish", repo_id="org/elsewhere", version="3.1.4")
    assert moved.config_hash() == base.config_hash()
