"""The composer's parts on their own: spec serialisation, re-derivation, batch inference,
profile weights, the meta cost model and the sample checks."""

from __future__ import annotations

import random

import pytest
import torch

from opsynth.config import ComposeConfig
from opsynth.profile import load_profile
from opsynth.record import Task
from opsynth.synth.catalog.rebind import generic, main_index, rebind
from opsynth.synth.catalog.serialize import spec_from_json, spec_to_json
from opsynth.synth.catalog.spec import CatalogSpec, Code, InputSpec
from opsynth.synth.chain import (
    Chain,
    Link,
    _recurrent_on_meta,
    build_callables,
    draw_inputs,
    execute,
)
from opsynth.synth.compose import composable
from opsynth.synth.cost import fit_batch, measure
from opsynth.synth.degenerate import Degenerate, check_sample
from opsynth.synth.sampling import profile_weights
from opsynth.synth.solve import Solver, _inferred_batch


def _seed(seeds: list[Task], name: str):
    return next(composable(t) for t in seeds if t.ops == [name])


def test_a_spec_survives_json_with_code_literals_and_tuples():
    spec = CatalogSpec(
        "torch",
        "torch.zeros_like",
        "function",
        "torch.zeros_like",
        init=(("size", (2, 3)),),
        args=(
            InputSpec("x", (4, 8), uniform=(0.1, 0.9)),
            InputSpec("dtype", tensor=False, value=Code("torch.float32"), keyword=True),
        ),
        flags=("factory",),
    )
    back = spec_from_json(spec_to_json(spec))
    assert back == spec
    assert isinstance(back.args[1].value, Code) and back.args[0].uniform == (0.1, 0.9)


def test_the_running_tensor_feeds_the_first_argument_of_its_dtype():
    where = CatalogSpec(
        "torch",
        "torch.where",
        "function",
        "torch.where",
        args=(InputSpec("condition", (2, 3), dtype="bool"), InputSpec("x", (2, 3))),
    )
    assert main_index(where, "float32") == 1
    assert main_index(where, "int64") == 0  # no int64 argument: the first tensor


def test_generic_rebinding_replaces_only_the_first_tensor_shape():
    spec = CatalogSpec(
        "einops",
        "einops.rearrange",
        "function",
        "einops.rearrange",
        args=(
            InputSpec("x", (4, 8, 16, 16)),
            InputSpec("p", tensor=False, value="b c h w -> b (h w) c"),
        ),
    )
    (rebound,) = generic(spec, (2, 3, 5, 7))
    assert rebound.args[0].shape == (2, 3, 5, 7) and rebound.args[1] == spec.args[1]


def test_torch_rebinding_follows_the_new_shape(catalogue_seeds):
    linear = _seed(catalogue_seeds, "nn.Linear")
    specs = rebind(linear.spec, (2, 96), 24)
    assert specs and all(s.args[0].shape == (2, 96) for s in specs)
    assert dict(specs[0].init)["in_features"] == 96


def test_a_size_list_naming_the_batch_is_rewritten_with_minus_one():
    assert _inferred_batch([2, -1], [3, -1], (2, 3)) is None  # -1 already taken
    assert _inferred_batch([2, 64], [3, 64], (2, 3)) == [-1, 64]
    assert _inferred_batch([4, 64], [6, 64], (2, 3)) is None  # twice the batch: not resizable


def test_profile_weights_follow_the_released_counts_with_floors():
    cfg = ComposeConfig(profile="ops6k", profile_floor=1.0, profile_min_weight=8.0)
    names = ["nn.ConvTranspose2d", "nn.ConvTranspose1d", "torch.cummin", "nn.NoSuchConv9d"]
    conv2d, conv1d, rare, unknown = profile_weights(names, cfg)
    # released names the catalogue lacks give their mass to their category's released names
    # in proportion; an operator the profile does not name keeps the floor
    counts = load_profile("ops6k").ops
    ratio = counts["nn.ConvTranspose2d"] / counts["nn.ConvTranspose1d"]
    assert conv2d / conv1d == pytest.approx(ratio, rel=1e-6)
    assert conv2d > counts["nn.ConvTranspose2d"] and rare >= 8.0 and unknown == 1.0
    assert profile_weights(names, ComposeConfig(profile="uniform")) == [1.0] * 4
    zeroed = ComposeConfig(profile="uniform", op_weights={"torch.cummin": 0.0})
    assert profile_weights(names, zeroed)[2] == 0.0


def test_the_cost_model_counts_multiply_adds_and_fits_a_power_of_two_batch():
    layer = torch.nn.Linear(64, 32, device="meta")
    x = torch.empty(8, 64, device="meta")
    cost = measure(lambda: layer(x))
    assert cost.gmacs == pytest.approx(8 * 64 * 32 / 1e9)
    cfg = ComposeConfig()
    batch = fit_batch(cost, 8 * 64 / 1e6, 8, cfg)
    assert batch & (batch - 1) == 0 and cfg.batch_range[0] <= batch <= cfg.batch_range[1]


