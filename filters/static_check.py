"""Static pre-check of a candidate's source: cheap, pure, and only a first line of defence.

It rejects sources that cannot be a KernelBench task (no parse, missing ``Model`` /
``get_inputs`` / ``get_init_inputs``) and sources that reach for things a PyTorch operator
task never needs (files, processes, sockets, introspection escapes, a random generator's
state). It never executes the code. It judges names by what they resolve to in the AST
(import aliases, attribute chains, bindings), not by text: ``torch.os``, ``getattr`` with a
computed name, a parameter that shadows ``open`` are all refused. A name resolves only while
it is spelled out, so a module, or ``getattr``, may not be used as a value (``T = torch``,
``g = getattr``, ``f(torch)``): through an alias, ``T._C`` would be a name the check cannot
read. Whether a dotted name is a module is looked up in the installed library, never in the
candidate's code. What slips past it is still contained by the sandbox, which is the real
defence; this check exists so that the obvious cases are cheap, explainable rejections
instead of sandbox kills.
"""

from __future__ import annotations

import ast
import functools
import importlib
import sys
import types
from collections.abc import Iterator

from opsynth.record import Task
from opsynth.source import REQUIRED_SYMBOLS, dotted_name, import_aliases
from opsynth.stage import KEEP, Decision, drop

# Top-level modules a task may import. Everything an Ops-6K task needs is torch plus a few
# pure helper modules; anything that touches the OS, processes or the network is absent.
ALLOWED_MODULES = frozenset(
    {
        "__future__",
        "torch",
        "math",
        "typing",
        "numbers",
        "functools",
        "itertools",
        "collections",
        "dataclasses",
        "enum",
        "abc",
    }
)

# ``transformers`` is allowed only for tasks whose data_source says they come from it.
TRANSFORMERS_MODULE = "transformers"

# Parts of torch that load or build native code, read or write files, spawn processes or
# talk to the network. A dotted name equal to one of these, or below it, is rejected.
FORBIDDEN_TORCH_MODULES = frozenset(
    {
        "torch.utils.cpp_extension",
        "torch.hub",
        "torch.multiprocessing",
        "torch.distributed",
        "torch.package",
        "torch.utils.data",
        # the C core (e.g. DisableTorchFunction, which hides compute from the evaluator's
        # guard), custom-operator registration, pickle loading, dispatch-mode overrides
        "torch._C",
        "torch.library",
        "torch.serialization",
        "torch.overrides",
        "torch.utils._python_dispatch",
    }
)
# Standard-library modules that other modules re-export as attributes (``torch.os``,
# ``F.sys``): reaching one through an attribute is the import the allow-list refused.
FORBIDDEN_MODULE_ATTRIBUTES = frozenset(
    {
        "os",
        "sys",
        "builtins",
        "subprocess",
        "importlib",
        "ctypes",
        "socket",
        "shutil",
        "inspect",
        "gc",
        "pickle",
        "marshal",
        "runpy",
        "signal",
        "threading",
        "multiprocessing",
        "tempfile",
        "io",
        "pathlib",
    }
)
FORBIDDEN_TORCH_CALLS = frozenset(
    {
        "torch.load",
        "torch.save",
        "torch.from_file",
        "torch.jit.load",
        "torch.jit.save",
        "torch.ops.load_library",
        "torch.classes.load_library",
        "torch.UntypedStorage.from_file",
        "torch.TypedStorage.from_file",
        "torch.Storage.from_file",
    }
)

# What seeds, builds or restores one of torch's random generators, by the last part of its
# dotted name under torch (``torch.manual_seed``, ``torch.cuda.manual_seed_all``,
# ``torch.random.fork_rng``, ``torch.Generator``). A task that seeds its own generator gives
# the same output under every RNG state the checks set, so a dropout mask passes as
# deterministic, and seeded from its input it is pseudo-random output keyed on the input:
# either way, its output is the generator's stream, which no kernel can be asked to
# reproduce. Neither KernelBench nor Ops-6K does it.
RNG_STATE_NAMES = frozenset(
    {
        "manual_seed",
        "manual_seed_all",
        "seed",
        "seed_all",
        "set_rng_state",
        "set_rng_state_all",
        "fork_rng",
        "Generator",
        "default_generator",
        "default_generators",
    }
)

