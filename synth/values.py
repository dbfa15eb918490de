"""What is known about a running tensor's values, to refuse degenerate chains before any code
exists.

Three kinds of knowledge are tracked:

* an exact interval ``[lo, hi]`` by interval arithmetic, which proves identities (relu of a
  non-negative tensor) and constants;
* a plausible interval ``[plo, phi]`` (the same arithmetic started from randn's ~6-sigma range)
  that guards exp against overflow even for heavy-tailed inputs;
* moments: ``mean``, ``std`` (how much an element varies with the input) and ``offset`` (how
  much element means vary across positions, from fixed weights or scan positions). A task whose
  input-driven ``std`` is tiny next to the values' size could be passed by a kernel that ignores
  its input, so the composer refuses it (``spread``). Elementwise ops get their moments by
  2-D Gauss-Hermite quadrature of their math function over (position, input) - a few hundred
  float64 points, no generated code involved.

Structural facts ride along: dims whose sum is fixed (after softmax or LayerNorm), the
normalisation just applied, and the last transpose not yet followed by a non-elementwise op.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch


class Degenerate(Exception):
    """A candidate operator or parameter choice would make the chain degenerate; ``reason`` is a
    stable code such as ``noop`` or ``constant`` so rejection statistics can be counted."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


# randn over up to ~1e9 elements stays within +-6 sigma.
PLAUSIBLE_SIGMAS = 6.0
# f(x) this close to x (relative mean square) is an identity in practice.
IDENTITY_TOL = 1e-4
# values plausibly beyond this are refused: float32 overflows at ~3.4e38 and later sums need room.
PLAUSIBLE_LIMIT = 1e30
# Gauss-Hermite nodes per axis: exact for smooth f, ~1% for kinks such as relu's.
_NODES = 40


