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
only attention takes it. The solver replays the same slots and sources at its second batch.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from opsynth.synth.catalog.spec import CatalogSpec

# (argument index, element of a tensor-list argument or None) -> the source it takes
Slot = tuple[int, int | None]
Reuse = tuple[Slot, int]


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
    """A source for every batch-sized float operand of ``spec`` among ``values`` (the tensors
    entering each link so far, the running tensor last; for the first link, its own first
    input), drawn by ``rng`` among those of the operand's shape; None when an operand has
    none, or there is no such operand."""
    slots = operand_slots(spec, main, running)
    if not slots:
        return None
    own = len(values) - 1
    reuses = []
    for slot, shape, dtype in slots:
        fits = [
            j
            for j, value in enumerate(values)
            if (j < own or takes_itself(spec))
            and dtype == "float32"
            and getattr(value, "dtype", None) is not None
            and value.is_floating_point()
            and tuple(value.shape) == shape
        ]
        if not fits:
            return None
        reuses.append((slot, rng.choice(fits)))
    return tuple(reuses)


def named(reuses: Sequence[Reuse], names: Sequence[str | None]) -> tuple[tuple[str, int], ...]:
    """The reuses by their operands' input names (``chain.expanded``'s: ``name`` or
    ``name_j`` for a list's element), as ``Link.reuses`` holds them."""
    out = []
    for (i, element), source in reuses:
        name = names[i]
        assert name is not None, "a reused operand is a drawn tensor argument"
        out.append((name if element is None else f"{name}_{element}", source))
    return tuple(out)


def fits_again(reuses: Sequence[Reuse], spec: CatalogSpec, values: Sequence[Any]) -> bool:
    """Whether every reused operand's source still has the operand's shape (the replay at
    the solver's second batch)."""
    for (i, _), source in reuses:
        if source >= len(values) or tuple(values[source].shape) != tuple(spec.args[i].shape):
            return False
    return True
