"""A transformers seed's batch as a ``batch_size`` the sizing stage can scale."""

from __future__ import annotations

import types

import torch

from opsynth.filters.sizing import find_knob, set_knob
from opsynth.synth.standalone import with_batch_knob

SEED = '''"""transformers layer: a pooler."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)

    def forward(self, hidden_states, extra):
        return self.dense(hidden_states[:, 0]) + extra.sum(dim=1)


hidden_states_shape = (2, 16, 32)
extra_shapes = [(2, 4, 32), (2, 8, 32)]


def get_inputs():
    return [torch.randn(hidden_states_shape), torch.randn(extra_shapes[0])]


def get_init_inputs():
    return [32]
'''


def run(code: str) -> torch.Tensor:
    module = types.ModuleType("seed")
    exec(code, module.__dict__)
    model = module.Model(*module.get_init_inputs())
    with torch.no_grad():
        return model(*module.get_inputs())


def test_the_common_leading_dim_becomes_the_knob() -> None:
    code = with_batch_knob(SEED)
    assert "batch_size = 2\nhidden_states_shape = (batch_size, 16, 32)\n" in code
    assert "extra_shapes = [(batch_size, 4, 32), (batch_size, 8, 32)]" in code
    knob = find_knob(code, ["batch_size"])
    assert knob is not None and knob.value == 2
    assert run(code).shape == run(SEED).shape == (2, 32)
    assert run(set_knob(code, knob, 8)).shape == (8, 32)


def test_code_without_one_common_batch_is_left_as_it_is() -> None:
    mixed = SEED.replace("(2, 8, 32)", "(3, 8, 32)")
    named = SEED.replace("hidden_states_shape = ", "batch_size = 2\nhidden_states_shape = ")
    computed = SEED.replace("(2, 16, 32)", "(1 + 1, 16, 32)").replace(
        "extra_shapes = [(2, 4, 32), (2, 8, 32)]", ""
    )
    for code in (mixed, named, computed, "# no shapes\n", "def broken(:\n"):
        assert with_batch_knob(code) == code
