"""``seeds.condition_overrides``: torch.where is a seed in its three-argument form, a bool
condition choosing between the input and another operand, as the released set calls it; off,
an extraction derives what one made before the table did (v1.0.0's catalogue). Extracted in
this process, for torch.where only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from opsynth.config import SeedsConfig, load_config
from opsynth.store import read_tasks
from opsynth.synth.catalog.overrides import CONDITION_OVERRIDES
from opsynth.synth.catalog.serialize import spec_from_json
from opsynth.synth.catalog.torch_library import TorchCatalog, rebind
from opsynth.synth.catalog.validate import validate

RELEASE = Path(__file__).resolve().parents[1] / "data" / "releases" / "v1.0.0"


def _seed(conditions: bool):
    cfg = SeedsConfig(operators=["torch.where"], condition_overrides=conditions)
    (spec,) = list(TorchCatalog(cfg).specs())
    task, verdict = validate(spec, cfg.seed_timeout_s, cfg.fill_uninitialized)
    return spec, task, verdict


@pytest.fixture(scope="module")
def on():
    return _seed(True)


def test_where_chooses_between_two_operands_by_a_bool_condition(on):
    spec, task, _ = on
    assert task is not None
    tensors = [(a.name, a.dtype) for a in spec.args if a.tensor]
    assert tensors == [("condition", "bool"), ("input", "float32"), ("other", "float32")]
    namespace: dict = {}
    exec(compile(task.code, "<seed>", "exec"), namespace)
    torch.manual_seed(0)
    condition, x, other = namespace["get_inputs"]()
    model = namespace["Model"](*namespace["get_init_inputs"]())
    with torch.no_grad():
        out = model(condition, x, other)
    assert condition.dtype == torch.bool and 0 < int(condition.sum()) < condition.numel()
    assert torch.equal(out, torch.where(condition, x, other))
    recorded = spec_from_json(task.meta["seed"]["spec"])
    assert [a.dtype for a in recorded.args] == ["bool", "float32", "float32"]


def test_the_seed_rebinds_in_its_own_form_at_another_shape(on):
    spec, _, _ = on
    (rebound, *_) = rebind(spec, (3, 5, 7), 4)
    assert [(a.name, a.dtype, a.shape) for a in rebound.args] == [
        ("condition", "bool", (3, 5, 7)),
        ("input", "float32", (3, 5, 7)),
        ("other", "float32", (3, 5, 7)),
    ]


def test_off_the_derivation_is_the_one_it_was():
    spec, _, _ = _seed(False)
    assert [a.name for a in spec.args if a.tensor] == ["condition"]
    assert all(a.dtype != "bool" for a in spec.args)
    for rebound in rebind(spec, (3, 5, 7), 4):  # never the three-argument form
        assert len([a for a in rebound.args if a.tensor]) != 3 or rebound.args[0].dtype != "bool"


def test_the_v1_release_extracts_and_resumes_as_before():
    cfg = load_config(RELEASE / "config.toml")
    assert cfg.seeds.condition_overrides is False
    assert "condition_overrides" not in cfg.seeds.work_dump()
    assert cfg.seeds.model_copy(update={"condition_overrides": True}).work_dump()[
        "condition_overrides"
    ]
    manifest = RELEASE / "run" / "run.json"
    if manifest.is_file():
        assert cfg.config_hash() == json.loads(manifest.read_text())["config_hash"]
    committed = RELEASE / "run" / "catalogue" / "seeds.parquet"
    if committed.is_file():
        for task in read_tasks(committed):
            if task.ops[0] in CONDITION_OVERRIDES:
                spec = spec_from_json(task.meta["seed"]["spec"])
                assert spec.args[0].dtype != "bool", task.code