# Builtins that execute strings, reach the interpreter's namespaces or touch files. Their
# mere mention is rejected (``f = open`` is as bad as ``open(...)``) unless the module binds
# the name itself.
FORBIDDEN_BUILTIN_REFERENCES = frozenset(
    {"open", "eval", "exec", "compile", "__import__", "globals", "locals", "breakpoint"}
)
# Builtins that are harmless as names (``def forward(self, input)``) but not as calls.
FORBIDDEN_BUILTIN_CALLS = frozenset({"input", "exit", "quit", "help", "vars"})
# Methods a task never defines: one that swallows exceptions raised in its block
# (``__exit__`` returning true), or runs at a time of the interpreter's choosing (``__del__``).
FORBIDDEN_METHODS = frozenset({"__exit__", "__aexit__", "__del__"})
# Names of the module-level magic a task never needs.
FORBIDDEN_NAMES = frozenset({"__builtins__", "__loader__", "__spec__"})

# Attributes used to climb from any object to the interpreter's globals or builtins.
FORBIDDEN_ATTRIBUTES = frozenset(
    {
        "__subclasses__",
        "__globals__",
        "__builtins__",
        "__code__",
        "__closure__",
        "__bases__",
        "__base__",
        "__mro__",
        "__getattribute__",
        "__import__",
        "__loader__",
        "__spec__",
        "__reduce__",
        "__reduce_ex__",
        "__func__",
        "__self__",
        "__dict__",
        "f_globals",
        "f_locals",
        "f_builtins",
        "f_back",
        "tb_frame",
        "gi_frame",
        "cr_frame",
        "ag_frame",
    }
)
ATTRIBUTE_BUILTINS = frozenset({"getattr", "setattr", "delattr", "hasattr"})
# Of those, the ones that reach an attribute: as a value (``g = getattr``, ``reduce(getattr,
# ...)``) their attribute names are out of the check's sight.
REACHING_BUILTINS = frozenset({"getattr", "setattr", "delattr"})


class StaticCheck:
    """Filter ``static``: parse, required symbols, import allow-list, forbidden calls."""

    name = "static"

    def __init__(self, modules: frozenset[str] = frozenset()) -> None:
        self.modules = modules  # seed libraries' modules that composed tasks may import

    def filter(self, task: Task) -> Decision:
        return check_source(
            task.code,
            allow_transformers=_is_transformers(task.data_source),
            extra_modules=self.modules,
        )


def _is_transformers(data_source: str) -> bool:
    return data_source.startswith(TRANSFORMERS_MODULE)


