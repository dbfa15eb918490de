"""Reference profiles: what a task set looks like, in counts and shares, without its code.

A profile is the yardstick a regenerated set is held against (``opsynth report --reference``)
and what a composer can aim its draws at. It holds operator and category counts, the
data_source mix, and the input/output structure of the tasks, all derived; no task code, so
the one built from the released Ops-6K can ship in ``data/profiles/``.

Structure comes from parsing each task's code with ``ast``, never running it, so building a
profile is safe on untrusted sets and needs no torch. The parse is a heuristic with stated
rules (``task_structure``); a code it cannot read still counts as a task, with no structure.

Build one with::

    python -m opsynth.profile --input PATH.parquet --out data/profiles/NAME.json
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opsynth.call_arguments import argument_profile, checked_arguments
from opsynth.call_names import aliases_of, canonical, dotted
from opsynth.data import data_file
from opsynth.taxonomy import CATEGORIES, OTHER, task_categories

FORMAT = 1
PROFILE_DIR = data_file("profiles")
SHIPPED = {"ops6k": PROFILE_DIR / "ops6k.json"}
UNIFORM = "uniform"
REQUIRED_KEYS = (
    "name",
    "tasks",
    "data_source",
    "ops",
    "occurrences",
    "categories",
    "structure",
    "sequences",
    "transformers_classes",
)
REQUIRED_COLUMNS = ("ops", "data_source", "code")
TRANSFORMERS = "transformers"
SHARE_DIGITS = 6
_VARIANT = re.compile(r"_\d+$")

# -- reading ops ----------------------------------------------------------------------------


def ops_list(value: object) -> list[str]:
    """A row's ``ops`` as a list: a JSON list string, a list, or (the released transformers
    rows) a bare class name."""
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    text = str(value)
    try:
        parsed = json.loads(text)
    except ValueError:
        return [text]
    return [str(v) for v in parsed] if isinstance(parsed, list) else [text]


def class_family(name: str) -> str:
    """A transformers class name without its variant suffix: ``HieraLayer_0`` -> ``HieraLayer``."""
    return _VARIANT.sub("", name)


# -- structure of one task ------------------------------------------------------------------

# Canonical names (``torch.x``, ``nn.X``, ``F.x``) of calls that always return a tuple.
TUPLE_OPS = frozenset(
    {
        "torch.topk",
        "torch.sort",
        "torch.kthvalue",
        "torch.mode",
        "torch.aminmax",
        "torch.frexp",
        "torch.var_mean",
        "torch.std_mean",
        "torch.cummax",
        "torch.cummin",
        "torch.split",
        "torch.split_with_sizes",
        "torch.tensor_split",
        "torch.hsplit",
        "torch.vsplit",
        "torch.dsplit",
        "torch.chunk",
        "torch.unbind",
        "torch.meshgrid",
        "torch.broadcast_tensors",
        "torch.histogram",
        "torch.slogdet",
        "torch.qr",
        "torch.svd",
        "F.multi_head_attention_forward",
    }
)
# ...and those that return one only when given a dimension (``torch.max(x, 1)``).
TUPLE_WITH_DIM = frozenset({"torch.max", "torch.min", "torch.median", "torch.nanmedian"})
# Tensor methods of the same kinds (``x.topk(3)``, ``x.max(dim=1)``).
TUPLE_METHODS = frozenset(
    {"topk", "sort", "kthvalue", "mode", "aminmax", "cummax", "cummin", "split", "chunk"}
    | {"unbind", "split_with_sizes", "tensor_split", "hsplit", "vsplit", "dsplit", "frexp"}
)
TUPLE_METHODS_WITH_DIM = frozenset({"max", "min", "median", "nanmedian"})
# Modules whose call returns a tuple (output and state, or output and weights).
TUPLE_MODULES = frozenset(
    {"nn.LSTM", "nn.GRU", "nn.RNN", "nn.MultiheadAttention", "nn.AdaptiveLogSoftmaxWithLoss"}
)

SHAPE_FACTORIES = frozenset(
    {"torch.randn", "torch.rand", "torch.zeros", "torch.ones", "torch.empty"}
)
INT_FACTORIES = frozenset({"torch.randint", "torch.randperm", "torch.multinomial"})
INT_DTYPES = frozenset(
    f"torch.{d}"
    for d in ("long", "int", "short", "bool", "int64", "int32", "int16", "int8", "uint8")
)
INT_CASTS = frozenset({"long", "int", "short", "bool", "byte", "char"})
RESHAPES = frozenset({"view", "reshape", "expand", "repeat"})
RANK_UNKNOWN_METHODS = frozenset(
    {"squeeze", "flatten", "sum", "mean", "prod", "max", "min", "amax", "amin", "norm", "std"}
    | {"var", "argmax", "argmin", "any", "all", "item", "tolist", "unfold", "unbind", "split"}
    | {"chunk", "view_as", "reshape_as", "expand_as", "nonzero", "masked_select"}
)
_BRANCH_TESTS = (ast.If, ast.While, ast.IfExp, ast.Assert)
_ORDERING = (ast.Lt, ast.Gt, ast.LtE, ast.GtE, ast.Eq, ast.NotEq)
UNREAD = {
    "parsed": False,
    "forward_inputs": None,
    "tuple_output": False,
    "int_input": False,
    "input_ranks": [],
}
_UNKNOWN = object()  # a value the evaluator could not work out (a tuple element keeps its slot)


def _evaluate(node: ast.AST, env: Mapping[str, Any]) -> Any:
    """A constant expression's value (int, float, or tuple), ``_UNKNOWN`` where it cannot be
    known; tuple elements may be unknown while the tuple's length is still known."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List)):
        items: list[Any] = []
        for elt in node.elts:
            if isinstance(elt, ast.Starred):
                inner = _evaluate(elt.value, env)
                if not isinstance(inner, tuple):
                    return _UNKNOWN
                items.extend(inner)
            else:
                items.append(_evaluate(elt, env))
        return tuple(items)
    if isinstance(node, ast.Name):
        return env.get(node.id, _UNKNOWN)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _evaluate(node.operand, env)
        return -value if isinstance(value, (int, float)) else _UNKNOWN
    if isinstance(node, ast.BinOp):
        return _binop(node.op, _evaluate(node.left, env), _evaluate(node.right, env))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 1:
        if node.func.id in ("tuple", "list"):
            value = _evaluate(node.args[0], env)
            return value if isinstance(value, tuple) else _UNKNOWN
        if node.func.id == "int":
            value = _evaluate(node.args[0], env)
            return int(value) if isinstance(value, (int, float)) else _UNKNOWN
    size_call = isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords
    if size_call and (dotted(node.func) or "").endswith("Size"):  # torch.Size([a, b])
        value = _evaluate(node.args[0], env)
        return value if isinstance(value, tuple) else _UNKNOWN
    if isinstance(node, ast.Subscript):
        base = _evaluate(node.value, env)
        if isinstance(base, tuple):
            if isinstance(node.slice, ast.Slice):
                bounds = [
                    _evaluate(b, env) if b is not None else None
                    for b in (node.slice.lower, node.slice.upper, node.slice.step)
                ]
                if all(b is None or isinstance(b, int) for b in bounds):
                    return base[slice(*bounds)]
                return _UNKNOWN
            index = _evaluate(node.slice, env)
            if isinstance(index, int) and -len(base) <= index < len(base):
                return base[index]
    return _UNKNOWN


