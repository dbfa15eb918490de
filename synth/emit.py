"""Write a solved chain as KernelBench-format source and as a ``Task`` row.

The code reads like the released tasks: the usual imports, a docstring naming the operators,
``class Model`` with every module operator built in ``__init__`` from named constructor
arguments (``get_init_inputs()`` returns them), ``forward`` taking every tensor input and
calling each operator in turn on ``x``, module-level shape constants and ``get_inputs()``
drawing CPU tensors (``torch.randn``; ``torch.randint`` for an index, a coin flip for a mask).
Every dim that follows the batch is written ``batch_size``, defined as ``base * scale``, so
rewriting that one literal resizes the task without solving it again. A chain drawn with a
container (``synth.containers``) holds its modules or parameters in it and calls them
through it; the calls themselves are the same. A tensor constructor composed as a constant
operand (``synth.constants``) is built in ``forward`` on ``x``'s device and applied to it
(``x = x * torch.arange(64, device=x.device)``). A tensor a later operator takes again
(``synth.reuse``) is kept under a name of its own before ``x`` moves on (``residual = x``).
"""

from __future__ import annotations

from typing import Any

from opsynth import synth
from opsynth.record import Task
from opsynth.synth import containers
from opsynth.synth.catalog.render import DIM_NAMES, draw_expression, literal
from opsynth.synth.catalog.spec import CatalogSpec
from opsynth.synth.chain import Chain, Link, buffer_names, reuse_sources, weight_names
from opsynth.synth.reuse import written

SCALE_NAME = "scale"
BATCH_NAME = "batch_size"
SCALE_COMMENT = "  # multiplies the batch dim; no operator parameter depends on it"
ROOTS = {"torch", "nn", "F"}
FIRST_DIMS = {rank: names[1:] for rank, names in DIM_NAMES.items()}


class _Names:
    """Module-level constants in definition order, with unique names."""

    def __init__(self, taken: set[str]) -> None:
        self.values: dict[str, str] = {}
        self.taken = taken

    def define(self, role: str, source: str) -> str:
        name, i = role, 2
        while name in self.values or name in self.taken:
            name, i = f"{role}_{i}", i + 1
        self.values[name] = source
        return name


def _claim(base: str, attrs: set[str]) -> str:
    """A model attribute named after ``base`` that no other attribute has."""
    name, i = base, 2
    while name in attrs:
        name, i = f"{base}_{i}", i + 1
    attrs.add(name)
    return name


def _attr(spec: CatalogSpec, attrs: set[str]) -> str:
    return _claim(containers.attribute_name(spec), attrs)


def _held_parameters(
    parameters: dict[str, str], container: str | None, attrs: set[str]
) -> tuple[dict[str, str], list[str]]:
    """How the model reads each parameter, and the ``__init__`` lines that hold them: one
    attribute each, or one ``nn.ParameterList``/``nn.ParameterDict`` for them all."""
    if not parameters or container not in (containers.PARAMETER_LIST, containers.PARAMETER_DICT):
        held = {name: f"self.{name}" for name in parameters}
        return held, [f"self.{name} = {built}" for name, built in parameters.items()]
    attr = _claim("params", attrs)
    if container == containers.PARAMETER_LIST:
        held = {name: f"self.{attr}[{i}]" for i, name in enumerate(parameters)}
        return held, [f"self.{attr} = nn.ParameterList([{', '.join(parameters.values())}])"]
    held = {name: f'self.{attr}["{name}"]' for name in parameters}
    entries = ", ".join(f'"{name}": {built}' for name, built in parameters.items())
    return held, [f"self.{attr} = nn.ParameterDict({{{entries}}})"]


