"""Containers (``compose.container_share``): a chain written with an ``nn.Sequential``,
``nn.ModuleDict``, ``nn.ParameterList``, ``nn.ParameterDict`` or ``nn.Parameter`` lists it as
one of its operators, as Ops-6K does, and computes exactly what it computes without one.

Composed code is executed here, test-side only, as in ``test_synth_compose``.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest
import torch

from opsynth.config import ComposeConfig
from opsynth.filters.static_check import check_source
from opsynth.record import Task
from opsynth.synth.catalog.spec import CatalogSpec, InputSpec
from opsynth.synth.chain import Chain, Link, weight_names
from opsynth.synth.compose import CONTAINED, composable, compose, with_containers
from opsynth.synth.containers import CONTAINERS, fitting, sequential_run
from opsynth.synth.degenerate import Degenerate
from opsynth.synth.emit import render_code
from opsynth.synth.sampling import container_weights, profile_weights
from opsynth.synth.solve import Solver

NO_SECOND_INPUT = ComposeConfig(multi_input_share=0.0, int_input_share=0.0)


def solved(seeds: list[Task], names: list[str], rank: int, cfg: ComposeConfig = NO_SECOND_INPUT):
    """The chain of ``names`` the first of a few solver seeds solves."""
    specs = [next(composable(t) for t in seeds if t.ops == [name]) for name in names]
    for seed in range(8):
        try:
            return Solver(cfg, random.Random(seed)).solve(specs, rank=rank)
        except Degenerate:
            continue
    raise AssertionError(f"{names} solved with none of 8 seeds")


def run_code(code: str) -> tuple[torch.nn.Module, object]:
    """The model ``code`` builds and its output, both from seed 0 (test-side execution)."""
    namespace: dict = {}
    exec(compile(code, "<task>", "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["Model"](*namespace["get_init_inputs"]())
    inputs = namespace["get_inputs"]()
    with torch.no_grad():
        return model, model(*inputs)


def same(a: object, b: object) -> bool:
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return torch.equal(a, b)


@pytest.mark.parametrize(
    ("names", "rank", "container", "written"),
    [
        (["nn.Conv2d", "nn.BatchNorm2d", "torch.relu"], 4, "nn.Sequential", "self.seq = "),
        (["torch.tanh", "nn.LayerNorm"], 2, "nn.Sequential", "self.layernorm = nn.Sequential("),
        (["nn.Linear", "torch.tanh", "nn.LayerNorm"], 2, "nn.ModuleDict", '["linear"](x)'),
        (["torch.tanh", "torch.add"], 2, "nn.ParameterList", "self.params[0]"),
        (["torch.tanh", "torch.add"], 2, "nn.ParameterDict", 'self.params["'),
        (["torch.tanh", "torch.add"], 2, "nn.Parameter", "nn.Parameter("),
    ],
)
def test_a_container_holds_the_chains_modules_and_parameters_and_computes_the_same(
    catalogue_seeds, names, rank, container, written
):
    chain = solved(catalogue_seeds, names, rank)
    assert container in fitting(chain), (names, fitting(chain))
    held = replace(chain, container=container)
    assert held.ops == [*names, container]
    plain_model, plain_out = run_code(render_code(chain))
    code = render_code(held)
    assert written in code, code
    model, out = run_code(code)
    assert same(out, plain_out), code
    assert check_source(code).keep, check_source(code)  # the filters' static check takes it
    assert sorted(p.shape for p in model.parameters()) == sorted(
        p.shape for p in plain_model.parameters()
    )
    kind = getattr(torch.nn, container.removeprefix("nn."))
    if container != "nn.Parameter":
        assert any(isinstance(m, kind) for m in model.modules()), code
        assert not any(isinstance(m, kind) for m in plain_model.modules())


def test_an_nn_sequential_holds_the_modules_that_pass_one_tensor_along(catalogue_seeds):
    chain = solved(catalogue_seeds, ["nn.Conv2d", "nn.BatchNorm2d", "torch.relu"], 4)
    assert sequential_run(chain.links) == range(0, 2)
    # a module called with two tensors (a loss: input and target) cannot be a step of one
    with_target = ComposeConfig(multi_input_share=1.0, int_input_share=0.0)
    loss = solved(catalogue_seeds, ["torch.tanh", "nn.MSELoss"], 2, with_target)
    assert sequential_run(loss.links) is None
    assert "nn.Sequential" not in fitting(loss) and "nn.ModuleDict" in fitting(loss)


def test_a_chain_holding_no_module_or_parameter_fits_no_container(catalogue_seeds):
    chain = solved(catalogue_seeds, ["torch.tanh", "torch.relu"], 2)
    assert not weight_names(chain)
    assert fitting(chain) == []


def test_a_parameter_named_like_a_dict_method_is_never_a_parameter_dict_key():
    """torch refuses ``nn.ParameterDict({"values": ...})``: ``values`` is one of its methods."""
    spec = CatalogSpec(
        "torch",
        "torch.add",
        "function",
        "torch.add",
        args=(InputSpec("input", (2, 16)), InputSpec("values", (16,))),
    )
    chain = Chain((Link("a", spec, None, ("x", "values")),), batch=2, batch_dims={"x": (0,)})
    assert weight_names(chain) == {"values"}
    assert "nn.ParameterDict" not in fitting(chain)
    assert {"nn.ParameterList", "nn.Parameter"} <= set(fitting(chain))
    with pytest.raises(KeyError):
        torch.nn.ParameterDict({"values": torch.nn.Parameter(torch.ones(1))})


def test_container_share_writes_containers_counted_among_the_ops(catalogue_seeds):
    wanted = ["nn.Linear", "nn.LayerNorm", "torch.tanh", "torch.add", "torch.relu"]
    zero = {t.ops[0]: 0.0 for t in catalogue_seeds if t.ops[0] not in wanted}
    # five operators give few distinct sequences: repeats allowed, so no draw is spent on them
    settings = dict(
        profile="uniform", op_weights=zero, mix={"torch#2": 1.0}, novelty_attempts=0, **_floats()
    )
    tasks = compose(catalogue_seeds, ComposeConfig(container_share=1.0, **settings), n=12)
    kinds = Counter(t.meta.get("container") for t in tasks)
    assert kinds[None] <= 1 and len(kinds) >= 3, kinds
    for task in tasks:
        container = task.meta.get("container")
        if container is None:
            continue
        assert task.ops[-1] == container and task.data_source == "torch#2", task.ops
        assert len(task.seed_ids) == 1 and set(task.ops[:-1]) <= set(wanted)
        run_code(task.code)
    plain = compose(catalogue_seeds, ComposeConfig(container_share=0.0, **settings), n=12)
    assert not any(t.meta.get("container") or set(t.ops) & set(CONTAINERS) for t in plain)
    assert all(len(t.seed_ids) == 2 for t in plain)


def test_a_chain_no_container_fits_is_drawn_without_one(catalogue_seeds):
    """Seeds that never hold a module or parameter: after its attempts the chain is drawn
    with all its operators, not refused."""
    wanted = ["torch.tanh", "torch.relu", "torch.exp", "F.gelu"]
    zero = {t.ops[0]: 0.0 for t in catalogue_seeds if t.ops[0] not in wanted}
    cfg = ComposeConfig(
        container_share=1.0, profile="uniform", op_weights=zero, mix={"torch#2": 1.0}, **_floats()
    )
    tasks = compose(catalogue_seeds, cfg, n=3)
    assert all(len(t.ops) == 2 and set(t.ops) <= set(wanted) for t in tasks)


def test_the_profiles_containers_weigh_no_operator_while_drawn_as_containers():
    names = ["nn.Sequential", "nn.Linear"]
    before = profile_weights(names, ComposeConfig(container_share=0.0))
    after = profile_weights(names, ComposeConfig(container_share=0.04))
    weights = container_weights(ComposeConfig())
    # the catalogue's own nn.Sequential keeps the other uncategorised names' share, no more
    assert before[0] - after[0] == pytest.approx(sum(weights.values()))
    assert before[1] == after[1]
    assert set(weights) == set(CONTAINERS)
    assert weights["nn.Sequential"] > weights["nn.ModuleDict"] > 0
    assert set(container_weights(ComposeConfig(profile="uniform")).values()) == {1.0}


def _floats() -> dict:
    return {"multi_input_share": 0.0, "int_input_share": 0.0, "tuple_output_share": 0.0}


def test_sources_are_marked_for_a_container_at_the_share_from_their_own_rng():
    sources = ["torch#1", "torch#2", "torch#3", "transformers"] * 2500
    assert with_containers(sources, ComposeConfig(container_share=0.0), 0) is sources
    marked = with_containers(sources, ComposeConfig(container_share=0.04), 0)
    held = [s.removesuffix(CONTAINED) for s in marked if s.endswith(CONTAINED)]
    assert set(held) == {"torch#2", "torch#3"}  # a chain of two or more operators only
    assert abs(len(held) / 5000 - 0.04) < 0.01
    assert [s.removesuffix(CONTAINED) for s in marked] == sources
    assert with_containers(sources, ComposeConfig(container_share=0.04), 1) != marked


def test_a_marked_source_is_drawn_with_a_container(catalogue_seeds):
    """A draw another chunk repeated is drawn again from its marked source (``compose`` keeps
    the mark), so it comes back with a container, not as a plain chain."""
    from opsynth.synth.compose import _Drawer

    wanted = ["nn.Linear", "nn.LayerNorm", "torch.tanh", "torch.add"]
    zero = {t.ops[0]: 0.0 for t in catalogue_seeds if t.ops[0] not in wanted}
    cfg = ComposeConfig(profile="uniform", op_weights=zero, **_floats())
    drawer = _Drawer(catalogue_seeds, cfg, 0, "", [])
    held = [drawer.draw("torch#2" + CONTAINED) for _ in range(3)]
    assert all(t.meta.get("container") and t.data_source == "torch#2" for t in held)
    plain = drawer.draw("torch#2")
    assert "container" not in plain.meta and len(plain.seed_ids) == 2
