"""``compose.hold_integer_operands``: an integer or bool operand that does not follow the batch
(``torch.index_select``'s index) is registered as a buffer drawn in ``__init__`` instead of
being a ``get_inputs`` input; off, every such operand is an input, as before the setting.
Composed code runs test-side only."""

from __future__ import annotations

import re

import pytest
import torch
from test_synth_compose import load, only, run_task

from opsynth.synth.compose import compose

OPERATORS = ("torch.index_select", "nn.ReLU", "torch.tanh", "nn.Linear", "torch.mul")
BUFFER = re.compile(r'self\.register_buffer\("(\w+)", (torch\.randint\([^\n]*\))\)')


@pytest.fixture(scope="module")
def seeds():
    from opsynth.synth.catalog.extract import seeds_in_process

    return seeds_in_process(list(OPERATORS))


def _tasks(seeds, n=6, **settings):
    settings = {"tuple_output_share": 0.0, "mix": {"torch#2": 0.5, "torch#3": 0.5}, **settings}
    settings.setdefault("container_share", 0.0)
    tasks = compose(seeds, only(seeds, *OPERATORS, **settings), n=n)
    return [t for t in tasks if "torch.index_select" in t.ops]


def test_an_index_that_does_not_follow_the_batch_is_a_buffer_the_model_holds(seeds):
    tasks = _tasks(seeds)
    assert tasks
    for task in tasks:
        held = BUFFER.findall(task.code)
        assert held, task.code
        names = {name for name, _ in held}
        model, inputs = load(task.code)
        assert not names & set(inputs), task.code  # not asked of get_inputs
        buffers = dict(model.named_buffers())
        for name in names:
            assert buffers[name].dtype == torch.int64, task.code
            assert f"self.{name}" in task.code.split("def forward")[1], task.code
        assert set(task.meta["buffers"]) == names
        assert not names & set(task.meta["inputs"])
        out, _ = run_task(task)
        # the index follows the model to its device, as a parameter does
        moved = model.to("meta")
        assert all(b.device.type == "meta" for b in moved.buffers())
        assert out is not None


def test_the_held_index_is_drawn_the_same_for_the_same_seed(seeds):
    (task, *_) = _tasks(seeds)
    first, _ = load(task.code)
    second, _ = load(task.code)  # load seeds torch before building the model
    for (name, a), (_, b) in zip(first.named_buffers(), second.named_buffers(), strict=True):
        assert torch.equal(a, b), name


def test_off_every_integer_operand_is_an_input_as_before(seeds):
    tasks = _tasks(seeds, hold_integer_operands=False)
    assert tasks
    for task in tasks:
        assert "register_buffer" not in task.code, task.code
        assert "buffers" not in task.meta
        _, inputs = load(task.code)
        assert any(t.dtype == torch.int64 for t in inputs.values()), task.code


def test_a_parameter_container_holds_the_float_operands_and_the_index_stays_a_buffer(seeds):
    # torch.mul's operand a parameter, not a value of the chain (compose.reuse_share)
    tasks = _tasks(seeds, n=12, container_share=1.0, reuse_share=0.0)
    listed = [t for t in tasks if "nn.ParameterList" in t.code or "nn.ParameterDict" in t.code]
    assert listed, [t.ops for t in tasks]
    for task in listed:
        assert BUFFER.search(task.code), task.code
        model, inputs = load(task.code)
        assert all(p.dtype.is_floating_point for p in model.parameters())
        assert any(b.dtype == torch.int64 for b in model.buffers())
        with torch.no_grad():
            model(*inputs.values())
