"""Operands a chain takes from itself: a residual connection, self-attention, a condition.

Hand-written fused tasks often feed an operator a tensor the model already has instead of a
new input: ``torch.cat((x1, attn), dim=-1)`` joins an input to what attention made of it,
``x + identity`` adds a block's input back, ``self.attn(x, x, x)`` attends a sequence to
itself, ``torch.bmm(x, x.transpose(1, 2))`` is a Gram matrix, ``torch.where(x > 0, x, y)``
tests the tensor it chooses from. A link that may not add an input
(``compose.multi_input_share``) and whose argument set asks for another batch-sized float or
bool operand may take, with ``compose.reuse_share``, a value of the chain instead of not
being taken: the chain's input or a tensor an earlier link produced, of that operand's shape;
failing that, one whose last two dims swapped (and differ) give that shape, transposed (its
running tensor included: ``x @ x^T``); for an attention its running tensor itself (its query
as key and value). Any other operator given its own running tensor again would compute
``x - x`` or a loss of ``x`` against itself, which the degenerate checks refuse, so only
attention takes it.
A bool operand (``torch.where``'s condition, ``masked_fill``'s mask) takes a value of its
shape compared with zero, the running tensor included, as Ops-6K builds most of its
conditions. The solver replays the same slots, sources and derivations at its second batch.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from opsynth.synth.catalog.spec import CatalogSpec

# (argument index, element of a tensor-list argument or None) -> the source it takes, and
# how the operand derives from it: "" the value itself, ">" / "<" its comparison with zero
# (a bool operand), "T" its last two dims swapped
Slot = tuple[int, int | None]
Reuse = tuple[Slot, int, str]
TESTS = (">", "<")
TRANSPOSED = "T"


def derived(value: Any, how: str) -> Any:
    """A source as the operand takes it."""
    if how == ">":
        return value > 0
    if how == "<":
        return value < 0
    if how == TRANSPOSED:
        return value.transpose(-2, -1)
    return value


def written(source: str, how: str) -> str:
    """The operand as the task's code writes it, from the name its source has there."""
    if how == TRANSPOSED:
        return f"{source}.transpose(-2, -1)"
    return f"{source} {how} 0" if how else source


def _shape(value: Any, how: str) -> tuple[int, ...] | None:
    """The operand's shape ``how`` makes of a float value, a comparison keeping it (None: not
    a float tensor)."""
    if getattr(value, "dtype", None) is None or not value.is_floating_point():
        return None
    shape = tuple(value.shape)
    if how == TRANSPOSED:
        return (*shape[:-2], shape[-1], shape[-2]) if len(shape) >= 2 else None
    return shape


def takes_itself(spec: CatalogSpec) -> bool:
    """An attention, which takes its running tensor again as key and value."""
    return "attention" in spec.name.lower()


def operand_slots(
    spec: CatalogSpec, main: int | None, running: tuple[int, ...]
) -> list[tuple[Slot, tuple[int, ...], str]]:
    """The operands of an argument set that are batch-sized tensors besides the running one
    (the first link's first tensor standing in for it), with their shapes and dtypes: the
    operands that make an argument set add an input (``solve._adds_input``)."""
    first = (
        main if main is not None else next((i for i, a in enumerate(spec.args) if a.tensor), None)
    )
    slots = []
    for i, arg in enumerate(spec.args):
        if not arg.tensor or arg.shape[:1] != running[:1] or len(arg.shape) < len(running):
            continue
        if arg.count:
            start = 1 if i == first else 0
            slots += [((i, j), tuple(arg.shape), arg.dtype) for j in range(start, arg.count)]
        elif i != first:
            slots.append(((i, None), tuple(arg.shape), arg.dtype))
    return slots


def draw_reuses(
    spec: CatalogSpec,
    main: int | None,
    running: tuple[int, ...],
    values: Sequence[Any],
    rng: random.Random,
) -> tuple[Reuse, ...] | None:
    """A source and a derivation for every batch-sized float or bool operand of ``spec``
    among ``values`` (the tensors entering each link so far, the running tensor last; for the
    first link, its own first input), drawn by ``rng`` among those that fit (module
    docstring); None when an operand has none (an index), or there is no such operand."""
    slots = operand_slots(spec, main, running)
    if not slots:
        return None
    own = len(values) - 1
    reuses = []
    for slot, shape, dtype in slots:
        if dtype == "bool":
            fits = [(j, rng.choice(TESTS)) for j, v in enumerate(values) if _shape(v, "") == shape]
        elif dtype == "float32":
            fits = [
                (j, "")
                for j, v in enumerate(values)
                if (j < own or takes_itself(spec)) and _shape(v, "") == shape
            ]
            fits = fits or [
                (j, TRANSPOSED)
                for j, v in enumerate(values)
                if _shape(v, TRANSPOSED) == shape != _shape(v, "")  # a square one is taken as is
            ]
        else:
            return None
        if not fits:
            return None
        reuses.append((slot, *rng.choice(fits)))
    return tuple(reuses)


def named(reuses: Sequence[Reuse], names: Sequence[str | None]) -> tuple[tuple[str, int, str], ...]:
    """The reuses by their operands' input names (``chain.expanded``'s: ``name`` or
    ``name_j`` for a list's element), as ``Link.reuses`` holds them."""
    out = []
    for (i, element), source, how in reuses:
        name = names[i]
        assert name is not None, "a reused operand is a drawn tensor argument"
        out.append((name if element is None else f"{name}_{element}", source, how))
    return tuple(out)


def fits_again(reuses: Sequence[Reuse], spec: CatalogSpec, values: Sequence[Any]) -> bool:
    """Whether every reused operand's source still gives the operand's shape (the replay at
    the solver's second batch)."""
    for (i, _), source, how in reuses:
        if source >= len(values):
            return False
        if _shape(values[source], how) != tuple(spec.args[i].shape):
            return False
    return True
