"""The torch seed catalogue, the library registry and standalone seed tasks."""

from __future__ import annotations

import ast
import json

import pytest
import torch

from opsynth.record import Task, content_id
from synth.seeds import (
    SeedSpec,
    TorchLibrary,
    get_library,
    library_names,
    register_library,
    seed_tasks,
    spec_of,
)

SPECS = get_library("torch").specs()
SEEDS = seed_tasks(SPECS)
BY_NAME = {t.ops[0]: t for t in SEEDS}


def build(code: str) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    """Test-side execution of generated code (production code never executes it)."""
    namespace: dict = {}
    exec(compile(code, "<task>", "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["Model"](*namespace["get_init_inputs"]())
    return model, namespace["get_inputs"]()


def test_catalogue_covers_the_families():
    names = {s.name for s in SPECS}
    assert len(names) == len(SPECS) >= 20
    wanted = {
        "activations": {"F.gelu", "torch.relu", "torch.sigmoid", "torch.tanh", "F.silu"},
        "math": {"torch.abs", "torch.clamp", "torch.exp"},
        "reductions": {"torch.sum", "torch.mean", "torch.amax", "torch.logsumexp"},
        "scans and softmax": {"torch.cumsum", "torch.softmax", "nn.Softmax"},
        "shape": {"torch.transpose"},
        "layers": {"nn.Linear", "nn.Conv2d", "nn.LayerNorm", "nn.BatchNorm2d", "nn.GroupNorm"},
        "pooling": {"nn.MaxPool2d", "nn.AvgPool2d"},
    }
    for family, members in wanted.items():
        assert members <= names, f"{family}: missing {members - names}"
    assert not any(s.stochastic or s.inplace for s in SPECS)
    assert all(s.kind == ("module" if s.name.startswith("nn.") else "function") for s in SPECS)


@pytest.mark.parametrize("task", SEEDS, ids=[t.ops[0] for t in SEEDS])
def test_every_seed_task_runs_with_the_expected_shape(task):
    model, inputs = build(task.code)
    with torch.no_grad():
        out = model(*inputs)
    assert list(inputs[0].shape) == task.meta["input_shape"]
    assert list(out.shape) == task.meta["output_shape"]
    assert out.dtype == torch.float32 and torch.isfinite(out).all()


def test_seed_task_rows_are_ops6k_rows_citing_themselves():
    for spec, task in zip(SPECS, SEEDS, strict=True):
        assert task.ops == [spec.name] and task.data_source == "torch#1"
        assert task.id == content_id(task.code, task.ops, task.data_source)
        assert task.seed_ids == [task.id]
        assert task.meta["seed"] == spec.describe()
        assert Task.from_row(json.loads(json.dumps(task.to_row()))).id == task.id


def test_seed_code_is_kernelbench_format():
    for task in SEEDS:
        tree = ast.parse(task.code)
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
        assert {"Model", "get_inputs", "get_init_inputs"} <= defined
        assert ast.get_docstring(tree) and task.ops[0] in ast.get_docstring(tree)
        assert "import torch.nn.functional as F" in task.code
        assert "\nscale = 1" in task.code


def test_learnable_tensors_are_registered():
    for spec in SPECS:
        model, _ = build(BY_NAME[spec.name].code)
        loose = [
            name
            for module in model.modules()
            for name, value in vars(module).items()
            if isinstance(value, torch.Tensor)
        ]
        assert not loose, f"{spec.name}: unregistered tensors {loose}"
        n_params = sum(p.numel() for p in model.parameters())
        if spec.name in {"nn.Linear", "nn.Conv2d", "nn.LayerNorm", "nn.GroupNorm"}:
            assert n_params > 0, spec.name


def test_scale_rewrites_the_batch_only():
    task = BY_NAME["nn.Conv2d"]
    model, inputs = build(task.code.replace("\nscale = 1", "\nscale = 2"))
    with torch.no_grad():
        out = model(*inputs)
    expected = [2 * task.meta["output_shape"][0], *task.meta["output_shape"][1:]]
    assert list(out.shape) == expected


def test_seed_tasks_do_not_depend_on_catalogue_order():
    again = seed_tasks(list(reversed(SPECS)))
    assert [t.id for t in again] == [t.id for t in reversed(SEEDS)]


def test_spec_of_finds_the_spec_back():
    for spec, task in zip(SPECS, SEEDS, strict=True):
        assert spec_of(task).name == spec.name
    with pytest.raises(ValueError, match="not a seed task"):
        spec_of(Task(ops=["x"], data_source="torch#1", code="pass"))


def test_unknown_library_is_a_one_line_error_listing_known_ones():
    with pytest.raises(ValueError) as err:
        get_library("jax")
    message = str(err.value)
    assert "'jax'" in message and "torch" in message and "\n" not in message


def test_a_new_library_plugs_in(monkeypatch):
    from synth import seeds as seeds_module

    relu = next(s for s in SPECS if s.name == "torch.relu")

    class Tiny:
        name = "tiny"

        def specs(self) -> list[SeedSpec]:
            return [relu]

    monkeypatch.setattr(seeds_module, "_LIBRARIES", dict(seeds_module._LIBRARIES))
    register_library("tiny", Tiny)
    assert "tiny" in library_names() and get_library("tiny").specs() == [relu]
    assert isinstance(get_library("torch"), TorchLibrary)