def _held_modules(
    container: str | None,
    modules: dict[int, tuple[str, str]],
    links: tuple[Link, ...],
    attrs: set[str],
) -> tuple[dict[int, str], list[str], range | None]:
    """How the model reads each module link's module (by link index), the ``__init__`` lines
    that build them, and the links an ``nn.Sequential`` calls as one (None without one).
    ``modules`` maps each module link to its attribute and constructor call."""
    run = containers.sequential_run(links) if container == containers.SEQUENTIAL else None
    if container == containers.MODULE_DICT and modules:
        attr = _claim("layers", attrs)
        entries = ", ".join(f'"{name}": {built}' for name, built in modules.values())
        callees = {i: f'self.{attr}["{name}"]' for i, (name, _) in modules.items()}
        return callees, [f"self.{attr} = nn.ModuleDict({{{entries}}})"], None
    callees: dict[int, str] = {}
    lines: list[str] = []
    for i, (name, built) in modules.items():
        if run is not None and i in run[1:]:
            continue
        if run is not None and i == run.start:
            if len(run) > 1:
                name = _claim("seq", attrs)
            built = f"nn.Sequential({', '.join(modules[j][1] for j in run)})"
        callees[i] = f"self.{name}"
        lines.append(f"self.{name} = {built}")
    return callees, lines, run


# How a task's docstring says what its container holds.
HELD = {
    containers.SEQUENTIAL: "its modules held in an nn.Sequential",
    containers.MODULE_DICT: "its modules held in an nn.ModuleDict",
    containers.PARAMETER_LIST: "its parameters held in an nn.ParameterList",
    containers.PARAMETER_DICT: "its parameters held in an nn.ParameterDict",
    containers.PARAMETER: "its operands held as nn.Parameter",
}

# Literals that build a tensor when the forward runs (``torch.bucketize``'s boundaries).
TENSOR_FACTORIES = ("torch.linspace(", "torch.arange(", "torch.tensor(")


def _on_device(text: str, anchor: str | None) -> str:
    """A tensor a literal builds in ``forward`` goes where the call's tensors are: a bare
    factory builds it on the CPU, beside a model and inputs on the GPU."""
    if anchor is None or not text.startswith(TENSOR_FACTORIES) or not text.endswith(")"):
        return text
    return f"{text[:-1]}, device={anchor}.device)"


def _call_parts(link: Link, held: dict[str, str]) -> list[str]:
    """The call's arguments as written; ``held`` maps each parameter to how the model reads
    it (``self.weight``, ``self.params[0]``)."""
    parts = []

    def ref(name: str) -> str:
        return held.get(name, name)

    anchor = None  # the call's first single tensor argument, as written
    for i, (arg, name) in enumerate(zip(link.spec.args, link.inputs, strict=True)):
        if arg.tensor and not arg.count:
            anchor = "x" if i == link.main else (ref(name) if name else None)
            break

    for i, (arg, name) in enumerate(zip(link.spec.args, link.inputs, strict=True)):
        if arg.tensor and arg.count and name is not None:
            items = [
                "x" if (i == link.main and j == 0) else ref(f"{name}_{j}") for j in range(arg.count)
            ]
            text = "[" + ", ".join(items) + "]"
        elif i == link.main:
            text = "x"
        elif name is not None:
            text = ref(name)
        else:
            text = _on_device(literal(arg.value), anchor)
        parts.append(f"{arg.name}={text}" if arg.keyword else text)
    return parts


def _expression(link: Link, callee: str, held: dict[str, str], whole: bool = False) -> str:
    """The link's call; ``callee`` is how the model reads a module link's module."""
    spec, parts = link.spec, _call_parts(link, held)
    if link.combine:  # a constant operand, built where the running tensor is
        return f"x {link.combine} {spec.target}({', '.join([*parts, 'device=x.device'])})"
    if spec.kind == "module":
        call = f"{callee}({', '.join(parts)})"
    elif spec.kind == "operator":
        call = (
            f"({f' {spec.target} '.join(parts)})" if link.pick else f" {spec.target} ".join(parts)
        )
    elif spec.kind == "method":
        call = f"{parts[0]}.{spec.target}({', '.join(parts[1:])})"
    else:
        call = f"{spec.target}({', '.join(parts)})"
    return call if whole else call + "".join(f"[{i}]" for i in link.pick)