def _binop(op: ast.operator, left: Any, right: Any) -> Any:
    numbers = isinstance(left, (int, float)) and isinstance(right, (int, float))
    try:
        if numbers and isinstance(op, ast.Add):
            return left + right
        if numbers and isinstance(op, ast.Sub):
            return left - right
        if numbers and isinstance(op, ast.Mult):
            return left * right
        if numbers and isinstance(op, ast.FloorDiv):
            return left // right
        if numbers and isinstance(op, ast.Div):
            return left / right
        if numbers and isinstance(op, ast.Mod):
            return left % right
        if numbers and isinstance(op, ast.Pow) and abs(right) < 64:
            return left**right
    except (ArithmeticError, ValueError):
        return _UNKNOWN
    if isinstance(op, ast.Add) and isinstance(left, tuple) and isinstance(right, tuple):
        return left + right
    if isinstance(op, ast.Mult) and isinstance(left, tuple) and isinstance(right, int):
        return left * right if 0 <= right < 16 else _UNKNOWN
    return _UNKNOWN


def _bind(statements: Iterable[ast.stmt], env: dict[str, Any]) -> None:
    """Record simple assignments (``a = 3``, ``a = b = (1, 2)``, ``a, b = 1, 2``) in order."""
    for stmt in statements:
        if not isinstance(stmt, ast.Assign):
            continue
        value = _evaluate(stmt.value, env)
        for target in stmt.targets:
            if isinstance(target, ast.Name):
                env[target.id] = value
            elif isinstance(target, (ast.Tuple, ast.List)):
                names = [t.id if isinstance(t, ast.Name) else None for t in target.elts]
                values = value if isinstance(value, tuple) and len(value) == len(names) else ()
                for i, name in enumerate(names):
                    if name is not None:
                        env[name] = values[i] if values else _UNKNOWN


