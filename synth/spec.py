"""The vocabulary every seed library and the composer share.

A ``SeedSpec`` describes one operator declaratively (name, kind, accepted ranks, how it
changes shape, flags) plus three small callables that carry the operator-specific knowledge:
``solve`` proposes constructor/call arguments for a given input shape, ``effect`` tracks what
the operator does to the values (``synth.values.Facts``; it raises ``Degenerate`` for an
identity, a constant, an overflow or an op that undoes the previous one), and ``macs`` feeds
the cost model. Keeping the knowledge on the spec lets a new library plug in
without touching the composer.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from synth.values import Degenerate, Facts

__all__ = ["Arg", "Choice", "Degenerate", "Facts", "Menus", "SeedSpec", "Shape", "SolveContext"]

Shape = tuple[int, ...]
Kind = Literal["module", "function"]
# How an operator changes its input's shape; the composer uses it to keep dimension names.
#   same: shape unchanged; reduce: one dim removed (or kept as 1); transpose: two dims swapped;
#   resize: rank kept, some dims resized.
ShapeEffect = Literal["same", "reduce", "transpose", "resize"]


@dataclass(frozen=True)
class Arg:
    """One constructor argument of a module operator; it becomes a module-level constant and an
    entry of ``get_init_inputs()``. ``dim`` says the value is the size of that input dim, so the
    generated code can reuse the name already given to that dim (``nn.Linear(in_features, ...)``).
    """

    role: str
    value: Any
    dim: int | None = None


@dataclass(frozen=True)
class Choice:
    """The arguments chosen for one operator at one input shape.

    ``args`` become named init inputs (modules only); ``kwargs`` are literal keyword arguments
    (constructor for modules, call for functions) and ``pos`` literal positional call arguments.
    ``dim``/``dims``/``keepdim`` record which dims the operator acts on, for the value rules.
    ``names`` maps an output dim to the role of the arg that names it (Linear's last dim is
    ``out_features``).
    """

    args: tuple[Arg, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    pos: tuple[Any, ...] = ()
    dim: int | None = None
    dims: tuple[int, ...] = ()
    keepdim: bool = False
    names: dict[int, str] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {
            "args": {a.role: _jsonable(a.value) for a in self.args},
            "kwargs": {k: _jsonable(v) for k, v in self.kwargs.items()},
            "pos": [_jsonable(v) for v in self.pos],
        }


@dataclass(frozen=True)
class SolveContext:
    """What an operator's ``solve`` may look at when proposing arguments.

    ``min_rank_ahead`` is the lowest rank the running tensor may drop to with every later
    operator still accepting it (0 when this is the last operator), so a reduction knows
    whether it must keep its dim. ``bias_allowed``
    is false when the next operator re-centres every channel, which would erase a bias.
    """

    shape: Shape
    rng: random.Random
    facts: Facts
    min_rank_ahead: int
    bias_allowed: bool
    menus: Menus


@dataclass(frozen=True)
class Menus:
    """Size menus an operator may draw new sizes from (Linear out_features, Conv out_channels)."""

    feature_sizes: tuple[int, ...]
    channel_sizes: tuple[int, ...]


Effect = Callable[[Facts, Choice, Shape, Shape], Facts]
Solver = Callable[[SolveContext], list[Choice]]
Macs = Callable[[Choice, Shape, Shape], int]


def _no_macs(choice: Choice, shape_in: Shape, shape_out: Shape) -> int:
    return 0


def _opaque(facts: Facts, choice: Choice, shape_in: Shape, shape_out: Shape) -> Facts:
    return Facts(mean=facts.mean, std=facts.std, offset=facts.offset)


@dataclass(frozen=True)
class SeedSpec:
    """One seed operator, named as in Ops-6K (``nn.Conv2d``, ``F.gelu``, ``torch.cumsum``).

    ``kind`` says whether it is built once in ``__init__`` (module) or called in ``forward``
    (function). ``ranks`` are the input ranks it accepts. ``attr`` names the ``Model``
    attribute holding a module. ``elementwise`` operators commute with dim permutations.
    ``per_channel_bias`` marks layers whose bias is constant per channel and
    ``centers_channels`` operators that subtract a per-channel mean, which erases such a bias.
    ``work`` is the cost per element (of the larger of input and output) relative to a cheap
    elementwise op, ``mac_work`` the cost per multiply-add relative to nn.Linear's. ``scratch``
    marks ops that allocate input-sized temporaries (logsumexp), which count as created tensors.
    """

    name: str
    kind: Kind
    ranks: tuple[int, ...]
    shape_effect: ShapeEffect
    solve: Solver
    effect: Effect = _opaque
    macs: Macs = _no_macs
    attr: str = ""
    library: str = "torch"
    elementwise: bool = False
    learnable: bool = False
    stochastic: bool = False
    inplace: bool = False
    per_channel_bias: bool = False
    centers_channels: bool = False
    work: float = 1.0
    mac_work: float = 1.0
    scratch: bool = False

    def describe(self) -> dict[str, Any]:
        """The declarative part of the spec, JSON-ready, for a seed task's ``meta``."""
        return {
            "name": self.name,
            "library": self.library,
            "kind": self.kind,
            "ranks": list(self.ranks),
            "shape_effect": self.shape_effect,
            "attr": self.attr,
            "elementwise": self.elementwise,
            "learnable": self.learnable,
            "stochastic": self.stochastic,
            "inplace": self.inplace,
        }


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
