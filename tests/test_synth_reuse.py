"""``compose.reuse_share``: a batch-sized operand may be a value the chain already has (its
input, an earlier operator's result, for an attention its own running tensor) instead of a new
input: ``torch.cat([x, residual])``, ``self.attn(x, x, x)``. The code the renderer writes and
the chain the solver ran agree on it, it resizes with the batch, an ``nn.Sequential`` never
swallows a kept value, and at 0 every such operand is an input, as before the setting.
Composed code runs test-side only."""

from __future__ import annotations

import random
import re
from dataclasses import replace

import pytest
import torch
from test_synth_compose import flat, load, only, run_task

from opsynth.config import ComposeConfig
from opsynth.synth import containers
from opsynth.synth.chain import build_callables, execute, without_link
from opsynth.synth.compose import composable, compose
from opsynth.synth.degenerate import Degenerate
from opsynth.synth.emit import render_code
from opsynth.synth.solve import Solver

OPERATORS = (
    "torch.tanh",
    "nn.ReLU",
    "nn.Tanh",
    "torch.cat",
    "torch.stack",
    "torch.add",
    "nn.MultiheadAttention",
    "torch.where",
    "torch.masked_fill",
    "torch.bmm",
)
REUSING = {"reuse_share": 1.0, "multi_input_share": 0.0}


@pytest.fixture(scope="module")
def seeds():
    from opsynth.synth.catalog.extract import seeds_in_process

    return seeds_in_process(list(OPERATORS))


def _solved(seeds, names, rank=3, **settings):
    """The first of a few seeded solves of ``names`` that is not degenerate."""
    cfg = ComposeConfig(profile="uniform", **{**REUSING, **settings})
    chain_seeds = [next(composable(t) for t in seeds if t.ops == [name]) for name in names]
    for attempt in range(20):
        try:
            return Solver(cfg, random.Random(attempt)).solve(chain_seeds, rank)
        except Degenerate:
            continue
    raise AssertionError(f"{names} did not solve")


def _agree(chain) -> tuple[torch.Tensor, str]:
    """The rendered code's output and the chain's own (``execute``) on one input: equal."""
    code = render_code(chain)
    model, inputs = load(code)
    torch.manual_seed(1)
    callables = build_callables(chain.links, "cpu")
    with torch.no_grad():
        written = model(*inputs.values())
        # the chain's callables with the model's own parameters: same values, same output
        for fn, built in zip(callables, _modules_of(model, chain), strict=True):
            if built is not None:
                fn.load_state_dict(built.state_dict())
        ran = execute(chain, callables, inputs)
    for a, b in zip(flat(written), flat(ran), strict=True):
        torch.testing.assert_close(a, b)
    return flat(written)[0], code


def _modules_of(model, chain):
    modules = [m for m in model.children() if not isinstance(m, torch.nn.Sequential)]
    for m in model.children():
        if isinstance(m, torch.nn.Sequential):
            modules += list(m)
    found = iter(modules)
    return [next(found) if link.spec.kind == "module" else None for link in chain.links]


def test_a_second_operand_of_the_inputs_shape_is_the_input_kept_as_residual(seeds):
    chain = _solved(seeds, ["torch.tanh", "torch.cat"])
    (reuse,) = chain.links[1].reuses
    assert reuse[1] == 0  # the chain's input, not the running tensor
    assert list(chain.input_specs()) == ["x"]  # nothing more to draw
    out, code = _agree(chain)
    assert "residual = x" in code and "torch.cat([x, residual]" in code, code
    _, inputs = load(code)
    assert out.shape != inputs["x"].shape  # joined: x's elements twice over
    assert out.numel() == 2 * inputs["x"].numel()


def test_an_attention_attends_its_input_to_itself(seeds):
    chain = _solved(seeds, ["nn.MultiheadAttention"])
    assert [(j, test) for _, j, test in chain.links[0].reuses] == [(0, ""), (0, "")]
    out, code = _agree(chain)
    assert re.search(r"self\.\w+\(x, x, x", code), code
    _, inputs = load(code)
    assert list(inputs) == ["x"]


def test_a_later_attention_may_take_its_running_tensor_no_other_operator_does(seeds):
    for attempt in range(6):
        chain = _solved(seeds, ["torch.tanh", "nn.ReLU", "torch.add"], rank=3, seed=attempt)
        for k, link in enumerate(chain.links):
            assert all(j < k for _, j, _ in link.reuses), (k, link.reuses)
    chain = _solved(seeds, ["torch.tanh", "nn.MultiheadAttention"])
    assert all(j <= 1 for _, j, _ in chain.links[1].reuses)
    _agree(chain)


@pytest.mark.parametrize("op", ["torch.where", "torch.masked_fill"])
def test_a_bool_operand_is_a_value_of_the_chain_compared_with_zero(seeds, op):
    chain = _solved(seeds, ["torch.tanh", op])
    tests = {test for _, _, test in chain.links[1].reuses}
    assert tests & {">", "<"}, chain.links[1].reuses
    assert list(chain.input_specs()) == ["x"]
    out, code = _agree(chain)
    assert re.search(r"\b(x|residual) [<>] 0\b", code), code
    _, inputs = load(code)
    mask = torch.tanh(inputs["x"]) > 0
    # where the comparison differs, so does the output: it is the operand
    other = code.replace(" > 0", " < 0") if " > 0" in code else code.replace(" < 0", " > 0")
    flipped, _ = _agree_code(other)
    assert not torch.equal(out, flipped), code
    assert mask.any() and not mask.all()