def _shape_rank(args: list[ast.expr], env: Mapping[str, Any]) -> int | None:
    """The rank a ``randn``-style shape argument list gives: ``(a, b)``, ``((a, b),)``,
    ``(*shape,)``, ``(batch, *rest)``; None when it cannot be told."""
    if len(args) == 1 and not isinstance(args[0], ast.Starred):
        value = _evaluate(args[0], env)
        if isinstance(value, tuple):
            return len(value)
        if isinstance(value, int):
            return 1
        return None
    rank = 0
    for arg in args:
        if isinstance(arg, ast.Starred):
            value = _evaluate(arg.value, env)
            if not isinstance(value, tuple):
                return None
            rank += len(value)
        else:
            rank += 1
    return rank


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _created_rank(call: ast.Call, target: str, env: Mapping[str, Any]) -> int | None:
    """The rank of the tensor a factory call builds, from its shape arguments."""
    size = _keyword(call, "size")
    if target in SHAPE_FACTORIES:
        return _shape_rank([size] if size is not None else list(call.args), env)
    if target == "torch.randint":
        if size is not None:
            return _shape_rank([size], env)
        if len(call.args) in (2, 3):
            return _shape_rank([call.args[-1]], env)
        return None
    if target == "torch.full":
        shape = size if size is not None else (call.args[0] if call.args else None)
        return _shape_rank([shape], env) if shape is not None else None
    if target in ("torch.randperm", "torch.arange", "torch.linspace"):
        return 1
    if target == "torch.tensor" and call.args:
        return _literal_depth(call.args[0])
    return None


def _literal_depth(node: ast.AST) -> int | None:
    depth = 0
    while isinstance(node, (ast.List, ast.Tuple)):
        if not node.elts:
            return depth + 1
        depth += 1
        node = node.elts[0]
    return depth if isinstance(node, (ast.Constant, ast.UnaryOp)) else None


def _after_methods(
    call: ast.Call, rank: int | None, parents: Mapping[ast.AST, ast.AST], env: Mapping
) -> int | None:
    """Follow a method chain on a created tensor (``torch.randn(...).view(a, -1).float()``):
    reshapes set the rank from their arguments, ``unsqueeze`` adds one, methods that may
    change it (squeeze, reductions, indexing) make it unknown, the rest keep it."""
    node: ast.AST = call
    while rank is not None:
        parent = parents.get(node)
        if isinstance(parent, ast.Subscript) and parent.value is node:
            return None
        if not (isinstance(parent, ast.Attribute) and parent.value is node):
            return rank
        outer = parents.get(parent)
        if not (isinstance(outer, ast.Call) and outer.func is parent):
            return rank  # an attribute (``.shape``): no tensor of this rank is built
        method = parent.attr
        if method in RESHAPES:
            rank = _shape_rank(list(outer.args), env) if outer.args else None
        elif method == "unsqueeze":
            rank += 1
        elif method in RANK_UNKNOWN_METHODS:
            rank = None
        node = outer
    return rank


