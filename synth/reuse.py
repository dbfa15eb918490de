"""Operands a chain takes from itself: a residual connection, self-attention.

Hand-written fused tasks often feed an operator a tensor the model already has instead of a
new input: ``torch.cat((x1, attn), dim=-1)`` joins an input to what attention made of it,
``x + identity`` adds a block's input back, ``self.attn(x, x, x)`` attends a sequence to
itself. A link that may not add an input (``compose.multi_input_share``) and whose argument
set asks for another batch-sized float operand may take, with ``compose.reuse_share``, a value
of the chain of that operand's shape instead of not being taken: the chain's input or a
tensor an earlier link produced, and for an attention the running tensor itself (its query as
key and value). Any other operator given its own running tensor again would
compute ``x - x`` or a loss of ``x`` against itself, which the degenerate checks refuse, so
only attention takes it. A batch-sized bool operand (``torch.where``'s condition,
``masked_fill``'s mask) may be a value of the chain compared with zero, its running tensor
included (``torch.where(x > 0, x, residual)``), as Ops-6K builds most of its conditions. The
solver replays the same slots, sources and comparisons at its second batch.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from opsynth.synth.catalog.spec import CatalogSpec

# (argument index, element of a tensor-list argument or None) -> the source it takes, and
# the comparison with zero a bool operand makes of it ("" for the value itself)
Slot = tuple[int, int | None]
Reuse = tuple[Slot, int, str]
TESTS = (">", "<")


def compared(value: Any, test: str) -> Any:
    """A source as the operand takes it: the value itself, or its comparison with zero."""
    if test == ">":
        return value > 0
    if test == "<":
        return value < 0
    return value


def takes_itself(spec: CatalogSpec) -> bool:
    """An attention, which takes its running tensor again as key and value."""
    return "attention" in spec.name.lower()


def operand_slots(
    spec: CatalogSpec, main: int | None, running: tuple[int, ...]
) -> list[tuple[Slot, tuple[int, ...], str]]:
    """The operands of an argument set that are batch-sized tensors besides the running one
    (the first link's first tensor standing in for it), with their shapes and dtypes: the
    operands ``solve._adds_input`` counts as another input."""
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
    """A source for every batch-sized float or bool operand of ``spec`` among ``values`` (the
    tensors entering each link so far, the running tensor last; for the first link, its own
    first input), drawn by ``rng`` among the float ones of the operand's shape, a bool
    operand with a comparison drawn from ``TESTS``; None when an operand has none (an index),
    or there is no such operand."""
    slots = operand_slots(spec, main, running)
    if not slots:
        return None
    own = len(values) - 1
    reuses = []
    for slot, shape, dtype in slots:
        mask = dtype == "bool"
        fits = [
            j
            for j, value in enumerate(values)
            if (j < own or mask or takes_itself(spec))
            and dtype in ("float32", "bool")
            and getattr(value, "dtype", None) is not None
            and value.is_floating_point()
            and tuple(value.shape) == shape
        ]
        if not fits:
            return None
        reuses.append((slot, rng.choice(fits), rng.choice(TESTS) if mask else ""))
    return tuple(reuses)


def named(reuses: Sequence[Reuse], names: Sequence[str | None]) -> tuple[tuple[str, int, str], ...]:
    """The reuses by their operands' input names (``chain.expanded``'s: ``name`` or
    ``name_j`` for a list's element), as ``Link.reuses`` holds them."""
    out = []
    for (i, element), source, test in reuses:
        name = names[i]
        assert name is not None, "a reused operand is a drawn tensor argument"
        out.append((name if element is None else f"{name}_{element}", source, test))
    return tuple(out)


def fits_again(reuses: Sequence[Reuse], spec: CatalogSpec, values: Sequence[Any]) -> bool:
    """Whether every reused operand's source still has the operand's shape (the replay at
    the solver's second batch)."""
    for (i, _), source, _test in reuses:
        if source >= len(values) or tuple(values[source].shape) != tuple(spec.args[i].shape):
            return False
    return True
