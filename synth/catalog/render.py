"""Render a ``CatalogSpec`` as a one-operator KernelBench task.

Same conventions as the composer's tasks (``synth.emit``): the usual imports, a docstring
naming the operator, ``class Model`` holding a module operator in ``__init__``, module-level
shape constants, ``get_inputs()`` drawing CPU tensors and ``get_init_inputs()`` returning the
constructor arguments. Tensors of the first tensor's shape reuse its dim names.
"""

from __future__ import annotations

from typing import Any

from opsynth.synth.catalog.spec import CatalogSpec, Code, InputSpec

DIM_NAMES: dict[int, tuple[str, ...]] = {
    1: ("length",),
    2: ("batch_size", "features"),
    3: ("batch_size", "seq_len", "features"),
    4: ("batch_size", "channels", "height", "width"),
    5: ("batch_size", "channels", "depth", "height", "width"),
}
HEADER = ["import torch", "import torch.nn as nn", "import torch.nn.functional as F"]
ROOTS = {"torch", "nn", "F"}


def literal(value: Any) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(literal(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, list):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    if isinstance(value, Code):
        return str(value)
    return repr(value)


class _Constants:
    """Module-level constants in definition order, with unique names."""

    def __init__(self, taken: set[str]) -> None:
        self.values: dict[str, str] = {}
        self.taken = taken

    def define(self, role: str, value: Any) -> str:
        name, i = role, 2
        while name in self.values or name in self.taken:
            name, i = f"{role}_{i}", i + 1
        self.values[name] = literal(value)
        return name


def _tensor_names(spec: CatalogSpec) -> list[str]:
    names = []
    for arg in spec.args:
        if arg.tensor:
            names += [f"{arg.name}_{i}" for i in range(arg.count)] if arg.count else [arg.name]
    return names


def draw_expression(arg: InputSpec, shape_source: str) -> str:
    """How ``get_inputs()`` draws one tensor argument of the given shape expression."""
    if arg.dtype == "int64":
        return f"torch.randint({arg.low}, {arg.high}, {shape_source})"
    if arg.dtype == "bool":
        return f"torch.rand({shape_source}) > 0.5"
    if arg.uniform is not None:
        low, high = arg.uniform
        return f"torch.rand({shape_source}) * {high - low:g} + {low:g}"
    return f"torch.randn({shape_source})"


def _shape_source(shape: tuple[int, ...], named: tuple[int, ...], names: list[str]) -> str:
    if named and shape == named:
        return "(" + ", ".join(names) + ("," if len(names) == 1 else "") + ")"
    return literal(tuple(shape))


def _call_args(spec: CatalogSpec) -> list[str]:
    parts = []
    for arg in spec.args:
        if arg.tensor and arg.count:
            text = "[" + ", ".join(f"{arg.name}_{i}" for i in range(arg.count)) + "]"
        elif arg.tensor:
            text = arg.name
        else:
            text = literal(arg.value)
        parts.append(f"{arg.name}={text}" if arg.keyword else text)
    return parts


def _forward_expr(spec: CatalogSpec) -> str:
    args = _call_args(spec)
    if spec.kind == "module":
        return f"self.op({', '.join(args)})"
    if spec.kind == "operator":
        return f" {spec.target} ".join(args)
    if spec.kind == "method":
        return f"{args[0]}.{spec.target}({', '.join(args[1:])})"
    return f"{spec.target}({', '.join(args)})"


def render_code(spec: CatalogSpec) -> str:
    """The task source; ``spec.code`` wins when the library rendered it itself."""
    if spec.code:
        return spec.code
    tensors = _tensor_names(spec)
    consts = _Constants(set(tensors) | {"Model", "torch", "nn", "F"})
    first = next((a for a in spec.args if a.tensor), None)
    named: tuple[int, ...] = first.shape if first is not None else ()
    dim_names = [
        consts.define(role, size)
        for role, size in zip(DIM_NAMES.get(len(named), ()), named, strict=False)
    ]
    if len(dim_names) != len(named):
        named = ()
    init_names = [consts.define(role, value) for role, value in spec.init]
    draws = []
    for arg in spec.args:
        if not arg.tensor:
            continue
        source = draw_expression(arg, _shape_source(arg.shape, named, dim_names))
        for name in [f"{arg.name}_{i}" for i in range(arg.count)] if arg.count else [arg.name]:
            draws.append(f"    {name} = {source}")
    ctor = ", ".join(init_names + [f"{k}={literal(v)}" for k, v in spec.init_kwargs])
    init_body = [f"        self.op = {spec.target}({ctor})"] if spec.kind == "module" else []
    module = spec.target.rpartition(".")[0]
    extra = [f"import {module}"] if module and module.split(".")[0] not in ROOTS else []
    lines = [
        f'"""Single operator: {spec.name}."""',
        "",
        *HEADER,
        *extra,
        "",
        "",
        "class Model(nn.Module):",
        f"    def __init__(self{''.join(', ' + n for n in init_names)}):",
        "        super().__init__()",
        *init_body,
        "",
        f"    def forward(self{''.join(', ' + n for n in tensors)}):",
        f"        return {_forward_expr(spec)}",
        "",
        "",
        *[f"{name} = {value}" for name, value in consts.values.items()],
        "",
        "",
        "def get_inputs():",
        *draws,
        f"    return [{', '.join(tensors)}]",
        "",
        "",
        "def get_init_inputs():",
        f"    return [{', '.join(init_names)}]",
    ]
    return "\n".join(lines) + "\n"
