"""Reading a KernelBench-format module's source: the symbols it must define, and import-aware
names of what it refers to. Pure ``ast``; shared by the static pre-check and the LLM
composer's parser."""

from __future__ import annotations

import ast

REQUIRED_SYMBOLS = ("Model", "get_inputs", "get_init_inputs")


def import_aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> the dotted name it was imported as (``F`` -> ``torch.nn.functional``,
    ``import torch.nn`` binds ``torch``), over every import in the module."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module or ''}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                root = alias.name.split(".")[0]
                aliases[alias.asname or root] = alias.name if alias.asname else root
    return aliases


def dotted_name(node: ast.AST, aliases: dict[str, str]) -> str:
    """``a.b.c`` with the root resolved through import aliases; "" if not a plain chain."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    root = aliases.get(node.id)
    if root is None:
        return ""
    return ".".join([root, *reversed(parts)])
