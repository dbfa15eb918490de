"""``opsynth refdata fetch`` against a Hub-compatible server on loopback (tests/hubserver.py):
KernelBench's levels (one split each) and Ops-6K's train split, pushed there by the real
``datasets`` client, come back as the files the tests and benchmarks read, in the user cache,
where ``opsynth.refdata`` finds them when no ``shared/`` folder is there. A missing dataset is
one line with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hubserver import HubServer, client_env

from opsynth import refdata

TOKEN = "hf_test_secret_token_0123456789"
PUSH = """
import json, sys
import datasets
kb, ops = json.loads(sys.argv[1]), json.loads(sys.argv[2])
splits = {name: datasets.Dataset.from_list(rows) for name, rows in kb.items()}
datasets.DatasetDict(splits).push_to_hub("org/kernelbench")
datasets.Dataset.from_list(ops).push_to_hub("org/ops6k")
"""
CODE = "import torch\nclass Model(torch.nn.Module):\n    pass\n"
KERNELBENCH = {
    "level_1": [{"code": CODE, "level": 1, "name": "Square", "problem_id": 2}],
    "level_2": [
        {"code": CODE, "level": 2, "name": "Conv2d_ReLU", "problem_id": 1},
        {"code": CODE, "level": 2, "name": "Gemm_Add", "problem_id": 3},
    ],
}
OPS6K = [{"ops": '["torch.relu"]', "data_source": "torch#1", "code": CODE}]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    home = tmp_path_factory.mktemp("hf")
    with HubServer({TOKEN: ["org"]}) as hub:
        env = client_env(hub, TOKEN, str(home))
        env["OPSYNTH_CACHE"] = str(tmp_path_factory.mktemp("cache"))
        pushed = subprocess.run(
            [sys.executable, "-c", PUSH, json.dumps(KERNELBENCH), json.dumps(OPS6K)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert pushed.returncode == 0, pushed.stderr[-3000:]
        yield env


def refdata_cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "opsynth.flows.cli", "refdata", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_fetch_writes_the_reference_files_into_the_user_cache(env, monkeypatch) -> None:
    ids = ["--kernelbench", "org/kernelbench", "--ops6k", "org/ops6k"]
    proc = refdata_cli(env, "fetch", *ids)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cache = Path(env["OPSYNTH_CACHE"]) / "shared"
    rows = [json.loads(line) for line in (cache / refdata.KERNELBENCH).read_text().splitlines()]
    assert [(r["level"], r["problem_id"], r["name"]) for r in rows] == [
        (1, 2, "Square"),
        (2, 1, "Conv2d_ReLU"),
        (2, 3, "Gemm_Add"),
    ]
    assert rows[1]["path"] == "KernelBench/level2/1_Conv2d_ReLU.py" and rows[1]["code"] == CODE
    table = pq.read_table(cache / refdata.OPS6K)
    assert table.column_names == ["ops", "data_source", "code"] and table.num_rows == 1

    # with no shared/ folder beside the project, the user cache is where the data is found
    monkeypatch.setenv("OPSYNTH_CACHE", env["OPSYNTH_CACHE"])
    monkeypatch.delenv("OPSYNTH_SHARED", raising=False)
    monkeypatch.setattr(refdata, "ROOT", refdata.user_shared_dir().parent / "no-checkout" / "x")
    assert (
        refdata.shared_file(refdata.KERNELBENCH) == refdata.user_shared_dir() / refdata.KERNELBENCH
    )


def test_a_missing_dataset_is_one_line(env, tmp_path) -> None:
    proc = refdata_cli(env, "fetch", "--kernelbench", "org/nothing-here", "--to", str(tmp_path))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "org/nothing-here" in lines[0], proc.stderr[-2000:]
    assert not (tmp_path / refdata.KERNELBENCH).exists()
