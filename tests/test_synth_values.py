"""The value model that refuses identities, constants and overflow before code exists."""

from __future__ import annotations

import math
import random

import pytest
import torch

from opsynth.config import ComposeConfig
from synth.seeds import get_library
from synth.shapes import solve_chain
from synth.values import (
    Degenerate,
    Facts,
    max_moments,
    pointwise_moments,
    softmax_moments,
    sum_moments,
)

SPECS = {s.name: s for s in get_library("torch").specs()}
CFG = ComposeConfig()


def test_quadrature_matches_closed_forms():
    mean, std, offset = pointwise_moments(torch.relu, Facts())
    # relu's kink limits Gauss-Hermite to ~1%; smooth functions are exact
    assert mean == pytest.approx(1 / math.sqrt(2 * math.pi), rel=2e-2)
    assert std == pytest.approx(math.sqrt(0.5 - 1 / (2 * math.pi)), rel=2e-2)
    assert offset == pytest.approx(0.0, abs=1e-9)
    mean, std, _ = pointwise_moments(torch.exp, Facts(std=0.5))
    assert mean == pytest.approx(math.exp(0.125), rel=1e-6)
    assert std == pytest.approx(math.sqrt(math.expm1(0.25) * math.exp(0.25)), rel=1e-4)


def test_position_offsets_are_kept_apart_from_input_variation():
    mean, std, offset = pointwise_moments(lambda t: 2 * t + 1, Facts(std=0.5, offset=2.0))
    assert (mean, std, offset) == pytest.approx((1.0, 1.0, 4.0), rel=1e-6)


def test_near_identities_and_saturation_are_caught():
    with pytest.raises(Degenerate, match="noop"):
        pointwise_moments(torch.tanh, Facts(std=1e-3))
    mean, std, _ = pointwise_moments(torch.sigmoid, Facts(mean=12.0, std=0.5))
    assert std / mean < 1e-3


def test_reductions_concentrate_biased_values():
    positive = Facts(lo=0.0, mean=1.0, std=0.5)
    mean, std, _ = sum_moments(positive, 10_000)
    assert std / mean == pytest.approx(0.005)
    assert softmax_moments(Facts(std=1e-3), 1024)[1] * 1024 < 1e-2
    clamped = Facts(lo=-1.0, hi=1.0, mean=0.0, std=0.6)
    assert max_moments(clamped, 1024)[1] < 1e-6


@pytest.mark.parametrize(
    "names",
    [
        ["torch.softmax", "nn.Softmax", "torch.softmax"],
        ["torch.exp", "torch.exp"],
        ["torch.sigmoid", "torch.sigmoid", "torch.sigmoid", "torch.sigmoid"],
    ],
)
def test_near_constant_or_overflowing_chains_are_refused(names):
    for seed in range(5):
        with pytest.raises(Degenerate):
            solve_chain([SPECS[n] for n in names], random.Random(seed), CFG, enforce_window=False)