def test_an_operand_of_the_swapped_shape_is_a_value_transposed(seeds):
    chain = _solved(seeds, ["torch.tanh", "torch.bmm"])
    ((_, source, how),) = chain.links[1].reuses
    assert how == "T" and source in (0, 1)  # the input or the running tensor: x @ x^T
    out, code = _agree(chain)
    assert ".transpose(-2, -1))" in code, code
    _, inputs = load(code)
    batch, rows, _ = inputs["x"].shape
    assert out.shape == (batch, rows, rows)
    if source == 1:  # a Gram matrix: symmetric
        torch.testing.assert_close(out, out.transpose(-2, -1))


def _agree_code(code: str) -> tuple[torch.Tensor, dict]:
    model, inputs = load(code)
    with torch.no_grad():
        return flat(model(*inputs.values()))[0], inputs


def test_a_task_with_a_reused_operand_resizes_with_its_batch(seeds):
    chain = _solved(seeds, ["nn.ReLU", "torch.tanh", "torch.stack"])
    assert chain.links[2].reuses
    code = render_code(chain)
    _, small = load(code)
    resized = code.replace("scale = 1 ", "scale = 3 ")
    assert resized != code
    model, inputs = load(resized)
    with torch.no_grad():
        out = model(*inputs.values())
    assert inputs["x"].shape[0] == 3 * small["x"].shape[0]
    assert flat(out)[0].numel() == 3 * 2 * small["x"].numel()


def test_an_nn_sequential_stops_where_a_later_operator_takes_the_value_again(seeds):
    chain = _solved(seeds, ["nn.ReLU", "nn.Tanh", "torch.cat"])
    (name, _, _), *_ = chain.links[2].reuses
    between = replace(chain.links[2], reuses=((name, 1, ""),))  # the ReLU's output, Tanh's input
    before = replace(chain.links[2], reuses=((name, 0, ""),))  # the input: both modules may run
    kept = replace(chain, links=(*chain.links[:2], between), container=containers.SEQUENTIAL)
    assert containers.sequential_run(kept.links) == range(0, 1)
    whole = replace(chain, links=(*chain.links[:2], before), container=containers.SEQUENTIAL)
    assert containers.sequential_run(whole.links) == range(0, 2)
    for variant in (kept, whole):
        _, code = _agree(variant)
        assert "nn.Sequential" in code, code


def test_without_a_link_the_later_sources_move_back_with_it(seeds):
    chain = _solved(seeds, ["nn.ReLU", "nn.Tanh", "torch.cat"])
    (name, _, _), *_ = chain.links[2].reuses
    for source, expected in ((0, 0), (1, 0), (2, 1)):
        link = replace(chain.links[2], reuses=((name, source, ""),))
        less = without_link(replace(chain, links=(*chain.links[:2], link)), 0)
        assert [link.name for link in less.links] == ["nn.Tanh", "torch.cat"]
        assert less.links[1].reuses == ((name, expected, ""),)


def test_composed_tasks_reuse_and_run(seeds):
    settings = {"tuple_output_share": 0.0, "container_share": 0.0, **REUSING}
    # no first operator tried with integer inputs first, which may take several
    settings |= {"int_input_share": 0.0, "mix": {"torch#2": 0.5, "torch#3": 0.5}}
    tasks = compose(seeds, only(seeds, *OPERATORS, **settings), n=16)
    joined = [t for t in tasks if {"torch.cat", "torch.stack", "torch.add"} & set(t.ops)]
    assert joined, [t.ops for t in tasks]
    reused = 0
    for task in tasks:
        for k, link in enumerate(task.meta["links"]):
            reuses = link.get("reuses", {})
            derived = link.get("derived", {})
            reused += bool(reuses)
            for name, j in reuses.items():
                assert j < k or "Attention" in link["name"] or name in derived, task.meta
        run_task(task)
        _, inputs = load(task.code)
        assert len(inputs) == 1, task.code  # no operator took a second batch-sized input
    assert reused >= len(joined) // 2


def test_at_zero_every_batch_sized_operand_is_an_input_as_before(seeds):
    settings = {"tuple_output_share": 0.0, "container_share": 0.0, "reuse_share": 0.0}
    settings |= {"multi_input_share": 1.0, "mix": {"torch#2": 1.0}}
    tasks = compose(seeds, only(seeds, "torch.tanh", "torch.cat", **settings), n=8)
    joined = [t for t in tasks if "torch.cat" in t.ops]
    assert joined, [t.ops for t in tasks]
    for task in joined:
        assert "residual" not in task.code, task.code
        assert not any("reuses" in link for link in task.meta["links"])
        _, inputs = load(task.code)
        assert len(inputs) >= 2, task.code
