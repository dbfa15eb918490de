"""Operator names as Ops-6K spells them (``torch.topk``, ``nn.LSTM``, ``F.pad``), read from a
task's code through its imports. Pure ``ast``; shared by the profile's structure reading and
its argument statistics."""

from __future__ import annotations

import ast
from collections.abc import Mapping

DEFAULT_ALIASES = {"torch": "torch", "nn": "torch.nn", "F": "torch.nn.functional"}


def aliases_of(tree: ast.Module) -> dict[str, str]:
    """Local name -> dotted torch path, from the code's imports."""
    found = dict(DEFAULT_ALIASES)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    found[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    found[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                found[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return found


def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` as written (no alias resolved); None when it is no plain chain."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def canonical(node: ast.AST, aliases: Mapping[str, str]) -> str | None:
    """A call target as Ops-6K spells it (``torch.topk``, ``nn.LSTM``, ``F.pad``), through the
    code's imports; None when it is no plain dotted name."""
    name = dotted(node)
    if name is None:
        return None
    head, _, rest = name.partition(".")
    full = aliases.get(head, head) + (f".{rest}" if rest else "")
    for long, short in (("torch.nn.functional.", "F."), ("torch.nn.", "nn.")):
        if full.startswith(long):
            return short + full[len(long) :]
    return full
