"""The discovered seed catalogue: one full extraction (torch, transformers, einops) through the
real CLI, shared by every test here, then the targets, the task format and the coverage.

Floors are the numbers measured when the catalogue was built; a drop below one is a regression.
"""

from __future__ import annotations

import ast
import csv
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from opsynth.refdata import OPS6K, shared_file
from opsynth.store import read_tasks, read_verdicts
from opsynth.synth.catalog.reasons import REASONS

REFERENCE = shared_file(OPS6K)
needs_reference = pytest.mark.skipif(REFERENCE is None, reason="reference data ../shared is absent")

# Measured: 748 torch seeds, 316/330 (95.8%) Ops-6K names; with 6 classes per family (the
# lighter config used here to keep the session short) ~150 transformers classes, 39 families.
TORCH_FLOOR = 745
# Operators whose output is uninitialized memory: rejected every time (seeds.fill_uninitialized).
UNINITIALIZED = {"torch.empty", "torch.empty_like", "torch.empty_strided"}
TORCH_COVERAGE_FLOOR = 0.95
TRANSFORMERS_FLOOR = 100
FAMILIES_FLOOR = 35
TEST_CONFIG = "[seeds]\ntransformers_max_per_family = 6\n"


@pytest.fixture(scope="session")
def catalogue(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("catalogue")
    out, config = base / "seeds", base / "seeds.toml"
    config.write_text(TEST_CONFIG)
    proc = subprocess.run(
        [sys.executable, "-m", "opsynth.flows.cli", "seeds", "extract", "--out", str(out)]
        + ["--config", str(config)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def seeds(catalogue):
    return read_tasks(catalogue / "seeds.parquet")


@pytest.fixture(scope="session")
def verdicts(catalogue):
    return read_verdicts(catalogue / "verdicts.parquet")


def build(code: str):
    """Test-side execution of a seed task."""
    namespace: dict = {}
    exec(compile(code, "<seed>", "exec"), namespace)
    torch.manual_seed(0)
    return namespace["Model"](*namespace["get_init_inputs"]()), namespace["get_inputs"]()


def test_targets(catalogue, seeds):
    summary = json.loads((catalogue / "summary.json").read_text())
    torch_seeds = [t for t in seeds if t.meta["seed"]["library"] == "torch"]
    layers = [t for t in seeds if t.data_source == "transformers"]
    families = {t.meta["seed"]["family"] for t in layers}
    assert len(torch_seeds) == summary["torch"]["runnable"] >= TORCH_FLOOR
    assert len(layers) >= TRANSFORMERS_FLOOR and len(families) >= FAMILIES_FLOOR
    assert summary["einops"]["runnable"] >= 5
    assert all(row["status"] == "ok" for row in summary.values())


def test_operators_returning_uninitialized_memory_are_rejected(verdicts):
    found = {v.measures["name"]: v.reason for v in verdicts if v.measures["name"] in UNINITIALIZED}
    assert found == dict.fromkeys(UNINITIALIZED, "nonfinite_output")


def test_every_operator_has_exactly_one_verdict(seeds, verdicts):
    keys = [(v.measures["library"], v.measures["name"]) for v in verdicts]
    assert len(keys) == len(set(keys))
    passed = {v.task_id for v in verdicts if v.passed}
    assert passed == {t.id for t in seeds}
    assert all(v.stage == "seeds" and v.reason in REASONS for v in verdicts)
    rejected = [v for v in verdicts if not v.passed]
    assert rejected and all(v.reason != "ok" for v in rejected)


def test_reason_table_counts_every_verdict(catalogue, verdicts):
    with open(catalogue / "reasons.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert sum(int(r["count"]) for r in rows) == len(verdicts)
    assert {"ok", "unsupported_sparse", "unsupported_quantized", "no_forward"} <= {
        r["reason"] for r in rows
    }


def test_unsupported_and_flags_are_derived(seeds, verdicts):
    reason = {v.measures["name"]: v.reason for v in verdicts}
    flags = {t.ops[0]: set(t.meta["seed"]["flags"]) for t in seeds}
    assert reason["nn.ModuleList"] == "no_forward"
    assert reason["torch.quantize_per_tensor"] == "unsupported_quantized"
    assert reason["torch.cudnn_batch_norm"] == "needs_cuda"
    assert "stochastic" in flags["nn.Dropout"] and "stochastic" in flags["F.dropout"]
    assert "inplace" in flags["torch.relu_"]
    assert not flags["nn.Conv2d"] and not flags["torch.cumsum"]


@pytest.mark.parametrize(
    ("name", "stochastic"),
    [
        ("F.dropout2d", True),
        ("nn.AlphaDropout", True),
        ("torch.randn_like", True),
        ("torch.normal", True),
        ("F.rrelu", True),
        ("F.normalize", False),
        ("nn.LayerNorm", False),
        ("torch.cumsum", False),
    ],
)
def test_stochastic_operators_are_flagged_by_name_words(name, stochastic):
    from opsynth.synth.catalog.introspect import Entry
    from opsynth.synth.catalog.torch_library import base_flags

    entry = Entry(name, "function", name, None)
    assert ("stochastic" in base_flags(entry)) is stochastic


def test_seed_tasks_are_kernelbench_format(seeds):
    for task in seeds:
        tree = ast.parse(task.code)
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
        assert {"Model", "get_inputs", "get_init_inputs"} <= defined, task.ops
        assert task.ops == [task.meta["seed"]["name"]] and task.seed_ids == [task.id]
        if task.data_source != "transformers" and task.meta["seed"]["input_shapes"]:
            assert any(isinstance(n, ast.Assign) for n in tree.body), task.ops  # constants


def test_a_sample_runs_as_recorded(seeds):
    sample = random.Random(0).sample(seeds, 40)
    for task in sample:
        model, inputs = build(task.code)
        assert all(t.device.type == "cpu" for t in inputs if isinstance(t, torch.Tensor))
        with torch.no_grad():
            out = model(*inputs)
        got = [
            list(t.shape)
            for t in (out if isinstance(out, tuple | list) else [out])
            if isinstance(t, torch.Tensor)
        ]
        assert got == task.meta["seed"]["output_shapes"][: len(got)], task.ops


def test_torch_seeds_record_what_a_composer_needs(seeds):
    by_name = {t.ops[0]: t.meta["seed"] for t in seeds}
    gelu = by_name["F.gelu"]
    assert gelu["preserves_shape"] and {"2", "3", "4"} <= set(gelu["ranks"])
    conv = by_name["nn.Conv2d"]
    assert conv["kind"] == "module" and "in_channels" in conv["init_args"]
    assert conv["meta_shapes"] == conv["output_shapes"] and not conv["preserves_shape"]
    assert by_name["torch.sum"]["output_dtypes"] == ["float32"]


def test_transformers_tasks_are_self_contained(seeds):
    layers = {t.ops[0]: t for t in seeds if t.data_source == "transformers"}
    task = layers["ResNetShortCut"]
    assert "class Model(nn.Module)" in task.code and "import transformers" in task.code
    assert "modeling_resnet import ResNetShortCut" not in task.code
    model, inputs = build(task.code)
    assert isinstance(model(*inputs), torch.Tensor)


@needs_reference
def test_coverage_of_the_released_set(catalogue):
    cov = json.loads((catalogue / "coverage.json").read_text())
    assert cov["torch"]["reference"] == 330
    assert cov["torch"]["fraction"] >= TORCH_COVERAGE_FLOOR
    assert cov["transformers"]["reference"] == 50
    assert all(
        m["reason"] in REASONS for part in ("torch", "transformers") for m in cov[part]["misses"]
    )


def test_list_and_coverage_commands(catalogue):
    listed = subprocess.run(
        [sys.executable, "-m", "opsynth.flows.cli", "seeds", "list", "--catalogue", str(catalogue)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    assert "torch" in listed.stdout and "einops" in listed.stdout
    if REFERENCE is not None:
        cov = subprocess.run(
            [
                sys.executable,
                "-m",
                "opsynth.flows.cli",
                "seeds",
                "coverage",
                "--catalogue",
                str(catalogue),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cov.returncode == 0 and "torch misses:" in cov.stdout, cov.stderr
