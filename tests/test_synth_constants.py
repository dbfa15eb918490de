"""``compose.constant_operands``: tensor constructors that take no tensor (``torch.arange``,
``torch.linspace``, ``torch.scalar_tensor``) are composed after the first operator as a
constant sized to the running tensor's last dim, built on its device and applied with ``*``
or ``+``; off, none is composed. Composed code runs test-side only."""

from __future__ import annotations

import random
import re

import pytest
import torch
from test_synth_compose import flat, load, only, run_task

from opsynth.config import ComposeConfig
from opsynth.synth.compose import composable, compose
from opsynth.synth.constants import CONSTANTS, is_constant, sized
from opsynth.synth.degenerate import Degenerate, check_sample
from opsynth.synth.solve import Solver

CONSTRUCTORS = tuple(CONSTANTS)
OTHERS = ("nn.ReLU", "torch.tanh", "nn.Linear", "nn.LayerNorm")
# a constant as the task writes it: ``x * torch.arange(64, device=x.device)``
APPLIED = re.compile(
    r"x (?P<op>[*+]) (?P<call>torch\.(?:arange|linspace|scalar_tensor)\([^()]*device=x\.device\))"
)


@pytest.fixture(scope="module")
def seeds():
    from opsynth.synth.catalog.extract import seeds_in_process

    return seeds_in_process([*CONSTRUCTORS, *OTHERS])


def _tasks(seeds, *wanted, n=8, **settings):
    settings = {"tuple_output_share": 0.0, "container_share": 0.0, **settings}
    settings.setdefault("mix", {"torch#2": 0.5, "torch#3": 0.5})
    return compose(seeds, only(seeds, *wanted, **settings), n=n)


def _seed(seeds, name):
    return next(composable(t) for t in seeds if t.ops == [name])


@pytest.mark.parametrize("op", CONSTRUCTORS)
def test_each_constructor_is_composed_after_the_first_operator_and_runs(seeds, op):
    tasks = _tasks(seeds, op, "nn.ReLU", "torch.tanh")
    with_it = [t for t in tasks if op in t.ops]
    assert with_it, [t.ops for t in tasks]
    for task in with_it:
        assert task.ops[0] != op and task.ops.count(op) == 1, task.ops
        applied = APPLIED.findall(task.code)
        assert len(applied) == 1 and applied[0][1].startswith(op), task.code
        out, inputs = run_task(task)
        (result,) = [t for t in flat(out) if isinstance(t, torch.Tensor)]
        assert result.dtype == torch.float32, task.code


def test_the_constant_is_sized_to_the_running_tensors_last_dim(seeds):
    for op, size in (("torch.arange", "end"), ("torch.linspace", "steps")):
        spec = sized(_seed(seeds, op).spec, (2, 3, 7))
        assert {a.name: a.value for a in spec.args}[size] == 7, spec
    scalar = _seed(seeds, "torch.scalar_tensor").spec
    assert sized(scalar, (2, 3, 7)) == scalar


def test_the_constant_changes_the_output(seeds):
    tasks = _tasks(seeds, *CONSTRUCTORS, "nn.ReLU", "torch.tanh", "nn.Linear", n=10)
    with_one = [t for t in tasks if set(t.ops) & set(CONSTRUCTORS)]
    assert with_one, [t.ops for t in tasks]
    for task in with_one:
        out, _ = run_task(task)
        (without, count) = APPLIED.subn("x", task.code)
        assert count == 1, task.code
        other, _ = run_task(task, without)
        assert not torch.allclose(flat(out)[0], flat(other)[0]), task.code


def test_the_constant_is_built_on_the_device_the_call_runs_on(seeds):
    """On meta (as on a GPU), a constant built on the CPU beside the model's device fails."""
    tasks = _tasks(seeds, "torch.arange", "torch.linspace", "nn.ReLU", "nn.Linear", n=8)
    with_one = [t for t in tasks if {"torch.arange", "torch.linspace"} & set(t.ops)]
    assert with_one, [t.ops for t in tasks]
    for task in with_one:
        model, inputs = load(task.code)
        model = model.to("meta")
        with torch.no_grad():
            out = model(*(t.to("meta") for t in inputs.values()))
        assert all(t.is_meta for t in flat(out)), task.code
        on_cpu, _ = load(task.code.replace(", device=x.device)", ")"))
        with pytest.raises(RuntimeError), torch.no_grad():
            on_cpu.to("meta")(*(t.to("meta") for t in inputs.values()))


def test_a_constant_is_never_first_nor_alone_and_one_per_chain(seeds):
    tasks = _tasks(seeds, *CONSTRUCTORS, *OTHERS, n=10, mix={"torch#1": 0.3, "torch#3": 0.7})
    assert any(set(t.ops) & set(CONSTRUCTORS) for t in tasks), [t.ops for t in tasks]
    for task in tasks:
        assert task.ops[0] not in CONSTRUCTORS, task.ops
        assert len(set(task.ops) & set(CONSTRUCTORS)) <= 1, task.ops
        assert len(APPLIED.findall(task.code)) == sum(o in CONSTRUCTORS for o in task.ops)


def test_a_constant_whose_length_follows_the_batch_is_refused(seeds):
    """A rank-1 input is all batch: arange over its length would not resize."""
    cfg = ComposeConfig()
    relu, arange = _seed(seeds, "nn.ReLU"), _seed(seeds, "torch.arange")
    with pytest.raises(Degenerate, match="^batch: "):
        Solver(cfg, random.Random(0)).solve([relu, arange], rank=1)
    assert Solver(cfg, random.Random(0)).solve([relu, arange], rank=2).links[1].combine


def test_a_constant_a_later_operator_undoes_is_refused(seeds):
    """A layer norm over the last dim takes out a scalar's scale or shift."""
    cfg = ComposeConfig()
    chain_seeds = [_seed(seeds, n) for n in ("torch.tanh", "torch.scalar_tensor", "nn.LayerNorm")]
    chain = Solver(cfg, random.Random(0)).solve(chain_seeds, rank=3)
    assert chain.links[1].combine
    with pytest.raises(Degenerate, match="^constant_ignored: "):
        check_sample(chain, cfg)


def test_without_the_setting_no_constructor_is_composed(seeds):
    assert all(is_constant(_seed(seeds, op).spec) for op in CONSTRUCTORS)
    tasks = _tasks(seeds, *CONSTRUCTORS, *OTHERS, n=12, constant_operands=False)
    assert tasks
    for task in tasks:
        assert not set(task.ops) & set(CONSTRUCTORS), task.ops
        assert not APPLIED.search(task.code), task.code


def test_the_setting_changes_only_chains_a_constructor_is_drawn_into(seeds):
    """With the constructors weighing nothing, both settings draw the same tasks: the setting
    consumes no random number where it composes no constant."""
    weights = {op: 0.0 for op in CONSTRUCTORS}
    made = {
        setting: compose(
            seeds,
            ComposeConfig(
                profile="uniform",
                op_weights=weights,
                constant_operands=setting,
                mix={"torch#2": 0.5, "torch#3": 0.5},
            ),
            n=8,
        )
        for setting in (True, False)
    }
    assert [t.id for t in made[True]] == [t.id for t in made[False]]