def check_source(
    code: str,
    *,
    allow_transformers: bool = False,
    required: tuple[str, ...] = REQUIRED_SYMBOLS,
    extra_modules: frozenset[str] = frozenset(),
    permitted: frozenset[str] = frozenset(),
) -> Decision:
    """Judge one source text; see the module docstring for what is rejected and why.

    The solution evaluator reuses this for ``model_new.py``: it requires ``ModelNew``, may
    import the extension it built (``extra_modules``) and may use the dotted names in
    ``permitted`` (``torch.utils.cpp_extension.load_inline``) despite the forbidden lists."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError) as exc:
        return drop("syntax_error", f"{type(exc).__name__}: {exc}")

    missing = [name for name in required if name not in _module_bindings(tree)]
    if missing:
        return drop("missing_symbol", f"not defined at module level: {', '.join(missing)}")

    allowed = ALLOWED_MODULES | extra_modules
    allowed |= {TRANSFORMERS_MODULE} if allow_transformers else frozenset()
    aliases = import_aliases(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            problem = _import_problem(node, allowed, permitted)
            if problem is not None:
                return problem

    bound = _all_bindings(tree)
    rebound = sorted(bound & FORBIDDEN_BUILTIN_REFERENCES)
    if rebound:  # a parameter or variable named ``open`` would hide the builtin from the check
        return drop("forbidden_call", f"binds the builtin name {rebound[0]!r}")
    for node in ast.walk(tree):
        problem = _node_problem(node, aliases, bound, permitted)
        if problem is not None:
            return problem
    return _value_problem(tree, aliases, bound) or KEEP


def _import_problem(
    node: ast.Import | ast.ImportFrom, allowed: frozenset[str], permitted: frozenset[str]
) -> Decision | None:
    if isinstance(node, ast.ImportFrom):
        if node.level:
            return drop("forbidden_import", f"line {node.lineno}: relative import")
        module = node.module or ""
        full_names = [f"{module}.{alias.name}" for alias in node.names]
    else:
        module = ""
        full_names = [alias.name for alias in node.names]
    for alias in node.names if isinstance(node, ast.ImportFrom) else ():
        if alias.name in FORBIDDEN_MODULE_ATTRIBUTES:  # ``from torch import sys``
            return drop("forbidden_import", f"line {node.lineno}: import of {alias.name!r}")
    for full in full_names or [module]:
        root = full.split(".")[0]
        if root not in allowed:
            return drop("forbidden_import", f"line {node.lineno}: import of {root!r}")
        if _under(full, permitted):
            continue
        if _under(full, FORBIDDEN_TORCH_MODULES) or (
            module and _under(module, FORBIDDEN_TORCH_MODULES)
        ):
            return drop("forbidden_import", f"line {node.lineno}: import of {full!r}")
        if _under(full, FORBIDDEN_TORCH_CALLS) or _rng_state(full):
            return drop("forbidden_call", f"line {node.lineno}: import of {full!r}")
    return None


def _node_problem(
    node: ast.AST, aliases: dict[str, str], bound: set[str], permitted: frozenset[str]
) -> Decision | None:
    line = getattr(node, "lineno", "?")
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
        if node.id in FORBIDDEN_NAMES:
            return drop("forbidden_call", f"line {line}: use of {node.id}")
        if node.id in FORBIDDEN_BUILTIN_REFERENCES and node.id not in bound:
            return drop("forbidden_call", f"line {line}: use of builtin {node.id}()")
    elif isinstance(node, ast.Attribute):
        if node.attr in FORBIDDEN_ATTRIBUTES:
            return drop("forbidden_call", f"line {line}: attribute {node.attr}")
        if node.attr in FORBIDDEN_MODULE_ATTRIBUTES:
            return drop("forbidden_call", f"line {line}: module {node.attr!r} as an attribute")
        dotted = dotted_name(node, aliases)
        if dotted and _forbidden_dotted(dotted) and not _under(dotted, permitted):
            return drop("forbidden_call", f"line {line}: use of {dotted}")
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        name = node.func.id
        if name in FORBIDDEN_BUILTIN_CALLS and name not in bound:
            return drop("forbidden_call", f"line {line}: call of builtin {name}()")
        if name in ATTRIBUTE_BUILTINS and name not in bound and len(node.args) >= 2:
            return _attribute_builtin_problem(node, aliases, line)
    elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        if node.name in FORBIDDEN_METHODS:
            return drop("forbidden_call", f"line {line}: defines {node.name}")
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
        for attr in ("__globals__", "__subclasses__", "__builtins__", "__import__"):
            if attr in node.value:
                return drop("forbidden_call", f"line {line}: string mentions {attr}")
    return None


def _attribute_builtin_problem(
    node: ast.Call, aliases: dict[str, str], line: object
) -> Decision | None:
    func = node.func.id  # type: ignore[union-attr]
    target = node.args[1]
    if not (isinstance(target, ast.Constant) and isinstance(target.value, str)):
        if func == "hasattr":
            return None
        # a name built at run time ('o' + 's') is one this check cannot read
        return drop("forbidden_call", f"line {line}: {func}() with a computed attribute name")
    attr = target.value
    if (
        attr.startswith("__")
        and attr.endswith("__")
        or attr in FORBIDDEN_ATTRIBUTES
        or attr in FORBIDDEN_MODULE_ATTRIBUTES
    ):
        return drop("forbidden_call", f"line {line}: {func}(..., {attr!r})")
    base = dotted_name(node.args[0], aliases)
    if base and _forbidden_dotted(f"{base}.{attr}"):
        return drop("forbidden_call", f"line {line}: {func}({base}, {attr!r})")
    return None


def _value_problem(tree: ast.Module, aliases: dict[str, str], bound: set[str]) -> Decision | None:
    """The first module, or attribute-reaching builtin, used as a value rather than read
    through an attribute, a call or a checked ``getattr`` (see the module docstring)."""
    nodes = list(ast.walk(tree))  # walked once, read twice
    reached: set[int] = set()  # ``x`` of ``x.attr``, ``x(...)`` and ``getattr(x, ...)``
    for node in nodes:
        if isinstance(node, ast.Attribute):
            reached.add(id(node.value))
        elif isinstance(node, ast.Call):
            reached.add(id(node.func))
            if isinstance(node.func, ast.Name) and node.func.id in ATTRIBUTE_BUILTINS:
                reached.update(id(arg) for arg in node.args[:1])
    for node in nodes:
        line = getattr(node, "lineno", "?")
        loaded = isinstance(node, ast.Name | ast.Attribute) and isinstance(node.ctx, ast.Load)
        if loaded and id(node) not in reached:
            if isinstance(node, ast.Name) and node.id in REACHING_BUILTINS - bound:
                return drop("forbidden_call", f"line {line}: {node.id} as a value")
            dotted = dotted_name(node, aliases)
            if dotted and _is_module(dotted):
                return drop("forbidden_call", f"line {line}: module {dotted} as a value")
        reached_module = _getattr_module(node, aliases)
        if reached_module:
            return drop("forbidden_call", f"line {line}: getattr of module {reached_module}")
    return None


def _getattr_module(node: ast.AST, aliases: dict[str, str]) -> str:
    """``a.b`` when ``node`` is ``getattr(a, "b")`` and that is a module, else ""."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        return ""
    if node.func.id != "getattr" or len(node.args) < 2:
        return ""
    base, attr = dotted_name(node.args[0], aliases), node.args[1]
    if not (base and isinstance(attr, ast.Constant) and isinstance(attr.value, str)):
        return ""
    dotted = f"{base}.{attr.value}"
    return dotted if _is_module(dotted) else ""


