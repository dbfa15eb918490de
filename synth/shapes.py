"""Shape solving by real propagation on the ``meta`` device.

Only our own seed operators are run here, on meta tensors (shapes, no data, no compute), to
learn each operator's output shape for the arguments its ``solve`` proposed; generated code is
never executed. A chain is solved greedily: pick an input rank and shape, then for each
operator the first proposed argument set that propagates and passes the value rules. If the
running rank does not suit the next operator, a minimal adapter is inserted and recorded.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from opsynth.config import ComposeConfig
from synth.cost import fit_batch, step_ms
from synth.spec import Choice, Degenerate, Facts, Menus, SeedSpec, Shape, SolveContext
from synth.values import PLAUSIBLE_LIMIT

_ROOTS = {"torch": torch, "nn": torch.nn, "F": torch.nn.functional}


@dataclass(frozen=True)
class Adapter:
    """A minimal shape fix inserted before an operator whose rank the running tensor lacks."""

    name: str
    from_rank: int
    to_rank: int
    code: str
    apply: Callable[[torch.Tensor], torch.Tensor]
    new_dim: int


ADAPTERS: dict[tuple[int, int], Adapter] = {
    (3, 4): Adapter("unsqueeze_channel", 3, 4, "x = x.unsqueeze(1)", lambda x: x.unsqueeze(1), 1),
}


@dataclass(frozen=True)
class Step:
    spec: SeedSpec
    choice: Choice
    shape_in: Shape
    shape_out: Shape
    adapter: Adapter | None = None


@dataclass(frozen=True)
class Chain:
    """A solved chain: input shape, each operator with its arguments and shapes, final facts
    and the estimated CPU eager forward time."""

    input_shape: Shape
    steps: tuple[Step, ...]
    facts: Facts
    est_ms: float = 0.0

    @property
    def output_shape(self) -> Shape:
        return self.steps[-1].shape_out

    @property
    def batch(self) -> int:
        return self.input_shape[0]


def resolve(name: str):
    """``nn.Conv2d`` -> torch.nn.Conv2d, ``F.gelu`` -> torch.nn.functional.gelu, ``torch.x``."""
    prefix, _, attr = name.partition(".")
    if prefix not in _ROOTS or not attr:
        raise ValueError(f"operator {name!r} is not of the form torch.x, nn.X or F.x")
    return getattr(_ROOTS[prefix], attr)


def propagate(spec: SeedSpec, choice: Choice, shape: Shape) -> Shape:
    """Output shape of one operator on a meta tensor; raises Degenerate if torch refuses it.
    Results are memoised: meta kernels cost milliseconds and draws repeat (op, args, shape)."""
    key = (
        spec.library,
        spec.name,
        tuple(a.value for a in choice.args),
        tuple(sorted(choice.kwargs.items())),
        choice.pos,
        shape,
    )
    if key not in _PROPAGATED:
        if len(_PROPAGATED) >= _PROPAGATED_MAX:
            _PROPAGATED.clear()
        try:
            _PROPAGATED[key] = _propagate(spec, choice, shape)
        except Degenerate as exc:
            _PROPAGATED[key] = exc
    result = _PROPAGATED[key]
    if isinstance(result, Degenerate):
        raise result
    return result


_PROPAGATED: dict[tuple, Shape | Degenerate] = {}
_PROPAGATED_MAX = 100_000


def _propagate(spec: SeedSpec, choice: Choice, shape: Shape) -> Shape:
    x = torch.empty(shape, device="meta")
    try:
        target = resolve(spec.name)
        if spec.kind == "module":
            with torch.device("meta"):
                module = target(*[a.value for a in choice.args], **choice.kwargs)
            y = module(x)
        else:
            y = target(x, *choice.pos, **choice.kwargs)
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        raise Degenerate("shape", f"{spec.name}: {exc}") from exc
    if not isinstance(y, torch.Tensor) or not y.dtype.is_floating_point:
        raise Degenerate("dtype", f"{spec.name} does not return a float tensor")
    if y.numel() == 0:
        raise Degenerate("shape", f"{spec.name} returns an empty tensor")
    return tuple(y.shape)


def draw_input_shape(rank: int, batch: int, rng: random.Random, cfg: ComposeConfig) -> Shape:
    if rank == 2:
        return (batch, rng.choice(cfg.feature_sizes))
    if rank == 3:
        return (batch, rng.choice(cfg.seq_lens), rng.choice(cfg.feature_sizes))
    if rank == 4:
        return (
            batch,
            rng.choice(cfg.channel_sizes),
            rng.choice(cfg.spatial_sizes),
            rng.choice(cfg.spatial_sizes),
        )
    raise ValueError(f"no input shape family for rank {rank}")


def _rank_floor(specs: Sequence[SeedSpec]) -> int:
    """The rank the running tensor must keep for every operator in ``specs`` to accept it;
    ranks never grow along a chain, so it is the largest of their smallest accepted ranks."""
    return max((min(s.ranks) for s in specs), default=0)


def _adapt(rank: int, spec: SeedSpec) -> Adapter:
    for target in spec.ranks:
        adapter = ADAPTERS.get((rank, target))
        if adapter is not None:
            return adapter
    raise Degenerate("rank", f"{spec.name} takes ranks {spec.ranks}, the tensor has rank {rank}")


def _adapt_facts(facts: Facts, adapter: Adapter) -> Facts:
    shifted = frozenset(d + 1 if d >= adapter.new_dim else d for d in facts.const_sum_dims)
    return replace(facts, const_sum_dims=shifted, norm="", transposed=None)


def _check_values(facts: Facts, spec: SeedSpec, cfg: ComposeConfig) -> None:
    """Refusals that apply whatever the operator: values too large, or too little driven by the
    input for an evaluator's tolerance to tell the task from a constant."""
    if max(abs(facts.plo), abs(facts.phi)) > PLAUSIBLE_LIMIT:
        raise Degenerate("overflow", f"values plausibly reach {facts.phi:.3g} after {spec.name}")
    if facts.rms > cfg.max_rms:
        raise Degenerate("magnitude", f"rms ~{facts.rms:.3g} after {spec.name}")
    if facts.spread < cfg.min_spread:
        raise Degenerate("constant", f"input-driven spread {facts.spread:.2g} after {spec.name}")