def test_a_chain_is_solved_replayed_and_its_batch_dims_found(catalogue_seeds):
    seeds = [_seed(catalogue_seeds, "nn.Linear"), _seed(catalogue_seeds, "torch.add")]
    solver = Solver(ComposeConfig(), random.Random(0))
    chain = solver.solve(seeds, rank=2)
    assert chain.ops == ["nn.Linear", "torch.add"]
    assert chain.batch_dims["x"] == (0,)


@pytest.mark.parametrize(
    ("kind", "settings"),
    [
        ("LSTM", {"num_layers": 2}),
        ("GRU", {"batch_first": True, "bidirectional": True}),
        ("RNN", {"nonlinearity": "relu"}),
    ],
)
def test_a_recurrent_module_on_meta_runs_one_step_and_costs_the_whole_sequence(kind, settings):
    module = getattr(torch.nn, kind)(8, 16, device="meta", **settings)
    x = torch.empty(24, 16, 8, device="meta")  # 16 steps with batch_first, else 24
    unrolled = None

    def run_unrolled():
        nonlocal unrolled
        unrolled = module(x)

    whole = measure(run_unrolled)
    stepped = None

    def run_stepped():
        nonlocal stepped
        stepped = _recurrent_on_meta(module, [x], {})

    cost = measure(run_stepped)
    shapes = [t.shape for t in torch.utils._pytree.tree_leaves(unrolled)]
    assert [t.shape for t in torch.utils._pytree.tree_leaves(stepped)] == shapes
    assert cost.gmacs == pytest.approx(whole.gmacs, rel=0.02)
    assert cost.melems == pytest.approx(whole.melems, rel=0.05)


def test_the_solver_measures_a_chain_link_by_link_as_a_whole_run_would(catalogue_seeds):
    # float inputs only: a first link drawn to take integers (``int_input_share``) may find no
    # argument set these operators run with, and the chain is then redrawn, not measured
    solver = Solver(ComposeConfig(int_input_share=0.0), random.Random(0))
    for names, rank in (
        (["nn.Linear", "torch.add"], 2),
        (["nn.Conv2d", "torch.relu", "nn.MaxPool2d"], 4),
        (["nn.LSTM", "torch.sum"], 3),
    ):
        chain = solver.solve([_seed(catalogue_seeds, n) for n in names], rank=rank)
        inputs = draw_inputs(chain, "meta")
        callables = build_callables(chain.links, "meta")
        whole = measure(lambda: execute(chain, callables, inputs))  # noqa: B023
        assert chain.cost is not None, names
        assert chain.cost.melems == pytest.approx(whole.melems), names
        assert chain.cost.gmacs == pytest.approx(whole.gmacs), names
        assert chain.cost.largest_melems == pytest.approx(whole.largest_melems), names


def test_the_sample_check_refuses_a_constant_output():
    spec = CatalogSpec(
        "torch", "torch.zeros_like", "function", "torch.zeros_like", args=(InputSpec("x", (2, 16)),)
    )
    chain = Chain((Link("s", spec, None, ("x",)),), batch=2, batch_dims={"x": (0,)})
    with pytest.raises(Degenerate) as caught:
        check_sample(chain, ComposeConfig())
    assert caught.value.reason in ("constant", "trivial")


def test_the_sample_check_refuses_an_identity_link():
    relu = CatalogSpec(
        "torch", "torch.relu", "function", "torch.relu", args=(InputSpec("x", (2, 16)),)
    )
    chain = Chain(
        (Link("a", relu, None, ("x",)), Link("b", relu, 0, (None,))),
        batch=2,
        batch_dims={"x": (0,)},
    )
    with pytest.raises(Degenerate) as caught:
        check_sample(chain, ComposeConfig())
    assert caught.value.reason == "noop"


def test_the_sample_check_refuses_an_input_handed_back_unless_pinned_off():
    clone = CatalogSpec(
        "torch", "torch.clone", "function", "torch.clone", args=(InputSpec("x", (2, 16)),)
    )
    chain = Chain((Link("c", clone, None, ("x",)),), batch=2, batch_dims={"x": (0,)})
    with pytest.raises(Degenerate) as caught:
        check_sample(chain, ComposeConfig())
    assert caught.value.reason == "trivial" and "input x handed back" in str(caught.value)
    check_sample(chain, ComposeConfig(refuse_input_answer=False))  # as v1.0.0 composed


def test_the_sample_check_refuses_an_output_the_same_for_both_draws_unless_pinned_off():
    """``torch.histogram`` over a fixed range returns its bin edges beside the counts: the
    counts move with the input, the edges never do."""
    histogram = CatalogSpec(
        "torch",
        "torch.histogram",
        "function",
        "torch.histogram",
        args=(
            InputSpec("x", (2, 16)),
            InputSpec("bins", tensor=False, value=4, keyword=True),
            InputSpec("range", tensor=False, value=(-3.0, 3.0), keyword=True),
        ),
    )
    chain = Chain((Link("h", histogram, None, ("x", None, None)),), batch=2, batch_dims={"x": (0,)})
    with pytest.raises(Degenerate) as caught:
        check_sample(chain, ComposeConfig())
    assert caught.value.reason == "indistinguishable" and "output 1" in str(caught.value)
    check_sample(chain, ComposeConfig(every_output_distinct=False))  # as v1.0.0 composed
