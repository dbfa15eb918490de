"""Enumerate torch's operators and read their parameter lists.

Four sources, each by introspection: ``torch.nn`` classes (``nn.X``), ``torch.nn.functional``
callables (``F.x``), public ``torch`` callables (``torch.x``) and Python's arithmetic operators
on tensors (``+``, and the ``Tensor`` methods Ops-6K names bare: ``add``). Parameters come from
the aten schema where one exists (it carries exact types) and from ``inspect.signature`` and
annotations otherwise.
"""

from __future__ import annotations

import inspect
import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

# ``inspect`` parameters a derived call never sets: construction placement and plumbing.
SKIPPED_PARAMS = {"self", "device", "dtype", "factory_kwargs", "out", "generator", "layout"}


@dataclass(frozen=True)
class Param:
    """One parameter: name, normalised type (``Tensor``, ``Tensor[]``, ``int``, ``int[]``,
    ``float``, ``bool``, ``str``, ``ScalarType``, ``?``), and whether a call must pass it."""

    name: str
    type: str
    required: bool
    keyword_only: bool = False


@dataclass(frozen=True)
class Entry:
    """An operator found by introspection: Ops-6K name, kind, how code calls it, the object."""

    name: str
    kind: str
    target: str
    obj: Any


def nn_entries() -> list[Entry]:
    out = []
    for name in sorted(dir(torch.nn)):
        obj = getattr(torch.nn, name)
        if not name.startswith("_") and inspect.isclass(obj):
            out.append(Entry(f"nn.{name}", "module", f"nn.{name}", obj))
    return out


def _callable_entries(module: Any, prefix: str) -> list[Entry]:
    out = []
    for name in sorted(dir(module)):
        obj = getattr(module, name)
        if name.startswith("_") or inspect.isclass(obj) or inspect.ismodule(obj):
            continue
        if callable(obj) and not name.startswith("has_torch_function"):
            out.append(Entry(f"{prefix}.{name}", "function", f"{prefix}.{name}", obj))
    return out


def functional_entries() -> list[Entry]:
    return _callable_entries(F, "F")


def torch_entries() -> list[Entry]:
    return _callable_entries(torch, "torch")


# Python's binary operators and the Tensor methods of the same meaning, as Ops-6K names them.
OPERATOR_SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "matmul": "@"}
METHOD_NAMES = {"add": "add", "sub": "sub", "mul": "mul", "truediv": "div"}


def operator_entries() -> list[Entry]:
    out = []
    for fname, symbol in OPERATOR_SYMBOLS.items():
        fn = getattr(operator, fname)
        out.append(Entry(symbol, "operator", symbol, fn))
        method = METHOD_NAMES.get(fname)
        if method and hasattr(torch.Tensor, method):
            out.append(Entry(method, "method", method, getattr(torch.Tensor, method)))
    return out


def aten_params(name: str) -> list[list[Param]]:
    """Every non-``out`` overload of ``aten::name``, fewest required parameters first."""
    overloads = []
    for schema in torch._C._jit_get_schemas_for_operator(f"aten::{name}"):
        if schema.overload_name.endswith("out") or any(a.name == "out" for a in schema.arguments):
            continue
        params = [
            Param(a.name, _schema_type(str(a.type)), not a.has_default_value(), a.kwarg_only)
            for a in schema.arguments
        ]
        overloads.append(params)
    return sorted(overloads, key=lambda ps: sum(p.required for p in ps))


def _schema_type(text: str) -> str:
    text = text.replace("Optional[", "").rstrip("]")
    if text.startswith("List[Tensor") or text == "Tensor[]":
        return "Tensor[]"
    if text.startswith("List[int") or text.startswith("int["):
        return "int[]"
    if text.startswith("Tensor"):
        return "Tensor"
    if text in ("int", "float", "bool", "str"):
        return text
    if text in ("number", "Scalar"):
        return "float"
    return "?"


def signature_params(fn: Any) -> list[Param] | None:
    """Parameters of a Python callable from ``inspect``; None when it has no signature."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    params = []
    for p in sig.parameters.values():
        if p.name in SKIPPED_PARAMS or p.kind in (p.VAR_KEYWORD,):
            continue
        if p.kind == p.VAR_POSITIONAL:
            params.append(Param(p.name, "Tensor[]", False))
            continue
        required = p.default is inspect.Parameter.empty
        params.append(
            Param(p.name, _annotation_type(p.annotation), required, p.kind == p.KEYWORD_ONLY)
        )
    return params


def _annotation_type(annotation: Any) -> str:
    if annotation is inspect.Parameter.empty:
        return "?"
    text = annotation if isinstance(annotation, str) else repr(annotation)
    text = text.replace("typing.", "").replace("torch.", "")
    if any(k in text for k in ("List[Tensor", "list[Tensor", "Sequence[Tensor", "tuple[Tensor")):
        return "Tensor[]"
    if "Tensor" in text:
        return "Tensor"
    if "BroadcastingList" in text or "_size" in text or "List[int" in text or "list[int" in text:
        return "int[]"
    for kind in ("bool", "float", "int", "str"):
        if kind in text:
            return kind
    return "?"


def entry_params(entry: Entry) -> list[list[Param]]:
    """Candidate parameter lists of a function entry (aten overloads, else its signature)."""
    obj = entry.obj
    params = signature_params(obj) if inspect.isfunction(obj) else None
    if params and any(p.name != "args" for p in params):
        return [params]  # a Python function with a real signature; else its aten op's
    found = aten_params(getattr(obj, "__name__", entry.target.rpartition(".")[2]))
    if found:
        return found
    params = signature_params(obj)
    return [params] if params is not None else []