def _is_int_dtype(node: ast.AST, aliases: Mapping[str, str]) -> bool:
    return isinstance(node, ast.Attribute) and canonical(node, aliases) in INT_DTYPES


def _int_literal(node: ast.AST) -> bool:
    """A list literal of int constants only (``torch.tensor([0, 2])`` builds an int64 tensor)."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return bool(node.elts) and all(_int_literal(e) for e in node.elts)
    if isinstance(node, ast.UnaryOp):
        node = node.operand
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int)
        and not isinstance(node.value, bool)
    )


def _inputs_facts(
    func: ast.FunctionDef,
    aliases: Mapping[str, str],
    module: ast.Module,
    module_env: Mapping[str, Any],
) -> tuple[bool, list[int]]:
    """Whether ``get_inputs`` builds an integer or bool tensor, and the ranks it builds; a
    module-level tensor it returns by name (``x = torch.randn(...)`` above it) counts too."""
    env = dict(module_env)
    _bind(func.body, env)
    local = {
        n.id for n in ast.walk(func) if isinstance(n, ast.Name) and n.ctx.__class__ is ast.Store
    }
    used = {n.id for n in ast.walk(func) if isinstance(n, ast.Name)} - local
    roots: list[ast.AST] = [func]
    for stmt in module.body:
        if isinstance(stmt, ast.Assign) and any(
            isinstance(n, ast.Name) and n.id in used for t in stmt.targets for n in ast.walk(t)
        ):
            roots.append(stmt.value)
    integer, ranks = False, set()
    for root in roots:
        found_int, found_ranks = _scan(root, aliases, env if root is func else module_env)
        integer = integer or found_int
        ranks.update(found_ranks)
    return integer, sorted(ranks)


def _scan(root: ast.AST, aliases: Mapping[str, str], env: Mapping[str, Any]):
    parents = {child: node for node in ast.walk(root) for child in ast.iter_child_nodes(node)}
    branch_tests = {id(n.test) for n in ast.walk(root) if isinstance(n, _BRANCH_TESTS)}
    integer, ranks = False, []
    for node in ast.walk(root):
        if _is_int_dtype(node, aliases):
            integer = True
        elif isinstance(node, ast.Compare) and id(node) not in branch_tests:
            integer = integer or all(isinstance(op, _ORDERING) for op in node.ops)
        elif isinstance(node, ast.Call):
            target = canonical(node.func, aliases)
            if target in INT_FACTORIES:
                integer = True
            elif target == "torch.tensor" and node.args and _int_literal(node.args[0]):
                integer = integer or _keyword(node, "dtype") is None
            elif target == "torch.arange" and _keyword(node, "dtype") is None:
                values = [_evaluate(a, env) for a in node.args]
                integer = integer or (bool(values) and all(type(v) is int for v in values))
            elif (
                isinstance(node.func, ast.Attribute)
                and node.func.attr in INT_CASTS
                and not node.args
                and canonical(node.func.value, aliases) != "torch"
            ):
                integer = True  # a cast method: x.long(), (torch.rand(n) * 4).int()
            if target is not None:
                rank = _created_rank(node, target, env)
                rank = _after_methods(node, rank, parents, env)
                if rank is not None:
                    ranks.append(rank)
    return integer, ranks


def _dim_given(call: ast.Call, first: int) -> bool:
    """Whether a max/min-style call names a dimension: ``dim=``, or an int (or a name that
    says dim/axis) at positional index ``first``."""
    if _keyword(call, "dim") is not None:
        return True
    if len(call.args) <= first:
        return False
    arg = call.args[first]
    if isinstance(arg, ast.UnaryOp):
        arg = arg.operand
    if isinstance(arg, ast.Constant):
        return isinstance(arg.value, int) and not isinstance(arg.value, bool)
    name = dotted(arg) or ""
    tail = name.rsplit(".", 1)[-1].lower()
    return "dim" in tail or "axis" in tail


def _tuple_modules(model: ast.ClassDef, aliases: Mapping[str, str]) -> set[str]:
    """``self.name`` attributes of the Model bound to a module whose call returns a tuple (an
    RNN, attention, or a pool built with ``return_indices=True``)."""
    found = set()
    for node in ast.walk(model):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        target = canonical(node.value.func, aliases) or ""
        indices = _keyword(node.value, "return_indices")
        returns_indices = isinstance(indices, ast.Constant) and indices.value is True
        if target in TUPLE_MODULES or (target.startswith("nn.") and returns_indices):
            for t in node.targets:
                if (
                    isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                ):
                    found.add(t.attr)
    return found


def _returns_tuple(
    value: ast.AST, aliases: Mapping[str, str], modules: set[str], assigned: Mapping
) -> bool:
    if isinstance(value, ast.Tuple):
        return True
    if isinstance(value, ast.Name) and value.id in assigned:
        return _returns_tuple(assigned[value.id], aliases, modules, {})
    if not isinstance(value, ast.Call):
        return False
    target = canonical(value.func, aliases) or ""
    if target in TUPLE_OPS or target.endswith("_with_indices"):
        return True
    indices = _keyword(value, "return_indices")
    if isinstance(indices, ast.Constant) and indices.value is True:
        return True
    if target in TUPLE_WITH_DIM:
        return _dim_given(value, 1)
    func = value.func
    if isinstance(func, ast.Attribute):
        if isinstance(func.value, ast.Name) and func.value.id == "self" and func.attr in modules:
            return True
        receiver = canonical(func.value, aliases) or ""
        if receiver == "torch" or receiver.startswith("torch."):
            return False  # a torch function, not a tensor method; the tables above decide
        if func.attr in TUPLE_METHODS:
            return True
        if func.attr in TUPLE_METHODS_WITH_DIM:
            return _dim_given(value, 0)
    return False


def _own_nodes(func: ast.FunctionDef) -> Iterable[ast.AST]:
    """The nodes of a function body, not descending into nested functions or lambdas."""
    stack: list[ast.AST] = list(func.body)
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                stack.append(child)


def _forward_facts(model: ast.ClassDef, aliases: Mapping[str, str]) -> tuple[int | None, bool]:
    forward = next(
        (
            n
            for n in model.body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "forward"
        ),
        None,
    )
    if forward is None:
        return None, False
    args = forward.args
    inputs = len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs) - 1
    modules = _tuple_modules(model, aliases)
    plain = [
        n
        for n in _own_nodes(forward)
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
    ]
    # in source order, so a name maps to its last assignment
    plain.sort(key=lambda n: (n.lineno, n.col_offset))
    assigned: dict[str, ast.AST] = {n.targets[0].id: n.value for n in plain}
    returns = []
    for node in _own_nodes(forward):
        if isinstance(node, ast.Return) and node.value is not None:
            returns.append(_returns_tuple(node.value, aliases, modules, assigned))
    return max(inputs, 0), any(returns)


def task_structure(code: str) -> dict[str, Any]:
    """What a task's code says about its inputs and outputs, read from its AST (never run):

    * ``forward_inputs``: parameters of ``Model.forward`` besides ``self`` (``*args`` and
      ``**kwargs`` not counted); None without a ``Model.forward``.
    * ``tuple_output``: some ``return`` of ``forward`` gives a tuple: a tuple literal
      (``return a, b``), or the direct result (no indexing, no unpacking) of an op that returns
      one: ``topk``/``sort``/``split``/``chunk``/``unbind``/``var_mean``/``std_mean`` and the
      like (``TUPLE_OPS``, ``TUPLE_METHODS``), ``max``/``min``/``median`` given a dimension,
      ``*_with_indices`` functions, and a ``self.`` module built as an LSTM/GRU/RNN/
      MultiheadAttention or with ``return_indices=True``; a returned name is followed to its
      last plain assignment in ``forward``.
    * ``int_input``: ``get_inputs`` builds an integer or bool tensor: ``torch.randint``/
      ``randperm``/``multinomial``, an integer or bool dtype anywhere (``dtype=torch.long``,
      ``.to(torch.bool)``), ``.long()``/``.int()``/``.bool()`` casts, a comparison such as
      ``torch.rand(n) > 0.5`` (not a branch test), ``torch.tensor`` of an int literal, or
      ``torch.arange`` of int constants.
    * ``input_ranks``: the ranks of the tensors ``get_inputs`` creates with ``torch.randn``/
      ``rand``/``randint``/``zeros``/``ones``/``empty``/``full``/``tensor`` (and 1-D
      ``randperm``/``arange``/``linspace``),
      from their shape arguments with module-level and local constants resolved, and a
      method chain on the result followed (``.view``/``.reshape`` set the rank,
      ``.unsqueeze`` adds one); tensors whose rank cannot be told are left out.

    ``parsed`` is False (and the rest empty) for code that does not parse.
    """
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {**UNREAD, "input_ranks": []}
    try:
        return _structure(tree)
    except RecursionError:  # pathologically nested code: parsed, but not analysed
        return {**UNREAD, "parsed": True, "input_ranks": []}


def _structure(tree: ast.Module) -> dict[str, Any]:
    aliases = aliases_of(tree)
    env: dict[str, Any] = {}
    _bind(tree.body, env)
    model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    inputs, tuple_output = _forward_facts(model, aliases) if model else (None, False)
    get_inputs = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_inputs"), None
    )
    integer, ranks = _inputs_facts(get_inputs, aliases, tree, env) if get_inputs else (False, [])
    return {
        "parsed": True,
        "forward_inputs": inputs,
        "tuple_output": tuple_output,
        "int_input": integer,
        "input_ranks": ranks,
    }


# -- profiles -------------------------------------------------------------------------------


def _share(count: int, total: int) -> float:
    return round(count / total, SHARE_DIGITS) if total else 0.0


def build_profile(rows: Iterable[Mapping[str, Any]], name: str = "profile") -> dict[str, Any]:
    """The profile of task rows (``ops``, ``data_source``, ``code``) as a JSON-ready dict.

    ``ops``/``occurrences`` count the operators of torch rows (tasks using each, and uses in
    all); a transformers row's ``ops`` is a class name, listed in ``transformers_classes``
    without its variant suffix instead. ``categories`` is each category's share of all tasks
    (``opsynth.taxonomy``; transformers rows fall in ``other``). ``sequences`` counts distinct
    ``ops`` lists. Shares are of all tasks, except ``arguments``' (of each operator's calls:
    ``opsynth.call_arguments``).
    """
    tasks = 0
    sources: Counter[str] = Counter()
    ops: Counter[str] = Counter()
    occurrences: Counter[str] = Counter()
    categories: Counter[str] = Counter()
    sequences: set[tuple[str, ...]] = set()
    families: set[str] = set()
    structure: Counter[str] = Counter()
    ranks: Counter[int] = Counter()
    codes: list[str] = []
    for row in rows:
        tasks += 1
        codes.append(str(row["code"]))
        source = str(row["data_source"])
        names = ops_list(row["ops"])
        sources[source] += 1
        sequences.add(tuple(names))
        categories.update(task_categories(names))
        if source == TRANSFORMERS:
            families.update(class_family(n) for n in names)
        else:
            ops.update(set(names))
            occurrences.update(names)
        facts = task_structure(codes[-1])
        structure["parsed"] += facts["parsed"]
        structure["multi_input"] += (facts["forward_inputs"] or 0) > 1
        structure["tuple_output"] += facts["tuple_output"]
        structure["int_input"] += facts["int_input"]
        ranks.update(facts["input_ranks"])
    by_count = sorted(ops, key=lambda n: (-ops[n], n))
    return {
        "format": FORMAT,
        "name": name,
        "tasks": tasks,
        "data_source": {s: _share(sources[s], tasks) for s in sorted(sources)},
        "ops": {n: ops[n] for n in by_count},
        "occurrences": {n: occurrences[n] for n in by_count},
        "categories": {c: _share(categories[c], tasks) for c in (*CATEGORIES, OTHER)},
        "structure": {
            "parsed": _share(structure["parsed"], tasks),
            "multi_input": _share(structure["multi_input"], tasks),
            "tuple_output": _share(structure["tuple_output"], tasks),
            "int_input": _share(structure["int_input"], tasks),
            "ranks": {str(r): _share(ranks[r], tasks) for r in sorted(ranks)},
        },
        "sequences": len(sequences),
        "transformers_classes": sorted(families),
        "arguments": argument_profile(codes),
    }


@dataclass(frozen=True)
class Profile:
    """A loaded profile (see ``build_profile`` for what each field counts)."""

    name: str
    tasks: int
    data_source: dict[str, float]
    ops: dict[str, int]
    occurrences: dict[str, int]
    categories: dict[str, float]
    structure: dict[str, Any]
    sequences: int
    transformers_classes: tuple[str, ...] = field(default_factory=tuple)
    # per operator, the optional keywords its calls pass (``opsynth.call_arguments``); a
    # profile written before they were counted has none
    arguments: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Any, where: str = "profile") -> Profile:
        """A profile from its JSON form; a malformed one is a one-line ``ValueError``."""
        if not isinstance(data, dict):
            raise ValueError(f"{where}: not a profile (expected a JSON object)")
        if data.get("format", FORMAT) != FORMAT:
            raise ValueError(f"{where}: profile format {data.get('format')!r}, expected {FORMAT}")
        missing = [k for k in REQUIRED_KEYS if k not in data]
        if missing:
            raise ValueError(f"{where}: not a profile, missing {', '.join(missing)}")
        try:
            arguments = checked_arguments(data.get("arguments", {}))
        except ValueError as exc:
            raise ValueError(f"{where}: malformed profile, {exc}") from None
        try:
            return cls(
                name=str(data["name"]),
                tasks=int(data["tasks"]),
                data_source={str(k): float(v) for k, v in data["data_source"].items()},
                ops={str(k): int(v) for k, v in data["ops"].items()},
                occurrences={str(k): int(v) for k, v in data["occurrences"].items()},
                categories={str(k): float(v) for k, v in data["categories"].items()},
                structure=dict(data["structure"]),
                sequences=int(data["sequences"]),
                transformers_classes=tuple(str(c) for c in data["transformers_classes"]),
                arguments=arguments,
            )
        except (AttributeError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: malformed profile ({type(exc).__name__})") from exc

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]], name: str = "profile") -> Profile:
        return cls.from_dict(build_profile(rows, name), name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "name": self.name,
            "tasks": self.tasks,
            "data_source": self.data_source,
            "ops": self.ops,
            "occurrences": self.occurrences,
            "categories": self.categories,
            "structure": self.structure,
            "sequences": self.sequences,
            "transformers_classes": list(self.transformers_classes),
            "arguments": self.arguments,
        }


def load_profile(spec: str) -> Profile | None:
    """``uniform``: no profile (None); a shipped name (``ops6k``); else a profile JSON path.
    A bad name, path or file is a one-line ``ValueError``."""
    if spec == UNIFORM:
        return None
    path = SHIPPED.get(spec, Path(spec))
    if not path.is_file():
        names = ", ".join([UNIFORM, *SHIPPED])
        raise ValueError(f"profile {spec!r}: no such file; use one of {names} or a JSON path")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"profile {spec!r}: not readable JSON ({type(exc).__name__})") from exc
    profile = Profile.from_dict(data, f"profile {spec!r}")
    if profile.tasks < 1:
        raise ValueError(f"profile {spec!r}: a profile of no tasks")
    return profile


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """``ops``, ``data_source`` and ``code`` of every row of a task parquet file."""
    import pyarrow.parquet as pq

    path = Path(path)
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several kinds for a file that is no parquet
        raise ValueError(f"{path}: not a readable parquet file ({type(exc).__name__})") from exc
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(f"{path} lacks column(s) {', '.join(missing)}")
    return table.select(list(REQUIRED_COLUMNS)).to_pylist()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m opsynth.profile", description="Build a reference profile."
    )
    parser.add_argument("--input", required=True, help="task parquet (ops, data_source, code)")
    parser.add_argument("--out", required=True, help="profile JSON to write")
    parser.add_argument("--name", help="profile name (default: the output file's stem)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    try:
        profile = build_profile(read_rows(args.input), args.name or out.stem)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(profile, indent=1) + "\n")
    print(
        f"{out}: {profile['tasks']} tasks, {len(profile['ops'])} operators, "
        f"{profile['sequences']} sequences"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
