"""Catalogue seed tasks as the composers receive them: runnable as recorded, rows that cite
themselves, a serialized spec that rebuilds the exact call validation ran, and the composer's
view of each seed."""

from __future__ import annotations

import ast
import json
from dataclasses import replace

import torch
import torch.utils.deterministic as deterministic
from conftest import TEST_OPERATORS

from opsynth.config import SeedsConfig
from opsynth.record import Task, content_id
from opsynth.synth.catalog import probe
from opsynth.synth.catalog.extract import seeds_in_process
from opsynth.synth.catalog.plugins import load_adapter, resolve_names
from opsynth.synth.catalog.serialize import spec_from_json, spec_to_json
from opsynth.synth.catalog.validate import validate
from opsynth.synth.compose import composable
from opsynth.taxonomy import category

# Modules whose constructor creates learnable weights.
WEIGHTED = {
    "nn.Linear",
    "nn.Conv2d",
    "nn.ConvTranspose1d",
    "nn.BatchNorm2d",
    "nn.LayerNorm",
    "nn.LSTM",
    "nn.MultiheadAttention",
    "nn.Embedding",
}


def build(code: str) -> tuple[torch.nn.Module, list]:
    """Test-side execution of a seed task (production code never executes it)."""
    namespace: dict = {}
    exec(compile(code, "<seed>", "exec"), namespace)
    torch.manual_seed(0)
    return namespace["Model"](*namespace["get_init_inputs"]()), namespace["get_inputs"]()


def tensors(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, tuple | list):
        return [t for item in out for t in tensors(item)]
    return []


def test_every_test_operator_is_extracted_once(catalogue_seeds):
    assert sorted(t.ops[0] for t in catalogue_seeds) == sorted(TEST_OPERATORS)
    assert len({t.id for t in catalogue_seeds}) == len(TEST_OPERATORS)


def test_every_seed_runs_as_recorded(catalogue_seeds):
    for task in catalogue_seeds:
        info = task.meta["seed"]
        model, inputs = build(task.code)
        first = next(t for t in inputs if isinstance(t, torch.Tensor))
        assert list(first.shape) == info["input_shapes"][0], task.ops
        with torch.no_grad():
            out = tensors(model(*inputs))
        assert [list(t.shape) for t in out] == info["output_shapes"], task.ops
        assert [str(t.dtype).removeprefix("torch.") for t in out] == info["output_dtypes"]
        assert all(torch.isfinite(t).all() for t in out if t.dtype.is_floating_point), task.ops


def test_seed_rows_are_ops6k_rows_citing_themselves(catalogue_seeds):
    for task in catalogue_seeds:
        info = task.meta["seed"]
        assert task.ops == [info["name"]] and task.data_source == "torch#1"
        assert info["library"] == "torch"
        assert not info["flags"] or info["flags"] == ["stochastic"] and "Dropout" in info["name"]
        assert task.id == content_id(task.code, task.ops, task.data_source)
        assert task.seed_ids == [task.id]
        assert Task.from_row(json.loads(json.dumps(task.to_row()))).id == task.id
        tree = ast.parse(task.code)
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
        assert {"Model", "get_inputs", "get_init_inputs"} <= defined
        assert task.ops[0] in ast.get_docstring(tree)


def test_the_recorded_spec_rebuilds_the_validated_call(catalogue_seeds):
    """The spec in a seed's meta survives JSON and, called again, gives the recorded shapes
    (on meta; on CPU for an operator whose output shape depends on values, torch.nonzero)."""
    from opsynth.synth.catalog.extract import seeds_in_process

    (nonzero,) = seeds_in_process(["torch.nonzero"])
    for task in [*catalogue_seeds, nonzero]:
        info = task.meta["seed"]
        stored = json.loads(json.dumps(info["spec"]))
        spec = spec_from_json(stored)
        assert spec_to_json(spec) == stored and spec.name == task.ops[0]
        if info["shape_source"] == "meta":
            assert probe.output_shapes(probe.call(spec, "meta")) == info["meta_shapes"], task.ops
        else:
            assert probe.output_shapes(probe.call(spec, "cpu")) == info["output_shapes"]
    assert nonzero.meta["seed"]["shape_source"] == "cpu"


