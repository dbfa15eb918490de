"""What a seed library yields: a declarative description of one operator and its inputs.

A spec is enough to render a KernelBench task (``synth.catalog.render``) or it carries the
task's ``code`` itself (transformers layers, whose source is inlined). A library that already
knows an operator cannot become a seed sets ``reason``; the extractor keeps it as a rejection.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["module", "function", "method", "operator", "layer"]
DType = Literal["float32", "int64", "bool"]


class Code(str):
    """A literal written into generated code verbatim (``nn.Linear(32, 32)``, ``torch.float32``)
    rather than as a Python repr."""


@dataclass(frozen=True)
class InputSpec:
    """One call argument. Tensors are drawn in ``get_inputs()``: float32 from ``torch.randn``
    (or uniform in ``uniform = (low, high)``, for log, sqrt, acos), int64 from
    ``torch.randint(low, high)``, bool from a coin flip; ``count`` > 0 makes a list of that many
    tensors (``torch.cat``). Non-tensors (``tensor=False``) are literals in the call."""

    name: str
    shape: tuple[int, ...] = ()
    dtype: DType = "float32"
    low: int = 0
    high: int = 2
    uniform: tuple[float, float] | None = None
    tensor: bool = True
    value: Any = None
    count: int = 0
    keyword: bool = False


@dataclass(frozen=True)
class CatalogSpec:
    """One operator of one library.

    ``name`` is the Ops-6K-style op name (``nn.Conv2d``, ``F.gelu``, ``torch.cumsum``, ``+``);
    ``target`` is how generated code calls it. ``init`` are named constructor arguments
    (module-level constants passed through ``get_init_inputs()``), ``init_kwargs`` literal
    keyword arguments. ``args`` is the call's argument list in order: tensors become forward
    parameters drawn by ``get_inputs()``, the rest are literals.
    ``flags`` come from the library (``stochastic``, ``inplace``, ``factory``, ...) and are
    completed by validation. ``evidence`` is whatever the library learned while deriving the
    spec (probed ranks, shape function samples); it is copied to the seed task's meta.
    """

    library: str
    name: str
    kind: Kind
    target: str = ""
    init: tuple[tuple[str, Any], ...] = ()
    init_kwargs: tuple[tuple[str, Any], ...] = ()
    args: tuple[InputSpec, ...] = ()
    flags: tuple[str, ...] = ()
    code: str = ""
    data_source: str = ""
    family: str = ""
    reason: str = ""
    detail: str = ""
    evidence: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def source(self) -> str:
        """The task's ``data_source``: ``torch#1`` for torch seeds, else the library name."""
        return self.data_source or ("torch#1" if self.library == "torch" else self.library)
