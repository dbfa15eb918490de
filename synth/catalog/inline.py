"""Inline a class's source and everything it needs from its module into one task file.

This is how the released set's transformers tasks read: the layer's own code (renamed
``Model``) and the classes and functions of its modeling module it uses, so the operators are
visible to whoever writes the kernel. Names the module imports from elsewhere (``ACT2FN``,
``nn``) become imports; module-level values of the modeling module (``NORM2FN``, ``logger``)
are imported from it. Dependencies come before their users.
"""

from __future__ import annotations

import ast
import builtins
import functools
import inspect
import linecache
import sys
import textwrap
from types import ModuleType
from typing import Any

HEADER = ["import torch", "import torch.nn as nn", "import torch.nn.functional as F"]


def _free_names(tree: ast.AST) -> list[str]:
    bound = {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    seen: dict[str, None] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in bound:
            seen.setdefault(node.id, None)
    return list(seen)


def _import_line(name: str, value: Any, module: ModuleType) -> str:
    if inspect.ismodule(value):
        target = value.__name__
        return f"import {target}" if target == name else f"import {target} as {name}"
    home = (
        getattr(value, "__module__", None)
        if inspect.isclass(value) or inspect.isfunction(value)
        else None
    )
    if home and getattr(sys.modules.get(home), getattr(value, "__name__", ""), None) is value:
        alias = "" if value.__name__ == name else f" as {name}"
        return f"from {home} import {value.__name__}{alias}"
    return f"from {module.__name__} import {name}"


@functools.cache
def _top_level_sources(filename: str) -> dict[str, str]:
    """Source of each top-level class and function of a file, decorators included.

    ``inspect.getsource`` parses the whole module again for every class it is asked for; a
    modeling module is large and a task inlines several of its classes, so it is parsed once.
    """
    lines = linecache.getlines(filename)
    found: dict[str, str] = {}
    for node in ast.parse("".join(lines)).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            found[node.name] = "".join(lines[first - 1 : node.end_lineno])
    return found


def _source(obj: Any, name: str) -> str:
    """``obj``'s source, from the parsed module when it is defined at its top level."""
    filename = inspect.getsourcefile(obj)
    if filename and getattr(obj, "__qualname__", name) == name:
        source = _top_level_sources(filename).get(name)
        if source is not None:
            return textwrap.dedent(source)
    return textwrap.dedent(inspect.getsource(obj))


def inline_class(cls: type) -> str:
    """Self-contained source defining ``Model`` as ``cls`` (raises OSError/TypeError when a
    source is unavailable)."""
    module = sys.modules[cls.__module__]
    defined: dict[str, str] = {}
    imports: dict[str, None] = {}
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in defined or name in visiting:
            return
        visiting.add(name)
        obj = module.__dict__[name]
        source = _source(obj, name)
        for free in _free_names(ast.parse(source)):
            if free == name or hasattr(builtins, free) and free not in module.__dict__:
                continue
            if free not in module.__dict__:
                continue
            value = module.__dict__[free]
            local = (inspect.isclass(value) or inspect.isfunction(value)) and getattr(
                value, "__module__", None
            ) == module.__name__
            if local:
                visit(free)
            else:
                imports.setdefault(_import_line(free, value, module), None)
        defined[name] = source
        visiting.discard(name)

    visit(cls.__name__)
    target = defined.pop(cls.__name__)
    renamed = target.replace(f"class {cls.__name__}(", "class Model(", 1)
    body = [*defined.values(), renamed]
    if any(cls.__name__ in part for part in defined.values()) or cls.__name__ in renamed:
        body.append(f"{cls.__name__} = Model")
    lines = [*HEADER, *[i for i in imports if i not in HEADER]]
    return "\n".join(lines) + "\n\n\n" + "\n\n".join(b.rstrip() + "\n" for b in body)
