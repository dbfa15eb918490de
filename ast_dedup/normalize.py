"""A canonical serialisation of task code, for exact and near-duplicate detection.

Two tasks that differ only in comments, docstrings, formatting or the names they chose for
their own things are the same task. Serialising the AST (not the text) removes comments and
formatting; docstrings (string-literal statements) are skipped; and every name the code picks
itself is replaced by a canonical one in order of first use: variables, parameters, module
constants, helper functions and classes become ``n0, n1, ...``; attributes a method stores or
reads on its ``self`` become ``a0, a1, ...``. Names the code does not choose keep their
spelling: imported modules and names (``torch``, ``nn``, ``F``), builtins, attributes of
anything but ``self`` (``nn.Conv2d``, ``x.relu``), keyword names, dunder names and the
KernelBench API (``Model``, ``get_inputs``, ``get_init_inputs``, ``forward``), so different
operators stay different.

The renaming is global and positional: a consistent renaming yields the same key, a renaming
that merges or splits names does not. The token stream is unambiguous (fields come in a fixed
order per node type and lists carry their length), so equal streams mean equal normalised
programs.

Near-duplicate shingles are hashes of the serialisation of every statement and every call, and
of each pair of consecutive statements, so one edited line changes only a few shingles.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import zlib
from functools import cached_property

import numpy as np

_SKIP_FIELDS = frozenset({"ctx", "type_comment", "kind"})
_BODY_FIELDS = frozenset({"body", "orelse", "finalbody"})
_DEFS = frozenset({ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef})
_KEEP_NAMES = frozenset(dir(builtins)) | {"Model", "get_inputs", "get_init_inputs", "forward"}


class NormalForm:
    """``key``: digest of the whole normalised program; ``shingles``: sorted unique 32-bit
    hashes of its statement and call shingles, computed on first use (a caller that has
    seen ``key`` before does not need them)."""

    def __init__(self, tokens: list[str], spans: list, bigrams: list) -> None:
        self.key = hashlib.sha256("\x1f".join(tokens).encode()).hexdigest()[:16]
        self.n_tokens = len(tokens)
        self._parts = (tokens, spans, bigrams)

    @cached_property
    def shingles(self) -> np.ndarray:
        tokens, spans, bigrams = self._parts
        joined = {span: "\x1f".join(tokens[span[0] : span[1]]) for span in spans}
        hashes = [_hash32(text) for text in joined.values()]
        hashes.extend(_hash32(joined[a] + "\x1e" + joined[b]) for a, b in bigrams)
        self._parts = None
        return np.unique(np.asarray(hashes, dtype=np.uint32))


def _is_docstring(stmt: ast.AST) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def _imported_names(tree: ast.Module) -> set[str]:
    """Names bound by top-level imports (nested imports are added as the serialiser meets
    them, before their uses)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            names.update(_alias_names(node))
    return names


def _alias_names(node: ast.Import | ast.ImportFrom) -> list[str]:
    return [(alias.asname or alias.name).split(".")[0] for alias in node.names]


_RAW, _NAME, _ATTR, _CONST = range(4)
_PLANS: dict[type, tuple[str, tuple[tuple[str, int], ...], bool]] = {}


def _plan(cls: type) -> tuple[str, tuple[tuple[str, int], ...], bool]:
    """Per node type: its name, its serialised fields with how a scalar value in each is
    written, and whether the node starts a shingle (statements and calls)."""
    plan = _PLANS.get(cls)
    if plan is None:
        fields = []
        for field in cls._fields:
            if field in _SKIP_FIELDS:
                continue
            mode = _RAW
            if (
                (cls is ast.Name and field == "id")
                or (cls is ast.arg and field == "arg")
                or (cls in _DEFS and field == "name")
                or (cls in (ast.Global, ast.Nonlocal) and field == "names")
            ):
                mode = _NAME
            elif cls is ast.Attribute and field == "attr":
                mode = _ATTR
            elif cls is ast.Constant and field == "value":
                mode = _CONST
            fields.append((field, mode))
        plan = (cls.__name__, tuple(fields), issubclass(cls, ast.stmt) or cls is ast.Call)
        _PLANS[cls] = plan
    return plan


def _serialise(tree: ast.Module):
    """One pass over the AST: the token list, the (start, end) token span of every statement
    and call, and the pairs of spans of consecutive statements."""
    tokens: list[str] = []
    add = tokens.append
    spans: list[tuple[int, int]] = []
    bigrams: list[tuple[tuple[int, int], tuple[int, int]]] = []
    keep = set(_imported_names(tree)) | _KEEP_NAMES
    names: dict[str, str] = {}
    attrs: dict[str, str] = {}
    self_name: list[str | None] = [None]
    AST = ast.AST
    stmt = ast.stmt
    plans = _PLANS

    def name(ident: str) -> str:
        if ident in keep or ident.startswith("__"):
            return ident
        canon = names.get(ident)
        if canon is None:
            canon = names[ident] = f"n{len(names)}"
        return canon

    def scalar(node: ast.AST, mode: int, value: object) -> str:
        if mode == _NAME:
            return name(value)  # type: ignore[arg-type]
        if mode == _ATTR:
            me = self_name[-1]
            target = node.value  # type: ignore[attr-defined]
            if me is not None and type(target) is ast.Name and target.id == me:
                canon = attrs.get(value)  # type: ignore[arg-type]
                if canon is None:
                    canon = attrs[value] = f"a{len(attrs)}"  # type: ignore[index]
                return canon
            return value  # type: ignore[return-value]
        if mode == _CONST:
            return f"{type(value).__name__}:{value!r}"
        return str(value)

    def emit(node: ast.AST, method: bool) -> None:
        cls = type(node)
        label, fields, shingle = plans.get(cls) or _plan(cls)
        start = len(tokens)
        add(label)
        if not fields:
            return
        pushed = False
        if cls is ast.Import or cls is ast.ImportFrom:
            keep.update(_alias_names(node))
        elif method and (cls is ast.FunctionDef or cls is ast.AsyncFunctionDef):
            params = node.args.posonlyargs + node.args.args  # type: ignore[attr-defined]
            self_name.append(params[0].arg if params else None)
            pushed = True
        in_class = cls is ast.ClassDef
        for field, mode in fields:
            value = getattr(node, field, None)
            if value is None:
                add("~")
            elif isinstance(value, AST):
                emit(value, False)
            elif type(value) is list:
                if field in _BODY_FIELDS:
                    value = [s for s in value if not _is_docstring(s)]
                add(f"[{len(value)}")
                previous = None
                for item in value:
                    if isinstance(item, AST):
                        emit(item, in_class)
                        if isinstance(item, stmt):
                            span = spans[-1]
                            if previous is not None:
                                bigrams.append((previous, span))
                            previous = span
                    else:
                        add(scalar(node, mode, item))
            else:
                add(scalar(node, mode, value))
        if pushed:
            self_name.pop()
        if shingle:
            spans.append((start, len(tokens)))

    emit(tree, False)
    return tokens, spans, bigrams


def _hash32(text: str) -> int:
    return zlib.crc32(text.encode())


def normal_form(tree: ast.Module) -> NormalForm:
    """The normalised serialisation of a parsed module (see the module docstring)."""
    return NormalForm(*_serialise(tree))