@functools.lru_cache(maxsize=4096)
def _is_module(dotted: str) -> bool:
    """Whether ``dotted`` names a module of the installed libraries (an attribute that is one,
    or a submodule); a name that does not resolve is not one. Cached: the answer depends on
    the installed libraries alone, and every task asks about the same few names."""
    parts = dotted.split(".")
    try:
        value: object = sys.modules.get(parts[0]) or importlib.import_module(parts[0])
    except Exception:  # not installed here (the solution's own extension)
        return False
    for i, part in enumerate(parts[1:], start=2):
        try:
            value = getattr(value, part)
        except Exception:
            try:
                value = importlib.import_module(".".join(parts[:i]))
            except Exception:
                return False
    return isinstance(value, types.ModuleType)


def _forbidden_dotted(dotted: str) -> bool:
    return (
        _under(dotted, FORBIDDEN_TORCH_CALLS)
        or _under(dotted, FORBIDDEN_TORCH_MODULES)
        or _rng_state(dotted)
    )


def _rng_state(dotted: str) -> bool:
    """Whether ``dotted`` names something that seeds, builds or restores a torch generator
    (``RNG_STATE_NAMES``)."""
    parts = dotted.split(".")
    return parts[0] == "torch" and any(part in RNG_STATE_NAMES for part in parts[1:])


def _under(name: str, prefixes: frozenset[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _module_bindings(tree: ast.Module) -> set[str]:
    """Names bound at module level, looking into top-level if/try/with blocks."""
    names: set[str] = set()
    for stmt in _top_level(tree.body):
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(stmt.name)
        elif isinstance(stmt, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(stmt, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in stmt.names)
    return names


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If | ast.With | ast.For | ast.While):
            yield from _top_level(stmt.body)
            yield from _top_level(getattr(stmt, "orelse", []))
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, stmt.orelse, stmt.finalbody):
                yield from _top_level(block)
            for handler in stmt.handlers:
                yield from _top_level(handler.body)


def _all_bindings(tree: ast.Module) -> set[str]:
    """Every name the source binds anywhere (parameters, assignments, defs, imports)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names