def test_learnable_tensors_are_registered(catalogue_seeds):
    for task in catalogue_seeds:
        model, _ = build(task.code)
        loose = [
            name
            for module in model.modules()
            for name, value in vars(module).items()
            if isinstance(value, torch.Tensor)
        ]
        assert not loose, f"{task.ops[0]}: unregistered tensors {loose}"
        n_params = sum(p.numel() for p in model.parameters())
        assert n_params == task.meta["seed"]["parameters"], task.ops
        assert (n_params > 0) == (task.ops[0] in WEIGHTED), task.ops


def test_the_composer_reads_ranks_and_main_input_from_each_seed(catalogue_seeds):
    for task in catalogue_seeds:
        seed = composable(task)
        assert seed is not None and seed.id == task.id and seed.spec.name == task.ops[0]
        recorded = tuple(sorted(int(r) for r in task.meta["seed"]["ranks"]))
        if category(task.ops[0]) == "conv":  # batched ranks only (test_synth_compose)
            assert set(seed.ranks) < set(recorded) or seed.ranks == recorded[-1:]
        else:
            assert seed.ranks == recorded
    by_name = {t.ops[0]: composable(t) for t in catalogue_seeds}
    assert by_name["nn.Conv2d"].ranks == (4,) and by_name["torch.bmm"].ranks == (3,)
    assert by_name["nn.Embedding"].spec.args[0].dtype == "int64"


def test_an_operator_returning_uninitialized_memory_is_rejected_every_time() -> None:
    """torch.empty's output is whatever the allocator held: finite or not by chance, so the
    seed came and went between extractions. Validated with such memory filled with NaN, it is
    rejected each time, and the process's deterministic-mode settings are as they were."""
    cfg = SeedsConfig()
    adapter = load_adapter(resolve_names(["torch"], cfg)["torch"], cfg)
    spec = next(s for s in adapter.specs() if s.name == "torch.empty")
    before = (torch.are_deterministic_algorithms_enabled(), deterministic.fill_uninitialized_memory)
    for _ in range(3):
        task, verdict = validate(replace(spec, library="torch"), 20.0)
        assert task is None and verdict.reason == "nonfinite_output", verdict.detail
    after = (torch.are_deterministic_algorithms_enabled(), deterministic.fill_uninitialized_memory)
    assert after == before
    assert [t.ops for t in seeds_in_process(["torch.empty", "torch.tanh"])] == [["torch.tanh"]]


def test_in_process_extraction_is_by_name_stable_and_flags_unusable_seeds(catalogue_seeds):
    """Unknown names are left out; a seed extracted again is the same row; stochastic and
    in-place operators become seeds but never composable ones, except dropout (at p=0)."""
    names = ["torch.tanh", "torch.relu_", "F.dropout", "F.rrelu"]
    found = {t.ops[0]: t for t in seeds_in_process(names)}
    assert set(found) == set(names)
    assert set(t.ops[0] for t in seeds_in_process(["torch.no_such_op"])) == set()
    tanh = next(t for t in catalogue_seeds if t.ops == ["torch.tanh"])
    assert found["torch.tanh"].id == tanh.id
    assert "inplace" in found["torch.relu_"].meta["seed"]["flags"]
    assert "stochastic" in found["F.dropout"].meta["seed"]["flags"]
    assert "stochastic" in found["F.rrelu"].meta["seed"]["flags"]
    assert composable(found["torch.relu_"]) is None and composable(found["F.rrelu"]) is None
    assert composable(found["F.dropout"]) is not None
    assert composable(found["torch.tanh"]) is not None
