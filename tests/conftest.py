"""Shared test set-up: a private catalogue cache for the session, and one small set of real
catalogue seeds (every operator kind the composer handles) extracted once per session."""

from __future__ import annotations

import os
import tempfile

import pytest

# Operators the composer tests draw from: modules and functions, multi-input ops, an index
# and a mask input, tuple outputs, a loss with a target, padding, interpolation, attention.
TEST_OPERATORS = [
    "nn.Linear",
    "nn.Conv2d",
    "nn.ConvTranspose1d",
    "nn.BatchNorm2d",
    "nn.LayerNorm",
    "nn.LSTM",
    "nn.MaxPool2d",
    "nn.MultiheadAttention",
    "nn.MSELoss",
    "nn.Embedding",
    "F.gelu",
    "nn.Dropout",
    "F.softmax",
    "F.pad",
    "F.interpolate",
    "torch.relu",
    "torch.tanh",
    "torch.sum",
    "torch.cumsum",
    "torch.topk",
    "torch.max",
    "torch.add",
    "torch.cat",
    "torch.where",
    "torch.gather",
    "torch.bmm",
    "torch.transpose",
    "torch.exp",
]


def pytest_configure(config: pytest.Config) -> None:
    if "OPSYNTH_CACHE" not in os.environ:
        os.environ["OPSYNTH_CACHE"] = tempfile.mkdtemp(prefix="opsynth-test-cache-")


@pytest.fixture(scope="session")
def catalogue_seeds():
    from opsynth.synth.catalog.extract import seeds_in_process

    return seeds_in_process(TEST_OPERATORS)
