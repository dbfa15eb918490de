"""Tensor constructors that take no tensor, composed as a constant operand of the running
tensor (``compose.constant_operands``): ``torch.arange``, ``torch.linspace``,
``torch.scalar_tensor``.

Alone, or first in a chain, such a constructor has no input to compute from, so a task of it
would return the same tensor for every input. Ops-6K builds the constant and multiplies or
adds it to the running tensor (``x = x * self.scalar``, ``x + torch.linspace(-1, 1, n)``), so
one is composed at a later position only: sized to the running tensor's last dim (arange's
``end``, linspace's ``steps``; a scalar broadcasts as it is) and applied with ``*`` or ``+``.
The forward builds it on the running tensor's device (``x * torch.arange(64,
device=x.device)``) rather than ``__init__`` holding it as a buffer: the dedup stage's dataflow
graph reads a buffer as a parameter, so ``x * self.c`` would be the structural duplicate of
every chain multiplying by a parameter, and the three constructors duplicates of each other.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from opsynth.synth.catalog.spec import CatalogSpec

# Each constructor and the argument sized to the running tensor's last dim (None: a scalar).
CONSTANTS: dict[str, str | None] = {
    "torch.arange": "end",
    "torch.linspace": "steps",
    "torch.scalar_tensor": None,
}
# How a constant is applied to the running tensor, drawn per link.
COMBINE = ("*", "+")


def is_constant(spec: CatalogSpec) -> bool:
    """Whether a spec is one of the constructors composed as a constant operand."""
    return (
        spec.kind == "function"
        and spec.name in CONSTANTS
        and not any(arg.tensor for arg in spec.args)
    )


def sized(spec: CatalogSpec, shape: tuple[int, ...]) -> CatalogSpec:
    """The constructor's call with its length the last dim of a running tensor of ``shape``,
    so the constant broadcasts along that dim and the result keeps the running shape."""
    name = CONSTANTS[spec.name]
    if name is None or not shape:
        return spec
    args = tuple(replace(a, value=shape[-1]) if a.name == name else a for a in spec.args)
    return replace(spec, args=args)


def combined(op: str, running: Any, constant: Any) -> Any:
    """The running tensor with the constant applied by ``op`` (one of ``COMBINE``)."""
    if op == "*":
        return running * constant
    if op == "+":
        return running + constant
    raise ValueError(f"no constant operator {op!r}; expected one of {COMBINE}")