def _solve_from(
    specs: Sequence[SeedSpec], shape: Shape, rng: random.Random, cfg: ComposeConfig
) -> Chain:
    menus = Menus(cfg.feature_sizes, cfg.channel_sizes)
    facts, steps, current = Facts(), [], shape
    for i, spec in enumerate(specs):
        adapter = None
        if len(current) not in spec.ranks:
            adapter = _adapt(len(current), spec)
            current = tuple(adapter.apply(torch.empty(current, device="meta")).shape)
            facts = _adapt_facts(facts, adapter)
        following = specs[i + 1 :]
        ctx = SolveContext(
            shape=current,
            rng=rng,
            facts=facts,
            min_rank_ahead=_rank_floor(following),
            bias_allowed=not (following and following[0].centers_channels),
            menus=menus,
        )
        last_error = Degenerate("unsolvable", f"{spec.name} has no arguments for {current}")
        for choice in spec.solve(ctx):
            try:
                out = propagate(spec, choice, current)
                if out[0] != current[0]:
                    raise Degenerate("batch", f"{spec.name} changes the batch dim")
                new_facts = spec.effect(facts, choice, current, out)
                _check_values(new_facts, spec, cfg)
            except Degenerate as exc:
                last_error = exc
                continue
            steps.append(Step(spec, choice, current, out, adapter))
            facts, current = new_facts, out
            break
        else:
            raise last_error
    return Chain(shape, tuple(steps), facts, estimate_ms(steps, cfg))


def peak_elements(chain: Chain) -> tuple[int, int]:
    """Elements of the input and of the largest tensor an op creates in forward."""
    created = max(
        max(math.prod(s.shape_out), math.prod(s.shape_in) if s.spec.scratch else 0)
        for s in chain.steps
    )
    return math.prod(chain.input_shape), created


def estimate_ms(steps: Sequence[Step], cfg: ComposeConfig) -> float:
    return sum(step_ms(s.spec, s.choice, s.shape_in, s.shape_out, cfg) for s in steps)


def rebatch(chain: Chain, batch: int, cfg: ComposeConfig) -> Chain:
    """The same chain at another batch size. Every operator was checked to keep dim 0 as the
    batch (``_solve_from``), so only dim 0 of each recorded shape changes."""

    def at(shape: Shape) -> Shape:
        return (batch, *shape[1:])

    steps = tuple(
        replace(s, shape_in=at(s.shape_in), shape_out=at(s.shape_out)) for s in chain.steps
    )
    return Chain(at(chain.input_shape), steps, chain.facts, estimate_ms(steps, cfg))


def solve_chain(
    specs: Sequence[SeedSpec],
    rng: random.Random,
    cfg: ComposeConfig,
    *,
    start_rank: int | None = None,
    enforce_window: bool = True,
) -> Chain:
    """Solve argument choices and shapes for ``specs`` applied in order, with the batch fitted
    to ``cfg.target_forward_ms``. Raises Degenerate (with the last reason) when no input shape
    among ``cfg.shape_attempts`` gives a valid chain inside ``cfg.forward_window_ms``.

    The input rank is ``start_rank`` if given, else one the first operator accepts that keeps
    every later operator satisfiable without adapters (adapters only when no such rank exists).
    ``enforce_window=False`` keeps a chain whose best batch still misses the window (a lone
    view op such as transpose costs ~nothing at any size); seed tasks need one per operator.
    """
    if not specs:
        raise ValueError("solve_chain needs at least one operator")
    if start_rank is not None:
        ranks = [start_rank]
    else:
        floor = _rank_floor(specs)
        ranks = [r for r in specs[0].ranks if r >= floor] or list(specs[0].ranks)
    lo_batch = cfg.batch_range[0]
    error = Degenerate("unsolvable", "no attempt made")
    for _ in range(cfg.shape_attempts):
        shape = draw_input_shape(rng.choice(ranks), lo_batch, rng, cfg)
        try:
            chain = _solve_from(specs, shape, rng, cfg)
            batch = fit_batch(chain.est_ms, peak_elements(chain), lo_batch, cfg)
            sized = rebatch(chain, batch, cfg)
            largest_input, largest_created = peak_elements(sized)
            if (
                largest_input > cfg.max_input_melems * 1e6
                or largest_created > cfg.max_tensor_melems * 1e6
            ):
                raise Degenerate("memory", f"tensors too large even at batch {batch}")
            low, high = cfg.forward_window_ms
            if enforce_window and not low <= sized.est_ms <= high:
                raise Degenerate("runtime", f"estimated {sized.est_ms:.3g} ms at batch {batch}")
            return sized
        except Degenerate as exc:
            error = exc
    raise error
