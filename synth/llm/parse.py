"""Turn a model's reply into task code and its op list, or a reason it is not one.

Pure text and AST work: the reply is parsed, never executed or compiled to bytecode. What is
checked is what makes a reply an answer to *this* prompt (a code block that parses, the three
KernelBench symbols, the final op list equal to the sampled ops, every sampled op used);
whether the code is safe, runs, or is a good benchmark is for the static check and the
sandboxed filters downstream.
"""

from __future__ import annotations

import ast
import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from opsynth.source import REQUIRED_SYMBOLS, dotted_name, import_aliases

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_OPS_LINE = re.compile(
    r"^[ \t*_`#>-]*OPS[ \t*_`]*:[ \t*_`]*(\[.*?\])", re.MULTILINE | re.IGNORECASE
)
_ROOTS = {"nn": "torch.nn", "F": "torch.nn.functional"}
_MODULES = frozenset({"torch", *_ROOTS.values()})
# torch names a forward may use that are plumbing, not operators.
_NOT_OPS = frozenset(
    {
        "torch.nn.Module",
        "torch.nn.Parameter",
        "torch.nn.ModuleList",
        "torch.nn.ModuleDict",
        "torch.nn.Sequential",
        "torch.nn.Identity",
        "torch.Tensor",
        "torch.Size",
        "torch.no_grad",
    }
)


class Rejected(Exception):
    """A reply that is not a valid task for the sampled ops; ``reason`` is in ``REPLY``."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


@dataclass(frozen=True)
class Parsed:
    code: str
    ops: list[str]  # the reply's final op list, in its order
    extra_ops: list[str]  # torch operators the code adds beyond the sampled ones (adapters)


def extract_code(text: str) -> str:
    """The reply's Python: the fenced block that defines ``Model`` (else the longest fenced
    block), or the whole reply when it has no fence and reads as a module."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text)]
    code_blocks = [body for lang, body in blocks if lang in ("", "python", "py", "python3")]
    if code_blocks:
        with_model = [b for b in code_blocks if "class Model" in b]
        return max(with_model or code_blocks, key=len).strip() + "\n"
    if "class Model" in text:
        return _OPS_LINE.sub("", text).strip() + "\n"
    raise Rejected("no_code", "no ```python block and no class Model in the reply")


def extract_ops(text: str) -> list[str]:
    """The last ``OPS: [...]`` line of the reply, as a list of strings."""
    found = _OPS_LINE.findall(text)
    if not found:
        raise Rejected("no_op_list", "no line 'OPS: [...]' in the reply")
    try:
        ops = json.loads(found[-1])
    except json.JSONDecodeError as exc:
        raise Rejected("no_op_list", f"OPS line is not a JSON list: {exc}") from exc
    if not isinstance(ops, list) or not all(isinstance(op, str) for op in ops):
        raise Rejected("no_op_list", "OPS is not a list of operator names")
    return [op.strip() for op in ops]


def parse_reply(text: str, sampled: Sequence[str]) -> Parsed:
    """Validate a reply against the sampled ops; raises Rejected with the first problem."""
    if not text or not text.strip():
        raise Rejected("empty_reply")
    code = extract_code(text)
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise Rejected("syntax_error", f"{type(exc).__name__}: {exc}") from exc
    defined = _module_names(tree)
    missing = [name for name in REQUIRED_SYMBOLS if name not in defined]
    if missing:
        raise Rejected("missing_symbol", f"not defined at module level: {', '.join(missing)}")
    ops = extract_ops(text)
    if Counter(canonical(op) for op in ops) != Counter(canonical(op) for op in sampled):
        raise Rejected("op_list_mismatch", f"reply lists {ops}, sampled {list(sampled)}")
    used = used_names(tree)
    unused = [op for op in sampled if not _uses(op, used)]
    if unused:
        raise Rejected("op_unused", f"the code never uses {', '.join(unused)}")
    wanted = {canonical(op) for op in sampled}
    extra = sorted(name for name in used.dotted - wanted - _NOT_OPS if _is_op(name))
    return Parsed(code, ops, extra)


def canonical(op: str) -> str:
    """``nn.Conv2d`` -> ``torch.nn.Conv2d``, ``F.gelu`` -> ``torch.nn.functional.gelu``."""
    root, _, rest = op.partition(".")
    return f"{_ROOTS[root]}.{rest}" if root in _ROOTS and rest else op


@dataclass(frozen=True)
class Used:
    dotted: frozenset[str]  # torch names referenced, resolved through the code's imports
    methods: frozenset[str]  # names called as methods (``x.sum(...)``)


def used_names(tree: ast.Module) -> Used:
    aliases = {"torch": "torch", **import_aliases(tree)}
    dotted, methods = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            name = dotted_name(node, aliases)
            if name.startswith("torch."):
                dotted.add(name)
        elif isinstance(node, ast.Name) and aliases.get(node.id, "").startswith("torch."):
            dotted.add(aliases[node.id])
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            methods.add(node.func.attr)
    return Used(frozenset(dotted), frozenset(methods))


def _uses(op: str, used: Used) -> bool:
    """Modules must appear by name; a function counts as torch.x, F.x or the method ``.x()``."""
    full = canonical(op)
    if full in used.dotted:
        return True
    name = full.rsplit(".", 1)[-1]
    if name[:1].isupper():
        return False
    return bool({f"torch.{name}", f"torch.nn.functional.{name}"} & used.dotted) or (
        name in used.methods
    )


def _is_op(name: str) -> bool:
    """A callable torch operator (not a dtype, a submodule or the randn of get_inputs)."""
    leaf = name.rsplit(".", 1)[-1]
    if name in _MODULES:
        return False
    if name.startswith("torch.nn.functional."):
        return True
    if name.startswith("torch.nn."):
        return name.count(".") == 2 and leaf[:1].isupper()
    return name.count(".") == 1 and leaf[:1].islower() and leaf not in _TENSOR_FACTORIES


_TENSOR_FACTORIES = frozenset(
    {
        "randn",
        "rand",
        "randint",
        "zeros",
        "ones",
        "empty",
        "tensor",
        "arange",
        "full",
        "manual_seed",
    }
)


def _module_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(stmt.name)
        elif isinstance(stmt, ast.Assign):
            names.update(n.id for t in stmt.targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names
