"""The operator dataflow graph of a task's ``Model.forward``, read from the AST alone.

Tracing (``torch.fx``) would give a more faithful graph, but it executes the task's code, and
candidates are untrusted; the orchestrator must never run them. So the graph is built
statically: every operator application in ``forward`` (a call, an arithmetic operator, an
indexing) becomes a node labelled with the operator's canonical name, and an edge runs from
the node that produced a value to every node that consumes it. Variables are followed through
assignments; ``self.<name>`` calls are labelled with the module class assigned in
``__init__`` (``self.conv = nn.Conv2d(...)`` -> ``conv2d``). Spellings of one operator share
a label (``nn.ReLU()``, ``F.relu``, ``torch.relu``, ``x.relu()`` -> ``relu``; ``x + y`` and
``torch.add`` -> ``add``). Shapes, hyperparameters and constants are left out on purpose:
the graph is the task's structure, so two tasks with the same graph differ only in sizes.

Control flow is flattened (each block once, in order). That is an approximation, but a
deterministic one, which is what a duplicate key needs.
"""

from __future__ import annotations

import ast
import warnings

import networkx as nx

_ALIASES = {
    "multiply": "mul",
    "mult": "mul",
    "divide": "div",
    "true_divide": "div",
    "truediv": "div",
    "subtract": "sub",
    "matmult": "matmul",
    "usub": "neg",
    "negative": "neg",
    "uadd": "pos",
}
_PARAMETER_FACTORIES = {"parameter", "register_buffer", "buffer", "parameterlist", "parameterdict"}
_CONTAINERS = {"sequential", "modulelist", "moduledict"}


def _canonical(name: str) -> str:
    low = name.lower()
    low = low[:-1] if low.endswith("_") and not low.endswith("__") else low  # in-place forms
    return _ALIASES.get(low, low)


def _callee_name(func: ast.expr) -> str | None:
    """The last name of a callee: ``torch.nn.functional.relu`` -> ``relu``."""
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _held(arg: ast.expr) -> list[tuple[object, ast.expr]]:
    """(key, value) of what a container's argument lists: a list's or tuple's items by
    position, a dict literal's values by their constant keys (None for another key)."""
    if isinstance(arg, ast.List | ast.Tuple):
        return list(enumerate(arg.elts))
    if isinstance(arg, ast.Dict):
        return [
            (k.value if isinstance(k, ast.Constant) else None, v)
            for k, v in zip(arg.keys, arg.values, strict=True)
        ]
    return [(None, arg)]


def _constructor_label(call: ast.Call) -> str | None:
    """``nn.Conv2d(...)`` -> ``conv2d``; containers list what they hold, so
    ``nn.Sequential(nn.Conv2d(...), nn.ReLU())`` -> ``sequential[conv2d,relu]``; parameter
    holders (``nn.ParameterList``, ``nn.ParameterDict``) are ``parameter``."""
    name = _callee_name(call.func)
    if not name:
        return None
    label = _canonical(name)
    if label in _PARAMETER_FACTORIES:
        return "parameter"
    if label in _CONTAINERS:
        inner = [
            _constructor_label(a) or "?"
            for arg in call.args
            for _, a in _held(arg)
            if isinstance(a, ast.Call)
        ]
        return f"{label}[{','.join(inner)}]"
    return label


def _entries(attr: str, call: ast.Call) -> dict[str, str]:
    """``{"layers['conv']": "conv2d"}`` for the modules a ``nn.ModuleDict`` literal holds by
    constant key, so ``self.layers["conv"](x)`` is labelled with the module it calls."""
    if _canonical(_callee_name(call.func) or "") != "moduledict":
        return {}
    return {
        f"{attr}[{key!r}]": label
        for arg in call.args
        for key, value in _held(arg)
        if key is not None and isinstance(value, ast.Call)
        for label in [_constructor_label(value)]
        if label
    }


def _constant_key(node: ast.expr) -> object:
    return node.value if isinstance(node, ast.Constant) else None


