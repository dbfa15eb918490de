"""Call a spec directly (no code generation) on the ``meta`` device or on CPU.

Adapters use this to choose among derived argument sets: a meta call costs microseconds and
fails the same way a real one would on a wrong shape or argument, so the first set that
propagates on meta is the one a seed is validated with. ``Code`` literals of the spec tables
are evaluated here with only torch in scope.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import torch

from opsynth.synth.catalog.spec import CatalogSpec, Code, InputSpec

ALIASES = {"nn": "torch.nn", "F": "torch.nn.functional"}
CODE_SCOPE = {"torch": torch, "nn": torch.nn, "F": torch.nn.functional}


def resolve(target: str) -> Any:
    """``nn.Conv2d`` -> torch.nn.Conv2d, ``F.gelu``, ``torch.cumsum``, ``einops.rearrange``."""
    module_name, _, attr = target.rpartition(".")
    module_name = ALIASES.get(module_name, module_name)
    return getattr(importlib.import_module(module_name), attr)


def value_of(value: Any) -> Any:
    if isinstance(value, Code):
        return eval(str(value), dict(CODE_SCOPE))  # our own spec tables, never task code
    if isinstance(value, list):
        return [value_of(v) for v in value]
    return value


def make_tensor(arg: InputSpec, device: str, generator: torch.Generator | None = None):
    shape = arg.shape
    if device == "meta":  # no values to draw; meta's random kernels are slow decompositions
        dtype = {"int64": torch.int64, "bool": torch.bool}.get(arg.dtype, torch.float32)
        return torch.empty(shape, dtype=dtype, device="meta")
    if arg.dtype == "int64":
        return torch.randint(arg.low, arg.high, shape, device=device, generator=generator)
    if arg.dtype == "bool":
        return torch.rand(shape, device=device, generator=generator) > 0.5
    if arg.uniform is not None:
        low, high = arg.uniform
        return torch.rand(shape, device=device, generator=generator) * (high - low) + low
    return torch.randn(shape, device=device, generator=generator)


def make_args(spec: CatalogSpec, device: str) -> tuple[list[Any], dict[str, Any]]:
    gen = torch.Generator().manual_seed(0) if device == "cpu" else None
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for arg in spec.args:
        if arg.tensor and arg.count:
            value: Any = [make_tensor(arg, device, gen) for _ in range(arg.count)]
        elif arg.tensor:
            value = make_tensor(arg, device, gen)
        else:
            value = value_of(arg.value)
        if arg.keyword:
            kwargs[arg.name] = value
        else:
            args.append(value)
    return args, kwargs


def build(spec: CatalogSpec, device: str) -> Any:
    """The callable a spec's forward applies: a constructed module, a function or operator."""
    if spec.kind == "module":
        cls = resolve(spec.target)
        with torch.device(device):
            init = [value_of(v) for _, v in spec.init]
            kw = {k: value_of(v) for k, v in spec.init_kwargs}
            return cls(*init, **kw)
    if spec.kind == "operator":
        return _OPERATORS[spec.target]
    if spec.kind == "method":
        return lambda x, *a, **k: getattr(x, spec.target)(*a, **k)
    return resolve(spec.target)


def call(spec: CatalogSpec, device: str) -> Any:
    fn = build(spec, device)
    args, kwargs = make_args(spec, device)
    with torch.no_grad():
        return fn(*args, **kwargs)


def output_shapes(out: Any) -> list[list[int]]:
    """Shapes of the tensors in an output (a tensor, or tuples, lists and dicts holding some;
    ``None`` entries are skipped); an output without any tensor is a bad output."""
    tensors = tensors_of(out)
    if not tensors:
        raise TypeError(f"output is {type(out).__name__}, not a tensor or tuple of tensors")
    return [list(t.shape) for t in tensors]


def tensors_of(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, Mapping):
        out = list(out.values())
    if isinstance(out, tuple | list):
        return [t for item in out for t in tensors_of(item)]
    return []


_OPERATORS = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
    "@": lambda a, b: a @ b,
    "**": lambda a, b: a**b,
}