def _gauss_hermite(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Nodes and weights with sum(w * f(z)) ~ E[f(Z)], Z ~ N(0, 1) (Golub-Welsch)."""
    k = torch.arange(1, n, dtype=torch.float64)
    jacobi = torch.diag(k.sqrt(), 1) + torch.diag(k.sqrt(), -1)
    nodes, vectors = torch.linalg.eigh(jacobi)
    weights = vectors[0] ** 2
    return nodes, weights / weights.sum()


_Z, _W = _gauss_hermite(_NODES)
_Z_POS, _Z_IN = _Z[:, None], _Z[None, :]
_W_POS, _W_IN = _W[:, None], _W[None, :]


@dataclass(frozen=True)
class Facts:
    lo: float = -math.inf
    hi: float = math.inf
    plo: float = -PLAUSIBLE_SIGMAS
    phi: float = PLAUSIBLE_SIGMAS
    mean: float = 0.0
    std: float = 1.0
    offset: float = 0.0
    const_sum_dims: frozenset[int] = frozenset()
    norm: str = ""
    transposed: tuple[int, int] | None = None

    @property
    def rms(self) -> float:
        return math.sqrt(self.mean**2 + self.std**2 + self.offset**2)

    @property
    def spread(self) -> float:
        """Input-driven std relative to the values' rms: near 0 means near input-independent."""
        rms = self.rms
        return self.std / rms if rms > 0 else 0.0

    @property
    def total_std(self) -> float:
        return math.hypot(self.std, self.offset)


def values(
    lo: float,
    hi: float,
    plo: float,
    phi: float,
    mean: float,
    std: float,
    offset: float = 0.0,
    **structure,
) -> Facts:
    """Facts with the plausible range clipped to the exact one; refuses exact constants."""
    if lo == hi:
        raise Degenerate("constant", f"every element is {lo}")
    plo, phi = max(plo, lo), min(phi, hi)
    return Facts(lo, hi, min(plo, phi), max(plo, phi), mean, std, offset, **structure)


def gaussian(mean: float, std: float, offset: float = 0.0, **structure) -> Facts:
    """Roughly Gaussian values (after a weighted sum or a normalisation)."""
    total = math.hypot(std, offset)
    reach = PLAUSIBLE_SIGMAS * total
    return values(-math.inf, math.inf, mean - reach, mean + reach, mean, std, offset, **structure)


def pointwise_moments(
    f: Callable[[torch.Tensor], torch.Tensor], facts: Facts
) -> tuple[float, float, float]:
    """(mean, std, offset) of f(x) for x = mean + offset * z_pos + std * z_in, by quadrature.

    Raises Degenerate("noop") when f is an identity in practice on these values.
    """
    x = facts.mean + facts.offset * _Z_POS + facts.std * _Z_IN
    with torch.no_grad():
        y = f(x)
    y = torch.nan_to_num(y, posinf=1e30, neginf=-1e30)
    per_position = (y * _W_IN).sum(1, keepdim=True)
    mean = float((per_position * _W_POS).sum())
    offset_var = float(((per_position - mean) ** 2 * _W_POS).sum())
    input_var = float((((y - per_position) ** 2) * _W_IN * _W_POS).sum())
    mismatch = float((((y - x) ** 2) * _W_IN * _W_POS).sum())
    energy = float(((x**2) * _W_IN * _W_POS).sum())
    if mismatch <= IDENTITY_TOL * energy:
        raise Degenerate("noop", "an identity on these values")
    return mean, math.sqrt(max(input_var, 0.0)), math.sqrt(max(offset_var, 0.0))


def expected_max(n: int) -> tuple[float, float]:
    """Mean and std of the max of n standard normals (Gumbel approximation, n >= 2)."""
    root = math.sqrt(2 * math.log(n))
    loc = root - (math.log(math.log(n)) + math.log(4 * math.pi)) / (2 * root)
    return max(loc, 0.0), math.pi / (math.sqrt(6) * root)


def sum_moments(facts: Facts, n: int) -> tuple[float, float, float]:
    """Sum of n elements along a dim (independent inputs, independent position offsets)."""
    root = math.sqrt(n)
    return n * facts.mean, root * facts.std, root * facts.offset


def cumsum_moments(facts: Facts, n: int) -> tuple[float, float, float]:
    """Prefix sums over n positions: position k has mean k*mean and input std sqrt(k)*std."""
    avg_k = (n + 1) / 2
    mean = facts.mean * avg_k
    offset_var = facts.mean**2 * (n * n - 1) / 12 + avg_k * facts.offset**2
    return mean, math.sqrt(avg_k) * facts.std, math.sqrt(offset_var)


def max_moments(facts: Facts, n: int) -> tuple[float, float, float]:
    """Max over n elements: driven by the largest of n draws of the total variation. With a
    finite exact ceiling (a clamp), the max sits on it whenever one of the n draws reaches it,
    which for large n is nearly always: the pinned share carries no input information."""
    loc, scale = expected_max(n)
    total = facts.total_std
    share = facts.std / total if total > 0 else 0.0
    mean = facts.mean + loc * total
    std, offset = scale * facts.std * share, scale * facts.offset
    if math.isfinite(facts.hi) and total > 0:
        reach = 0.5 * math.erfc((facts.hi - facts.mean) / (total * math.sqrt(2)))
        pinned = -math.expm1(n * math.log1p(-min(reach, 1 - 1e-12)))
        mean = pinned * facts.hi + (1 - pinned) * min(mean, facts.hi)
        std, offset = std * (1 - pinned), offset * (1 - pinned)
    return mean, std, offset


def logsumexp_moments(facts: Facts, n: int) -> tuple[float, float, float]:
    """log(sum(exp)) over n: a smoothed sum while var < log n (relative fluctuation of a sum
    of n lognormals), a smoothed max beyond."""
    var = facts.total_std**2
    if var >= math.log(n):
        mean, std, offset = max_moments(facts, n)
        return mean + math.log(2.0), std, offset
    std = math.sqrt(math.expm1(facts.std**2) / n)
    offset = math.sqrt(math.expm1(facts.offset**2) / n)
    return facts.mean + math.log(n) + var / 2, std, offset


def softmax_moments(facts: Facts, n: int) -> tuple[float, float, float]:
    """exp(x_i) / sum(exp(x)): mean 1/n; relative spread that of a lognormal."""
    input_rel = math.sqrt(math.expm1(min(facts.std**2, 50.0)))
    position_rel = math.sqrt(math.expm1(min(facts.offset**2, 50.0)))
    return 1.0 / n, input_rel / n, position_rel / n


def weighted_sum(facts: Facts, fan_in: int, **structure) -> Facts:
    """nn.Linear / nn.Conv2d with PyTorch's default init: weights U(+-1/sqrt(fan_in)) have
    variance 1/(3 fan_in), so E[y^2] = E[x^2]/3; fixed weights turn the input's mean and
    position offsets into position offsets of the output, and the bias adds its own."""
    std = facts.std / math.sqrt(3)
    offset = math.sqrt((facts.mean**2 + facts.offset**2) / 3 + 1 / (3 * fan_in))
    return gaussian(0.0, std, offset, **structure)


def normalised(facts: Facts, **structure) -> Facts:
    """A normalisation divides by the total variation: an input-independent pattern stays one."""
    total = facts.total_std
    if total <= 0:
        raise Degenerate("constant", "normalising a constant")
    return gaussian(0.0, facts.std / total, facts.offset / total, **structure)


def transposed_facts(facts: Facts, a: int, b: int) -> Facts:
    swap = {a: b, b: a}
    dims = frozenset(swap.get(d, d) for d in facts.const_sum_dims)
    return replace(facts, const_sum_dims=dims, norm="", transposed=(a, b))