def _imports(chain: Chain) -> list[str]:
    extra = []
    for link in chain.links:
        module = link.spec.target.rpartition(".")[0]
        if (
            link.spec.kind in ("module", "function")
            and module
            and module.split(".")[0] not in ROOTS
        ):
            line = f"import {module}"
            if line not in extra:
                extra.append(line)
    return extra


def _kept_values(
    chain: Chain, taken: set[str], held: dict[str, str], first_name: str
) -> dict[int, str]:
    """The local name each reuse source is kept under (by the link it enters), and how every
    reused operand is written into ``held``: its source's name, ``x`` for the running tensor
    (the first input's name for the first link), derived as the link takes it."""
    kept: dict[int, str] = {}
    for j in sorted(reuse_sources(chain.links)):
        kept[j] = _claim("residual", taken)
    for k, link in enumerate(chain.links):
        for name, j, how in link.reuses:
            held[name] = written(kept[j] if j < k else ("x" if k else first_name), how)
    return kept


def render_code(chain: Chain) -> str:
    weights, buffers = weight_names(chain), buffer_names(chain)
    specs = chain.input_specs()
    inputs = {
        name: arg for name, arg in specs.items() if name not in weights and name not in buffers
    }
    names = _Names(set(inputs) | {"Model", "torch", "nn", "F", "x", BATCH_NAME, SCALE_NAME})
    names.values[SCALE_NAME] = "1"
    names.values[BATCH_NAME] = f"{chain.batch} * {SCALE_NAME}"
    first_name, first = next(iter(inputs.items()))
    dim_names: dict[int, str] = {}
    for d, role in enumerate(FIRST_DIMS.get(len(first.shape), ()), start=1):
        if d < len(first.shape) and d not in chain.batch_dims.get(first_name, ()):
            dim_names[d] = names.define(role, str(first.shape[d]))

    def shape_source(name: str, shape: tuple[int, ...]) -> str:
        follows = chain.batch_dims.get(name, ())
        parts = []
        for d, size in enumerate(shape):
            if d in follows:
                parts.append(BATCH_NAME)
            elif d in dim_names and len(shape) == len(first.shape) and first.shape[d] == size:
                parts.append(dim_names[d])
            else:
                parts.append(str(size))
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"

    init_params: list[str] = []
    attrs: set[str] = set(weights)

    def drawn_at_init(name: str) -> str:
        return draw_expression(specs[name], literal(tuple(specs[name].shape)))

    parameters = {
        name: f"nn.Parameter({drawn_at_init(name)})"
        for name in sorted(weights, key=list(specs).index)
    }
    held, init_lines = _held_parameters(parameters, chain.container, attrs)
    for name in sorted(buffers, key=list(specs).index):
        attrs.add(name)
        held[name] = f"self.{name}"
        init_lines.append(f'self.register_buffer("{name}", {drawn_at_init(name)})')
    modules: dict[int, tuple[str, str]] = {}  # link index -> (attribute, constructor call)
    for i, link in enumerate(chain.links):
        if link.spec.kind == "module":
            positional = [names.define(role, literal(value)) for role, value in link.spec.init]
            init_params += positional
            keywords = [f"{k}={literal(v)}" for k, v in link.spec.init_kwargs]
            built = f"{link.spec.target}({', '.join(positional + keywords)})"
            modules[i] = (_attr(link.spec, attrs), built)
    callees, module_lines, run = _held_modules(chain.container, modules, chain.links, attrs)
    init_lines += module_lines
    kept = _kept_values(chain, set(inputs) | set(names.values), held, first_name)
    forward: list[str] = []
    for i, link in enumerate(chain.links):
        if run is not None and i in run[1:]:  # called through the nn.Sequential's first
            continue
        if i in kept:
            forward.append(f"{kept[i]} = {'x' if i else first_name}")
        last = chain.links[run.stop - 1] if run is not None and i == run.start else link
        whole = chain.returns_tuple and last is chain.links[-1]
        call = _expression(link, callees.get(i, ""), held, whole=True)
        forward.append(f"x = {call}" + ("" if whole else "".join(f"[{p}]" for p in last.pick)))

    draws = [
        f"    {name} = {draw_expression(arg, shape_source(name, arg.shape))}"
        for name, arg in inputs.items()
    ]
    ops = [link.name for link in chain.links]
    doc = (
        f"Single operator: {ops[0]}."
        if len(ops) == 1
        else f"Fused chain of {len(ops)} operators: {' -> '.join(ops)}."
    )
    if chain.container:
        doc = doc[:-1] + f", {HELD[chain.container]}."
    if chain.returns_tuple:
        doc = doc[:-1] + ", returning the last operator's whole output."
    params = "".join(f", {p}" for p in init_params)
    lines = [
        f'"""{doc}"""',
        "",
        "import torch",
        "import torch.nn as nn",
        "import torch.nn.functional as F",
        *_imports(chain),
        "",
        "",
        "class Model(nn.Module):",
        f"    def __init__(self{params}):",
        "        super().__init__()",
        *[f"        {line}" for line in init_lines],
        "",
        f"    def forward(self, {', '.join(inputs)}):",
        *[f"        {line}" for line in forward[:-1]],
        f"        return {forward[-1].removeprefix('x = ')}",
        "",
        "",
        *[
            f"{name} = {source}" + (SCALE_COMMENT if name == SCALE_NAME else "")
            for name, source in names.values.items()
        ],
        "",
        "",
        "def get_inputs():",
        *draws,
        f"    return [{', '.join(inputs)}]",
        "",
        "",
        "def get_init_inputs():",
        f"    return [{', '.join(init_params)}]",
    ]
    return "\n".join(lines) + "\n"


