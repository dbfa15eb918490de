"""Turn an introspected parameter list into candidate argument sets for one input rank.

The first tensor parameter is the task's input, of the probe shape for that rank. Every other
required parameter gets a short list of options: tensors by role (an ``index`` is int64 and in
range, a ``mask`` is bool, a ``weight`` is a channel or feature vector, anything else the input's
shape, its transpose, a vector or a scalar), scalars by name (``overrides.NAMED``) or type.
Candidates are the capped product of those options; ``synth.catalog.torch_library`` keeps the
first that runs on the meta device.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from opsynth.synth.catalog.introspect import Param
from opsynth.synth.catalog.overrides import NAMED, Shape
from opsynth.synth.catalog.spec import InputSpec

MAX_CANDIDATES = 48
SCALAR_TYPES = {"int", "int[]", "float", "bool", "str", "ScalarType"}
# Optional parameters worth setting when the required ones alone do not run (F.interpolate
# needs a size or a scale, softmax a dim).
OPTIONAL_HINTS = ("scale_factor", "dim", "output_size", "min")
INDEX_NAMES = ("index", "indices", "idx")
VECTOR_NAMES = ("weight", "bias", "running_mean", "running_var", "gamma", "beta")


def _tensor(name: str, shape: Shape, **kw: Any) -> InputSpec:
    return InputSpec(name=name, shape=tuple(shape), **kw)


def tensor_options(name: str, shape: Shape) -> list[InputSpec]:
    """Options for a tensor parameter that is not the input."""
    rank, low = len(shape), name.lower()
    if any(k in low for k in INDEX_NAMES):
        # in range of every non-batch dim, so the range does not follow the batch
        high = min(shape[1:]) if len(shape) > 1 else shape[0]
        return [
            _tensor(name, shape, dtype="int64", high=high),
            _tensor(name, (2,), dtype="int64", high=high),
        ]
    if "mask" in low or low in ("condition", "cond"):
        return [_tensor(name, shape, dtype="bool")]
    if low == "target" or low.endswith("target"):
        opts = [_tensor(name, shape)]
        if rank >= 2:
            opts.append(_tensor(name, shape, dtype="int64", high=shape[-1]))
            opts.append(_tensor(name, (shape[0],), dtype="int64", high=shape[1]))
            opts.append(_tensor(name, shape[:1] + shape[2:], dtype="int64", high=shape[1]))
        return opts
    vector = [_tensor(name, (shape[1],))] if rank >= 2 else []
    vector.append(_tensor(name, (shape[-1],)))
    if any(low.startswith(k) for k in VECTOR_NAMES):
        return [*vector, _tensor(name, shape)]
    same = [_tensor(name, shape)]
    if rank >= 2:
        same.append(_tensor(name, shape[:-2] + (shape[-1], shape[-2])))
    return [*same, *vector, _tensor(name, ())]


def scalar_options(p: Param, shape: Shape) -> list[Any]:
    if p.name in NAMED:
        values = NAMED[p.name](shape)
        if p.type == "int":
            values = [v for v in values if isinstance(v, int)] or values
        elif p.type == "int[]":
            values = [v if isinstance(v, list | tuple) else [v] for v in values]
        return values
    return {"int": [1, 2], "int[]": [[1]], "float": [0.5], "bool": [False]}.get(p.type, [])


def _is_tensor(p: Param, first: bool) -> bool:
    if p.type in ("Tensor", "Tensor[]"):
        return True
    return p.type == "?" and (first or p.name not in NAMED)


def main_options(name: str, shape: Shape) -> list[InputSpec]:
    return [
        _tensor(name, shape),
        _tensor(name, shape, dtype="int64", high=8),
        _tensor(name, shape, dtype="bool"),
    ]


def candidates(params: list[Param], shape: Shape, hints: bool = False) -> Iterator[tuple]:
    """Argument tuples (``InputSpec`` each) for ``params`` with the input of ``shape``."""
    chosen = [p for p in params if p.required or (hints and p.name in OPTIONAL_HINTS)]
    options: list[list[InputSpec]] = []
    seen_input = False
    for p in chosen:
        if p.name == "self":  # aten's name for the input; a forward parameter cannot be self
            p = replace(p, name="x")
        keyword = p.keyword_only or not p.required
        if p.type == "Tensor[]":
            opts = [_tensor(p.name, shape, count=2, keyword=keyword)]
        elif _is_tensor(p, not seen_input):
            opts = main_options(p.name, shape) if not seen_input else tensor_options(p.name, shape)
            opts = [replace(o, keyword=keyword) for o in opts]
            seen_input = True
        else:
            values = scalar_options(p, shape)
            opts = [InputSpec(p.name, tensor=False, value=v, keyword=keyword) for v in values]
        if not opts:
            return
        options.append(opts)
    yield from itertools.islice(itertools.product(*options), MAX_CANDIDATES)
