"""Parsing untrusted task code without executing it, and finding its ``Model`` class.

Every function here returns a reason code instead of raising, because a stage must judge
bad input (``unparseable``, ``no_model_class``) rather than crash on it.
"""

from __future__ import annotations

import ast
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

UNPARSEABLE = "unparseable"
NO_MODEL_CLASS = "no_model_class"


@dataclass(frozen=True)
class Parsed:
    """A parse outcome: ``tree`` and ``model`` are set when ``reason`` is ``"ok"``."""

    reason: str
    detail: str = ""
    tree: ast.Module | None = None
    model: ast.ClassDef | None = None

    @property
    def ok(self) -> bool:
        return self.reason == "ok"


def parse_module(code: str) -> tuple[ast.Module | None, str]:
    """``(tree, "")`` or ``(None, why)``. Any parser failure counts, not only SyntaxError:
    null bytes raise ValueError, absurd nesting raises RecursionError or MemoryError."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escape sequences in task code
            return ast.parse(code, mode="exec"), ""
    except (SyntaxError, ValueError, RecursionError, MemoryError, TypeError) as exc:
        return None, f"{type(exc).__name__}: {exc}"


def find_model_class(tree: ast.Module) -> ast.ClassDef | None:
    """The top-level ``class Model``; the last definition wins, as it does when Python runs
    the module."""
    found = None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            found = node
    return found


def parse_task_code(code: str) -> Parsed:
    if not isinstance(code, str):
        return Parsed(UNPARSEABLE, f"code is {type(code).__name__}, not str")
    tree, why = parse_module(code)
    if tree is None:
        return Parsed(UNPARSEABLE, why)
    model = find_model_class(tree)
    if model is None:
        return Parsed(NO_MODEL_CLASS, "no top-level `class Model`", tree=tree)
    return Parsed("ok", tree=tree, model=model)


@contextmanager
def recursion_headroom(limit: int = 20_000) -> Iterator[None]:
    """Room for the recursive tree walks (one or two frames per AST level) over any tree that
    ``ast.parse`` accepted. Parsing itself runs under the normal limit, which bounds the depth
    of every tree we see; since Python 3.11, calls between Python functions do not use the C
    stack, so the higher limit cannot overflow it."""
    old = sys.getrecursionlimit()
    if old < limit:
        sys.setrecursionlimit(limit)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)
