"""Render a solved chain as KernelBench-format source and as a ``Task`` row.

The code reads like the hand-written Ops-6K tasks: the three usual imports, a docstring naming
the operators, ``class Model`` with every layer registered in ``__init__`` (so all weights are
parameters/buffers), module-level shape constants, ``get_inputs()`` returning CPU
``torch.randn`` tensors and ``get_init_inputs()`` returning the constructor arguments. Sizes
that equal an earlier dim reuse that dim's name (``nn.Linear(in_features, out_features)``).
``batch_size`` is ``base * scale``: no operator parameter depends on the batch dim, so rewriting
``scale`` resizes a task without re-solving it.
"""

from __future__ import annotations

from typing import Any

import synth
from opsynth.record import Task
from synth.shapes import Chain, Step

INPUT_DIM_NAMES: dict[int, tuple[str, ...]] = {
    2: ("batch_size", "in_features"),
    3: ("batch_size", "seq_len", "in_features"),
    4: ("batch_size", "in_channels", "height", "width"),
}
SCALE_NAME = "scale"
SCALE_COMMENT = "  # multiplies the batch dim; no operator parameter depends on it"


class _Names:
    """Module-level constants in definition order, with unique names (``kernel_size_2``)."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def fresh(self, role: str, taken: set[str] | None = None) -> str:
        name, i = role, 2
        while name in self.values or (taken and name in taken):
            name, i = f"{role}_{i}", i + 1
        return name

    def define(self, role: str, source: str) -> str:
        name = self.fresh(role)
        self.values[name] = source
        return name


def _literal(value: Any) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(_literal(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)


def _call_args(leading: list[str], pos: tuple, kwargs: dict[str, Any]) -> str:
    parts = leading + [_literal(v) for v in pos] + [f"{k}={_literal(v)}" for k, v in kwargs.items()]
    return ", ".join(parts)


def _next_symbols(step: Step, symbols: list[str | None], arg_names: dict[str, str]) -> list:
    """Names of the output dims: kept where the dim is provably the same size, else named by
    the argument that sets it, else anonymous (a later use gets its own constant)."""
    effect, choice = step.spec.shape_effect, step.choice
    if effect == "same":
        return list(symbols)
    if effect == "reduce":
        if choice.keepdim:
            return [None if d == choice.dim else s for d, s in enumerate(symbols)]
        return [s for d, s in enumerate(symbols) if d != choice.dim]
    if effect == "transpose":
        a, b = choice.dims
        out = list(symbols)
        out[a], out[b] = symbols[b], symbols[a]
        return out
    out = []
    for d, size in enumerate(step.shape_out):
        if d in choice.names:
            out.append(arg_names[choice.names[d]])
        elif d < len(step.shape_in) and size == step.shape_in[d]:
            out.append(symbols[d])
        else:
            out.append(None)
    return out


def render_code(chain: Chain, ops: list[str]) -> str:
    names = _Names()
    base = chain.batch
    names.values[SCALE_NAME] = "1"
    symbols: list[str | None] = []
    for d, role in enumerate(INPUT_DIM_NAMES[len(chain.input_shape)]):
        source = f"{base} * {SCALE_NAME}" if d == 0 else str(chain.input_shape[d])
        symbols.append(names.define(role, source))
    input_names = list(symbols)

    init_params: list[str] = []
    init_lines: list[str] = []
    forward: list[str] = []
    attrs: set[str] = set()
    for step in chain.steps:
        if step.adapter is not None:
            forward.append(step.adapter.code)
            symbols.insert(step.adapter.new_dim, None)
        _check_symbols(symbols, step.shape_in, names)
        arg_names: dict[str, str] = {}
        for arg in step.choice.args:
            ref = symbols[arg.dim] if arg.dim is not None else None
            name = ref or names.define(arg.role, _literal(arg.value))
            arg_names[arg.role] = name
            if name not in init_params:
                init_params.append(name)
        spec, choice = step.spec, step.choice
        if spec.kind == "module":
            attr = names.fresh(spec.attr, attrs)
            attrs.add(attr)
            args = _call_args([arg_names[a.role] for a in choice.args], (), choice.kwargs)
            init_lines.append(f"self.{attr} = {spec.name}({args})")
            forward.append(f"x = self.{attr}(x)")
        else:
            forward.append(f"x = {spec.name}({_call_args(['x'], choice.pos, choice.kwargs)})")
        symbols = _next_symbols(step, symbols, arg_names)
    _check_symbols(symbols, chain.output_shape, names)

    if len(ops) == 1:
        doc = f"Single operator: {ops[0]}."
    else:
        doc = f"Fused chain of {len(ops)} operators: {' -> '.join(ops)}."
    params = "".join(f", {p}" for p in init_params)
    body = init_lines or []
    lines = [
        f'"""{doc}"""',
        "",
        "import torch",
        "import torch.nn as nn",
        "import torch.nn.functional as F",
        "",
        "",
        "class Model(nn.Module):",
        f"    def __init__(self{params}):",
        "        super().__init__()",
        *[f"        {line}" for line in body],
        "",
        "    def forward(self, x):",
        *[f"        {line}" for line in forward],
        "        return x",
        "",
        "",
        *[
            f"{name} = {source}" + (SCALE_COMMENT if name == SCALE_NAME else "")
            for name, source in names.values.items()
        ],
        "",
        "",
        "def get_inputs():",
        f"    return [torch.randn({', '.join(input_names)})]",
        "",
        "",
        "def get_init_inputs():",
        f"    return [{', '.join(init_params)}]",
    ]
    return "\n".join(lines) + "\n"


def _check_symbols(symbols: list[str | None], shape: tuple[int, ...], names: _Names) -> None:
    """Every named dim must have the size its constant says; a mismatch is a bug here."""
    if len(symbols) != len(shape):
        raise AssertionError(f"dim names {symbols} do not fit shape {shape}")
    for d, (name, size) in enumerate(zip(symbols, shape, strict=True)):
        if name is not None and d > 0 and names.values[name] != str(size):
            raise AssertionError(f"dim {d} named {name}={names.values[name]} but has size {size}")


def chain_meta(chain: Chain) -> dict[str, Any]:
    """Everything needed to audit or resize a task without parsing its code."""
    return {
        "input_shape": list(chain.input_shape),
        "output_shape": list(chain.output_shape),
        "shapes": [list(chain.input_shape)] + [list(s.shape_out) for s in chain.steps],
        "choices": [s.choice.describe() for s in chain.steps],
        "adapters": [
            {"before": i, "name": s.adapter.name, "code": s.adapter.code}
            for i, s in enumerate(chain.steps)
            if s.adapter is not None
        ],
        "batch_size": chain.batch,
        "scale": 1,
        "est_forward_ms_cpu": round(chain.est_ms, 3),
        "est_output": {
            "mean": _round(chain.facts.mean),
            "std": _round(chain.facts.std),
            "offset": _round(chain.facts.offset),
            "spread": _round(chain.facts.spread),
        },
    }


def _round(x: float) -> float:
    return float(f"{x:.4g}")


def render_task(
    chain: Chain,
    *,
    seed_ids: list[str],
    composer: str,
    config_hash: str = "",
    meta: dict[str, Any] | None = None,
    composer_version: str = synth.__version__,
) -> Task:
    ops = [s.spec.name for s in chain.steps]
    return Task(
        ops=ops,
        data_source=f"torch#{len(ops)}",
        code=render_code(chain, ops),
        seed_ids=list(seed_ids),
        composer=composer,
        composer_version=composer_version,
        config_hash=config_hash,
        meta={**chain_meta(chain), **(meta or {})},
    )
