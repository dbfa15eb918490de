"""The hand-written torch seed catalogue: ~20 operators spanning Ops-6K's families.

Each entry states which input ranks it accepts, how it picks its arguments for an input shape
(``solve``), and what it does to the values (``effect``, see ``synth.values``), which is where
the degeneracy rules live: an op that is an identity on its input (relu of a non-negative
tensor, tanh of tiny values), one that saturates to a constant, a sum over a dim whose sum is
already fixed (after softmax or LayerNorm), a normalisation repeated back to back, a transpose
that undoes the previous one, or an exp that would overflow. The batch dim (0) is never
reduced, transposed or sized by a parameter, so it stays free for rescaling.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from synth.spec import Arg, Choice, Degenerate, Effect, Facts, SeedSpec, Shape, SolveContext
from synth.values import (
    cumsum_moments,
    logsumexp_moments,
    max_moments,
    normalised,
    pointwise_moments,
    softmax_moments,
    sum_moments,
    transposed_facts,
    values,
    weighted_sum,
)

LIBRARY = "torch"
# exp's input must plausibly stay below this: e^20 ~ 5e8 leaves float32 (max ~3.4e38) room for
# any later sums, and exp of larger values is dominated by a handful of elements anyway.
_EXP_MAX_INPUT = 20.0

Interval = Callable[[float, float, Choice], tuple[float, float]]
Pointwise = Callable[[torch.Tensor, Choice], torch.Tensor]


def _inner_dims(shape: Shape) -> list[int]:
    """Non-batch dims with at least two elements: acting along a size-1 dim is an identity or
    yields a constant."""
    return [d for d in range(1, len(shape)) if shape[d] >= 2]


def _dim_kwarg(d: int, rank: int) -> int:
    return -1 if d == rank - 1 else d


def _shuffled(ctx: SolveContext, items: list) -> list:
    items = list(items)
    ctx.rng.shuffle(items)
    return items


def _remap_after_reduce(dims: frozenset[int], d: int, keepdim: bool) -> frozenset[int]:
    kept = (x for x in dims if x != d)
    return frozenset(x if keepdim or x < d else x - 1 for x in kept)


# --- elementwise ----------------------------------------------------------------------------


def _pointwise_effect(
    f: Pointwise,
    interval: Interval,
    noop: Callable[[Facts, Choice], bool] | None,
    max_input: float | None,
) -> Effect:
    def effect(facts: Facts, choice: Choice, shape_in: Shape, shape_out: Shape) -> Facts:
        if noop is not None and noop(facts, choice):
            raise Degenerate("noop", f"identity on values in [{facts.lo}, {facts.hi}]")
        if max_input is not None and facts.phi > max_input:
            raise Degenerate("overflow", f"inputs plausibly reach {facts.phi:.3g}")
        lo, hi = interval(facts.lo, facts.hi, choice)
        plo, phi = interval(facts.plo, facts.phi, choice)
        mean, std, offset = pointwise_moments(lambda t: f(t, choice), facts)
        # nonlinear: sums are no longer fixed and a following norm is not a repeat; a pending
        # transpose survives because elementwise ops commute with it
        return values(lo, hi, plo, phi, mean, std, offset, transposed=facts.transposed)

    return effect


def _exp(x: float) -> float:
    return math.inf if x > 700 else math.exp(x)


def _sigmoid(x: float) -> float:
    if x < -700:
        return 0.0
    return 1.0 / (1.0 + _exp(-x))


def _non_negative(facts: Facts, choice: Choice) -> bool:
    return facts.lo >= 0


def _relu_range(lo: float, hi: float, c: Choice) -> tuple[float, float]:
    return max(lo, 0.0), max(hi, 0.0)


def _dipping(minimum: float) -> Interval:
    """gelu, silu, hardswish: dip to a known minimum for negatives, at most x above 0."""

    def interval(lo: float, hi: float, c: Choice) -> tuple[float, float]:
        return (minimum if lo < 0 else 0.0), max(hi, 0.0)

    return interval


def _sigmoid_range(lo: float, hi: float, c: Choice) -> tuple[float, float]:
    return _sigmoid(lo), _sigmoid(hi)


def _tanh_range(lo: float, hi: float, c: Choice) -> tuple[float, float]:
    return math.tanh(lo), math.tanh(hi)


def _abs_range(lo: float, hi: float, c: Choice) -> tuple[float, float]:
    low = 0.0 if lo < 0 < hi else min(abs(lo), abs(hi))
    return low, max(abs(lo), abs(hi))


def _clamp_range(lo: float, hi: float, c: Choice) -> tuple[float, float]:
    a, b = c.kwargs["min"], c.kwargs["max"]
    return min(max(lo, a), b), max(min(hi, b), a)


def _clamp_noop(f: Facts, c: Choice) -> bool:
    return c.kwargs["min"] <= f.lo and f.hi <= c.kwargs["max"]


def _exp_range(lo: float, hi: float, c: Choice) -> tuple[float, float]:
    return _exp(lo), _exp(hi)


def _plain(ctx: SolveContext) -> list[Choice]:
    return [Choice()]


def _clamp_solve(ctx: SolveContext) -> list[Choice]:
    bounds = [(-1.0, 1.0), (-0.5, 0.5), (0.0, 1.0), (-2.0, 2.0)]
    return [Choice(kwargs={"min": a, "max": b}) for a, b in _shuffled(ctx, bounds)]


def _pointwise(
    name: str,
    f: Pointwise,
    interval: Interval,
    *,
    noop: Callable[[Facts, Choice], bool] | None = None,
    max_input: float | None = None,
    solve=_plain,
    attr: str = "",
) -> SeedSpec:
    return SeedSpec(
        name=name,
        kind="module" if name.startswith("nn.") else "function",
        ranks=(2, 3, 4),
        shape_effect="same",
        solve=solve,
        effect=_pointwise_effect(f, interval, noop, max_input),
        attr=attr,
        library=LIBRARY,
        elementwise=True,
    )


# --- reductions and scans over one dim --------------------------------------------------------


def _reduce_solve(ctx: SolveContext) -> list[Choice]:
    rank = len(ctx.shape)
    last = ctx.min_rank_ahead == 0
    # without keepdim the rank drops by one; the result must still suit every later op, and a
    # chain may only end (never continue) below rank 2
    drop_ok = rank - 1 >= (1 if last else max(2, ctx.min_rank_ahead))
    choices = []
    for d in _shuffled(ctx, _inner_dims(ctx.shape)):
        kwargs = {"dim": _dim_kwarg(d, rank)}
        if not drop_ok:
            kwargs["keepdim"] = True
        choices.append(Choice(kwargs=kwargs, dim=d, keepdim=not drop_ok))
    return choices


def _reduction_effect(kind: str) -> Effect:
    linear = kind in ("sum", "mean")

    def effect(facts: Facts, choice: Choice, shape_in: Shape, shape_out: Shape) -> Facts:
        d, n = choice.dim, shape_in[choice.dim]
        if linear and d in facts.const_sum_dims:
            raise Degenerate("constant", f"{kind} over dim {d} whose sum is fixed")
        const = _remap_after_reduce(facts.const_sum_dims, d, choice.keepdim) if linear else None
        lo, hi, plo, phi = facts.lo, facts.hi, facts.plo, facts.phi
        if kind == "sum":
            lo, hi, plo, phi = n * lo, n * hi, n * plo, n * phi
            moments = sum_moments(facts, n)
        elif kind == "mean":
            total = sum_moments(facts, n)
            moments = (total[0] / n, total[1] / n, total[2] / n)
        elif kind == "amax":
            moments = max_moments(facts, n)
        else:  # logsumexp: between max + 0 and max + log n
            shift = math.log(n)
            lo, hi, plo, phi = lo, hi + shift, plo, phi + shift
            moments = logsumexp_moments(facts, n)
        return values(lo, hi, plo, phi, *moments, const_sum_dims=const or frozenset())

    return effect


def _reduction(name: str, kind: str, work: float, scratch: bool = False) -> SeedSpec:
    return SeedSpec(
        name=name,
        kind="function",
        ranks=(2, 3, 4),
        shape_effect="reduce",
        solve=_reduce_solve,
        effect=_reduction_effect(kind),
        library=LIBRARY,
        work=work,
        scratch=scratch,
    )


def _along_solve(ctx: SolveContext) -> list[Choice]:
    rank = len(ctx.shape)
    return [
        Choice(kwargs={"dim": _dim_kwarg(d, rank)}, dim=d)
        for d in _shuffled(ctx, _inner_dims(ctx.shape))
    ]


def _cumsum_effect(facts: Facts, choice: Choice, shape_in: Shape, shape_out: Shape) -> Facts:
    n = shape_in[choice.dim]
    lo, hi = min(facts.lo, facts.lo * n), max(facts.hi, facts.hi * n)
    plo, phi = min(facts.plo, facts.plo * n), max(facts.phi, facts.phi * n)
    # a scan along d is linear, so sums along the other dims stay fixed
    const = frozenset(x for x in facts.const_sum_dims if x != choice.dim)
    return values(lo, hi, plo, phi, *cumsum_moments(facts, n), const_sum_dims=const)


def _softmax_effect(facts: Facts, choice: Choice, shape_in: Shape, shape_out: Shape) -> Facts:
    moments = softmax_moments(facts, shape_in[choice.dim])
    return values(0.0, 1.0, 0.0, 1.0, *moments, const_sum_dims=frozenset({choice.dim}))


def _softmax(name: str) -> SeedSpec:
    return SeedSpec(
        name=name,
        kind="module" if name.startswith("nn.") else "function",
        ranks=(2, 3, 4),
        shape_effect="same",
        solve=_along_solve,
        effect=_softmax_effect,
        attr="softmax" if name.startswith("nn.") else "",
        library=LIBRARY,
        work=1.3,
    )


# --- shape ops --------------------------------------------------------------------------------


def _transpose_solve(ctx: SolveContext) -> list[Choice]:
    dims = _inner_dims(ctx.shape)
    pairs = [(a, b) for i, a in enumerate(dims) for b in dims[i + 1 :]]
    return [Choice(pos=(a, b), dims=(a, b)) for a, b in _shuffled(ctx, pairs)]


def _transpose_effect(facts: Facts, choice: Choice, shape_in: Shape, shape_out: Shape) -> Facts:
    a, b = choice.dims
    if facts.transposed == (a, b):
        raise Degenerate("noop", f"transpose({a}, {b}) undoes the previous one")
    return transposed_facts(facts, a, b)


# --- layers with weights ----------------------------------------------------------------------


def _linear_solve(ctx: SolveContext) -> list[Choice]:
    last = len(ctx.shape) - 1
    return [
        Choice(
            args=(Arg("in_features", ctx.shape[last], dim=last), Arg("out_features", f)),
            names={last: "out_features"},
        )
        for f in _shuffled(ctx, list(ctx.menus.feature_sizes))[:3]
    ]


def _linear_effect(facts: Facts, choice: Choice, shape_in: Shape, shape_out: Shape) -> Facts:
    last = len(shape_in) - 1
    # linear along the last dim: a fixed sum along any other dim stays fixed
    const = frozenset(x for x in facts.const_sum_dims if x != last)
    return weighted_sum(facts, shape_in[last], const_sum_dims=const)


def _linear_macs(choice: Choice, shape_in: Shape, shape_out: Shape) -> int:
    return math.prod(shape_out) * shape_in[-1]


def _conv_solve(ctx: SolveContext) -> list[Choice]:
    _, channels, height, width = ctx.shape
    options = [
        (oc, k, pad)
        for oc in ctx.menus.channel_sizes
        for k in (3, 5)
        for pad in (0, k // 2)
        # the output must keep at least 2x2 positions, or later spatial ops degenerate
        if min(height, width) + 2 * pad - k + 1 >= 2 and min(height, width) >= k
    ]
    choices = []
    for oc, k, pad in _shuffled(ctx, options)[:6]:
        kwargs = {"padding": pad} if pad else {}
        if not ctx.bias_allowed:
            kwargs["bias"] = False
        args = (Arg("in_channels", channels, dim=1), Arg("out_channels", oc), Arg("kernel_size", k))
        choices.append(Choice(args=args, kwargs=kwargs, names={1: "out_channels"}))
    return choices


def _conv_macs(choice: Choice, shape_in: Shape, shape_out: Shape) -> int:
    k = next(a.value for a in choice.args if a.role == "kernel_size")
    return math.prod(shape_out) * shape_in[1] * k * k


def _conv_effect(facts: Facts, choice: Choice, shape_in: Shape, shape_out: Shape) -> Facts:
    k = next(a.value for a in choice.args if a.role == "kernel_size")
    return weighted_sum(facts, shape_in[1] * k * k)


def _norm_effect(tag: Callable[[Choice, Shape], str], const: Callable[[Shape], set[int]]) -> Effect:
    def effect(facts: Facts, choice: Choice, shape_in: Shape, shape_out: Shape) -> Facts:
        own = tag(choice, shape_in)
        if facts.norm == own:
            raise Degenerate("noop", f"{own} normalisation right after the same one")
        return normalised(facts, const_sum_dims=frozenset(const(shape_in)), norm=own)

    return effect


def _layer_norm_solve(ctx: SolveContext) -> list[Choice]:
    last = len(ctx.shape) - 1
    if ctx.shape[last] < 2:
        return []
    return [Choice(args=(Arg("normalized_shape", ctx.shape[last], dim=last),), dim=last)]


def _group_norm_solve(ctx: SolveContext) -> list[Choice]:
    channels, spatial = ctx.shape[1], math.prod(ctx.shape[2:])
    groups = [
        g
        for g in (1, 2, 4, 8, 16, 32)
        # each group needs 2+ elements; g == channels would centre each channel on its own
        if channels % g == 0 and (channels // g) * spatial >= 2 and (g < channels or g == 1)
    ]
    return [
        Choice(args=(Arg("num_groups", g), Arg("num_channels", channels, dim=1)))
        for g in _shuffled(ctx, groups)
    ]


def _batch_norm_solve(ctx: SolveContext) -> list[Choice]:
    return [Choice(args=(Arg("num_features", ctx.shape[1], dim=1),))]


def _pool_solve(ctx: SolveContext) -> list[Choice]:
    size = min(ctx.shape[2:])
    kernels = [k for k in (2, 3) if size >= 2 * k]
    return [Choice(args=(Arg("pool_kernel_size", k),)) for k in _shuffled(ctx, kernels)]


def _pool_window(choice: Choice) -> int:
    return choice.args[0].value ** 2


def _max_pool_effect(facts: Facts, choice: Choice, shape_in: Shape, shape_out: Shape) -> Facts:
    moments = max_moments(facts, _pool_window(choice))
    return values(facts.lo, facts.hi, facts.plo, facts.phi, *moments)


def _avg_pool_effect(facts: Facts, choice: Choice, shape_in: Shape, shape_out: Shape) -> Facts:
    n = _pool_window(choice)
    mean, std, offset = sum_moments(facts, n)
    # averaging over space is linear and keeps the channel dim, so a fixed channel sum survives
    const = frozenset(facts.const_sum_dims & {1})
    return values(
        facts.lo,
        facts.hi,
        facts.plo,
        facts.phi,
        mean / n,
        std / n,
        offset / n,
        const_sum_dims=const,
    )


def _layer(name: str, attr: str, ranks: tuple[int, ...], **kwargs) -> SeedSpec:
    return SeedSpec(name=name, kind="module", ranks=ranks, attr=attr, library=LIBRARY, **kwargs)


def torch_specs() -> list[SeedSpec]:
    """The torch seed catalogue, in a fixed order (draws depend on it). ``work``/``mac_work``
    weights were measured on an idle 2-core CPU relative to relu and nn.Linear."""
    return [
        _pointwise("F.gelu", lambda t, c: F.gelu(t), _dipping(-0.17)),
        _pointwise("torch.relu", lambda t, c: t.relu(), _relu_range, noop=_non_negative),
        _pointwise("torch.sigmoid", lambda t, c: t.sigmoid(), _sigmoid_range),
        _pointwise("torch.tanh", lambda t, c: t.tanh(), _tanh_range),
        _pointwise("F.silu", lambda t, c: F.silu(t), _dipping(-0.279)),
        _pointwise("nn.Hardswish", lambda t, c: F.hardswish(t), _dipping(-0.375), attr="hardswish"),
        _pointwise("torch.abs", lambda t, c: t.abs(), _abs_range, noop=_non_negative),
        _pointwise(
            "torch.clamp",
            lambda t, c: t.clamp(c.kwargs["min"], c.kwargs["max"]),
            _clamp_range,
            noop=_clamp_noop,
            solve=_clamp_solve,
        ),
        _pointwise(
            "torch.exp",
            lambda t, c: t.clamp(max=_EXP_MAX_INPUT).exp(),
            _exp_range,
            max_input=_EXP_MAX_INPUT,
        ),
        _reduction("torch.sum", "sum", work=0.7),
        _reduction("torch.mean", "mean", work=0.7),
        _reduction("torch.amax", "amax", work=1.4),
        _reduction("torch.logsumexp", "logsumexp", work=1.9, scratch=True),
        SeedSpec(
            name="torch.cumsum",
            kind="function",
            ranks=(2, 3, 4),
            shape_effect="same",
            solve=_along_solve,
            effect=_cumsum_effect,
            library=LIBRARY,
            work=1.6,
        ),
        _softmax("torch.softmax"),
        _softmax("nn.Softmax"),
        SeedSpec(
            name="torch.transpose",
            kind="function",
            ranks=(3, 4),
            shape_effect="transpose",
            solve=_transpose_solve,
            effect=_transpose_effect,
            library=LIBRARY,
            work=0.0,  # a view: the cost lands on whichever op reads it next
        ),
        _layer(
            "nn.Linear",
            "linear",
            (2, 3, 4),
            shape_effect="resize",
            solve=_linear_solve,
            effect=_linear_effect,
            macs=_linear_macs,
            learnable=True,
        ),
        _layer(
            "nn.Conv2d",
            "conv",
            (4,),
            shape_effect="resize",
            solve=_conv_solve,
            effect=_conv_effect,
            macs=_conv_macs,
            mac_work=1.4,
            learnable=True,
            per_channel_bias=True,
        ),
        _layer(
            "nn.LayerNorm",
            "layer_norm",
            (2, 3, 4),
            shape_effect="same",
            solve=_layer_norm_solve,
            effect=_norm_effect(lambda c, s: f"layer:{len(s) - 1}", lambda s: {len(s) - 1}),
            learnable=True,
            work=1.0,
        ),
        _layer(
            "nn.GroupNorm",
            "group_norm",
            (2, 3, 4),
            shape_effect="same",
            solve=_group_norm_solve,
            effect=_norm_effect(
                lambda c, s: f"group:{c.args[0].value}", lambda s: {1} if len(s) == 2 else set()
            ),
            learnable=True,
            work=2.0,
        ),
        _layer(
            "nn.BatchNorm2d",
            "batch_norm",
            (4,),
            shape_effect="same",
            solve=_batch_norm_solve,
            effect=_norm_effect(lambda c, s: "batch", lambda s: set()),
            learnable=True,
            centers_channels=True,
            work=2.6,
        ),
        _layer(
            "nn.MaxPool2d",
            "max_pool",
            (4,),
            shape_effect="resize",
            solve=_pool_solve,
            effect=_max_pool_effect,
            work=5.7,
        ),
        _layer(
            "nn.AvgPool2d",
            "avg_pool",
            (4,),
            shape_effect="resize",
            solve=_pool_solve,
            effect=_avg_pool_effect,
            work=1.6,
        ),
    ]