def describe(chain: Chain) -> dict[str, Any]:
    """Everything needed to audit or resize a task without parsing its code."""
    specs, weights, buffers = chain.input_specs(), weight_names(chain), buffer_names(chain)
    described = {
        "inputs": {
            name: {"shape": list(arg.shape), "dtype": arg.dtype}
            for name, arg in specs.items()
            if name not in weights and name not in buffers
        },
        "parameters": {name: list(arg.shape) for name, arg in specs.items() if name in weights},
        "batch_dims": {k: list(v) for k, v in chain.batch_dims.items()},
        "links": [_described_link(link) for link in chain.links],
        "returns_tuple": chain.returns_tuple,
        "batch_size": chain.batch,
        "scale": 1,
    }
    if chain.container:
        described["container"] = chain.container
    if buffers:
        described["buffers"] = {
            name: {"shape": list(arg.shape), "dtype": arg.dtype}
            for name, arg in specs.items()
            if name in buffers
        }
    return described


def _described_link(link: Link) -> dict[str, Any]:
    """A link's operator, library and continued element; the source of each operand it takes
    from the chain (``reuses``) and how one derives from it (``derived``: its comparison with
    zero, its transpose), where it has them."""
    described: dict[str, Any] = {
        "name": link.name,
        "library": link.spec.library,
        "pick": list(link.pick),
    }
    if link.reuses:
        described["reuses"] = {name: j for name, j, _ in link.reuses}
    derivations = {name: written("", how).strip() for name, _, how in link.reuses if how}
    if derivations:
        described["derived"] = derivations
    return described


def render_task(
    chain: Chain,
    *,
    composer: str,
    config_hash: str = "",
    meta: dict[str, Any] | None = None,
    composer_version: str = synth.__version__,
) -> Task:
    ops = chain.ops
    return Task(
        ops=ops,
        data_source=f"torch#{len(ops)}",
        code=render_code(chain),
        seed_ids=[link.seed_id for link in chain.links],
        composer=composer,
        composer_version=composer_version,
        config_hash=config_hash,
        meta={**describe(chain), **(meta or {})},
    )