def _self_name(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    params = fn.args.posonlyargs + fn.args.args
    return params[0].arg if params else None


def _module_attributes(model: ast.ClassDef) -> dict[str, str]:
    """``{attribute: label}`` for what the class's methods store on ``self``: submodules and
    functions by their constructor's name, parameters and buffers as ``parameter``."""
    attrs: dict[str, str] = {}
    for item in model.body:
        if not isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) or item.name == "forward":
            continue
        me = _self_name(item)
        for node in ast.walk(item):
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if (
                        isinstance(target, ast.Attribute)
                        and isinstance(target.value, ast.Name)
                        and target.value.id == me
                        and isinstance(node.value, ast.Call)
                    ):
                        label = _constructor_label(node.value)
                        if label:
                            attrs[target.attr] = label
                            attrs.update(_entries(target.attr, node.value))
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("register_buffer", "register_parameter")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                attrs[node.args[0].value] = "parameter"
    return attrs


class _Builder:
    def __init__(self, model: ast.ClassDef, forward: ast.FunctionDef | ast.AsyncFunctionDef):
        self.graph = nx.DiGraph()
        self.modules = _module_attributes(model)
        self.me = _self_name(forward)
        self.env: dict[str, list[int]] = {}
        self.params: dict[str, int] = {}
        params = forward.args.posonlyargs + forward.args.args + forward.args.kwonlyargs
        for extra in (forward.args.vararg, forward.args.kwarg):
            if extra is not None:
                params.append(extra)
        for arg in params[1:] if self.me is not None else params:
            self.env[arg.arg] = [self.node("input", [])]

    def node(self, label: str, inputs: list[int]) -> int:
        nid = self.graph.number_of_nodes()
        self.graph.add_node(nid, label=label)
        for src in dict.fromkeys(inputs):
            self.graph.add_edge(src, nid)
        return nid

    # -- expressions ------------------------------------------------------------------------

    def expr(self, node: ast.AST | None) -> list[int]:
        if node is None:
            return []
        if isinstance(node, ast.Name):
            return list(self.env.get(node.id, []))
        if isinstance(node, ast.Constant):
            return []
        if isinstance(node, ast.Attribute):
            if self._is_self(node.value):
                if self.modules.get(node.attr) == "parameter":
                    return [self._parameter(node.attr)]
                return []
            return self.expr(node.value)  # x.shape, x.T: metadata or views of x
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Attribute)
            and self._is_self(node.value.value)
            and self.modules.get(node.value.attr) == "parameter"
        ):  # self.params[0], self.params["weight"]: one parameter of a holder
            return [self._parameter(f"{node.value.attr}[{ast.unparse(node.slice)}]")]
        if isinstance(node, ast.Call):
            return [self.call(node)]
        if isinstance(node, ast.BinOp):
            return self._op(type(node.op).__name__, [node.left, node.right])
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.Not):
                return self.expr(node.operand)
            return self._op(type(node.op).__name__, [node.operand])
        if isinstance(node, ast.Compare):
            return self._op(type(node.ops[0]).__name__, [node.left, *node.comparators])
        if isinstance(node, ast.Subscript):
            return self._op("getitem", [node.value, node.slice])
        inputs: list[int] = []
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                inputs += self.expr(child)
        return inputs

    def _parameter(self, name: str) -> int:
        if name not in self.params:
            self.params[name] = self.node("parameter", [])
        return self.params[name]

    def _op(self, name: str, operands: list[ast.AST]) -> list[int]:
        inputs = [src for operand in operands for src in self.expr(operand)]
        if not inputs:
            return []  # arithmetic on constants or sizes, not on tensors
        return [self.node(_canonical(name), inputs)]

    def _is_self(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and node.id == self.me

    def call(self, node: ast.Call) -> int:
        func = node.func
        inputs: list[int] = []
        if isinstance(func, ast.Attribute) and self._is_self(func.value):
            label = self.modules.get(func.attr, _canonical(func.attr))
        elif (
            isinstance(func, ast.Subscript)
            and isinstance(func.value, ast.Attribute)
            and self._is_self(func.value.value)
            and f"{func.value.attr}[{_constant_key(func.slice)!r}]" in self.modules
        ):  # self.layers["conv"](x): the module the dict holds under that key
            label = self.modules[f"{func.value.attr}[{_constant_key(func.slice)!r}]"]
        elif isinstance(func, ast.Attribute):
            label = _canonical(func.attr)
            receiver = func.value
            # torch.relu(x) / F.relu(x): the receiver is a namespace, not data
            inputs += self.expr(receiver)
        elif isinstance(func, ast.Name):
            label = _canonical(func.id)
        else:
            label = "call"
            inputs += self.expr(func)
        for arg in node.args:
            inputs += self.expr(arg)
        for kw in node.keywords:
            inputs += self.expr(kw.value)
        nid = self.node(label, inputs)
        if (
            isinstance(func, ast.Attribute)
            and func.attr.endswith("_")
            and not func.attr.endswith("__")
            and isinstance(func.value, ast.Name)
        ):
            self.env[func.value.id] = [nid]  # x.relu_() updates x in place
        return nid

    # -- statements -------------------------------------------------------------------------

    def bind(self, target: ast.AST, sources: list[int]) -> None:
        if isinstance(target, ast.Name):
            self.env[target.id] = sources
        elif isinstance(target, ast.Tuple | ast.List):
            for element in target.elts:
                self.bind(element, sources)
        elif isinstance(target, ast.Starred):
            self.bind(target.value, sources)
        elif isinstance(target, ast.Subscript | ast.Attribute):
            base = target.value
            while isinstance(base, ast.Subscript | ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in self.env:
                updated = self.node("setitem", self.env[base.id] + sources)
                self.env[base.id] = [updated]

    def block(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            self.stmt(stmt)

    def stmt(self, stmt: ast.stmt) -> None:
        if isinstance(stmt, ast.Assign):
            sources = self.expr(stmt.value)
            for target in stmt.targets:
                self.bind(target, sources)
        elif isinstance(stmt, ast.AnnAssign):
            if stmt.value is not None:
                self.bind(stmt.target, self.expr(stmt.value))
        elif isinstance(stmt, ast.AugAssign):
            current = self.expr(stmt.target)
            sources = current + self.expr(stmt.value)
            if sources:
                self.bind(stmt.target, [self.node(_canonical(type(stmt.op).__name__), sources)])
        elif isinstance(stmt, ast.Return):
            self.node("output", self.expr(stmt.value))
        elif isinstance(stmt, ast.Expr):
            self.expr(stmt.value)
        elif isinstance(stmt, ast.If | ast.While):
            self.expr(stmt.test)
            self.block(stmt.body)
            self.block(stmt.orelse)
        elif isinstance(stmt, ast.For | ast.AsyncFor):
            self.bind(stmt.target, self.expr(stmt.iter))
            self.block(stmt.body)
            self.block(stmt.orelse)
        elif isinstance(stmt, ast.With | ast.AsyncWith):
            for item in stmt.items:
                sources = self.expr(item.context_expr)
                if item.optional_vars is not None:
                    self.bind(item.optional_vars, sources)
            self.block(stmt.body)
        elif isinstance(stmt, ast.Try):
            self.block(stmt.body)
            for handler in stmt.handlers:
                self.block(handler.body)
            self.block(stmt.orelse)
            self.block(stmt.finalbody)


def find_forward(model: ast.ClassDef) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    found = None
    for item in model.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name == "forward":
            found = item
    return found


def forward_graph(model: ast.ClassDef) -> nx.DiGraph | None:
    """The dataflow graph of ``model.forward`` (None when the class has no ``forward``)."""
    forward = find_forward(model)
    if forward is None:
        return None
    builder = _Builder(model, forward)
    builder.block(forward.body)
    return builder.graph


_HASHES: dict[tuple, str] = {}


def structural_hash(graph: nx.DiGraph, iterations: int = 3) -> str:
    """Weisfeiler-Lehman hash of a dataflow graph (networkx), memoised on the graph's exact
    construction so that repeated graphs are hashed once."""
    key = (
        iterations,
        tuple(label for _, label in graph.nodes(data="label")),
        tuple(graph.edges()),
    )
    cached = _HASHES.get(key)
    if cached is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # networkx notes its directed-hash change in 3.5
            cached = nx.weisfeiler_lehman_graph_hash(
                graph, node_attr="label", iterations=iterations, digest_size=8
            )
        if len(_HASHES) > 200_000:
            _HASHES.clear()
        _HASHES[key] = cached
    return cached
