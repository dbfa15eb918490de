"""``compose.sampled_shapes``: operators meta tensors cannot run (their output size is data,
or they call such an operator inside) are solved on small CPU samples, and one whose output
size follows its input's values only ends a chain. Composed code runs test-side only."""

from __future__ import annotations

import pytest
import torch
from test_synth_compose import flat, only, run_task

from opsynth.synth.catalog.probe import make_tensor
from opsynth.synth.chain import Link, expanded
from opsynth.synth.compose import composable, compose
from opsynth.synth.degenerate import Degenerate
from opsynth.synth.solve import _try_link

DATA_SIZED = ("torch.masked_select", "torch.nonzero")
OPERATORS = ("nn.AdaptiveLogSoftmaxWithLoss", *DATA_SIZED, "nn.ReLU", "torch.tanh")


@pytest.fixture(scope="module")
def seeds():
    from opsynth.synth.catalog.extract import seeds_in_process

    return seeds_in_process(list(OPERATORS))


def _tasks(seeds, *wanted, n=6, **settings):
    settings = {"tuple_output_share": 0.0, "container_share": 0.0, **settings}
    return compose(seeds, only(seeds, *wanted, **settings), n=n)


def test_adaptive_log_softmax_is_composed_and_runs(seeds):
    tasks = _tasks(seeds, "nn.AdaptiveLogSoftmaxWithLoss", "torch.tanh", n=8, mix={"torch#2": 1.0})
    with_it = [t for t in tasks if "nn.AdaptiveLogSoftmaxWithLoss" in t.ops]
    assert with_it, [t.ops for t in tasks]
    for task in with_it:
        out, inputs = run_task(task)
        assert [t for t in inputs.values() if t.dtype == torch.int64], task.code  # targets
    # its output's size is the batch's, not data's: it may be followed
    followed = [t for t in with_it if t.ops[-1] != "nn.AdaptiveLogSoftmaxWithLoss"]
    assert followed, [t.ops for t in with_it]


def test_an_output_sized_by_data_only_ends_a_chain(seeds):
    tasks = _tasks(seeds, "torch.masked_select", "torch.tanh", n=8, mix={"torch#2": 1.0})
    with_it = [t for t in tasks if "torch.masked_select" in t.ops]
    assert with_it, [t.ops for t in tasks]
    for task in with_it:
        assert task.ops[-1] == "torch.masked_select", task.ops
        assert task.ops.count("torch.masked_select") == 1, task.ops
        out, inputs = run_task(task)
        (result,) = [t for t in flat(out) if isinstance(t, torch.Tensor)]
        masks = [t for t in inputs.values() if t.dtype == torch.bool]
        if masks:  # the mask is an input: its count of True is the output's length
            assert result.numel() == int(masks[0].sum()), task.code


def test_without_the_setting_such_operators_are_never_composed(seeds):
    # most draws are the operators that cannot be solved, far behind their counts
    settings = {"sampled_shapes": False, "max_attempts": 1000}
    tasks = _tasks(seeds, *OPERATORS, n=12, mix={"torch#2": 1.0}, **settings)
    assert tasks
    for task in tasks:
        assert not set(task.ops) & {"nn.AdaptiveLogSoftmaxWithLoss", *DATA_SIZED}, task.ops


def test_a_sampled_link_says_whether_its_size_is_data_and_keeps_the_global_generator(seeds):
    by_name = {t.ops[0]: composable(t) for t in seeds if len(t.ops) == 1}
    state = torch.get_rng_state()
    for name, varies in (("torch.masked_select", True), ("nn.AdaptiveLogSoftmaxWithLoss", False)):
        spec = by_name[name].spec
        link = Link(name, spec, None, tuple(a.name if a.tensor else None for a in spec.args))
        meta = {name: make_tensor(arg, "meta") for name, arg in expanded(link)}
        with pytest.raises(Degenerate, match="^shape: "):
            _try_link(link, None, meta, sampled=False)
        out, _, found = _try_link(link, None, meta, sampled=True)
        assert found is varies, name
        assert all(t.is_meta for t in flat(out) if isinstance(t, torch.Tensor))
    assert torch.equal(torch.get_rng_state(), state)
