"""The optional keyword arguments a task set passes to each operator, for its profile.

A transposed convolution in Ops-6K nearly always passes ``stride``, ``padding`` and
``output_padding``; a mean often passes ``keepdim``; an LSTM ``batch_first``. The seed
catalogue validates each operator with its required arguments only, so a composer aiming at
the set needs to know which optional ones it passes, how often and with what values
(``compose.optional_arguments``). This reads them from the tasks' code with ``ast``, never
running it.

Rules of the read: a call's target is named as Ops-6K spells it (``nn.ConvTranspose2d``,
``torch.mean``, ``F.interpolate``) through the code's imports; only keyword arguments count
(a positional one does not name itself); a value is known when it is a literal (a number,
bool, string, None, or a tuple or list of them, negation included) or a name the module binds
to one at its top level (``stride = 2``, and ``stride=stride`` in the call: the name a task's
constructor parameter has is the module constant it is filled from); anything else counts the
keyword as passed with an unknown value. Keywords that only place or type the result
(``out``, ``device``, ``dtype``) or make an operator in-place are not kept.
"""

from __future__ import annotations

import ast
import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

from opsynth.call_names import aliases_of, canonical

# keywords a composed task must not pass: in-place updates, output placement and typing
NOT_KEPT = frozenset(
    {"inplace", "out", "device", "dtype", "layout", "generator", "requires_grad", "memory_format"}
)
TOP_VALUES = 6  # values kept per keyword, most frequent first
MIN_CALLS = 5  # operators called fewer times are left out of the profile
MIN_SHARE = 0.02  # keywords passed by fewer of an operator's calls are left out
SHARE_DIGITS = 4
_UNKNOWN = object()


def literal(node: ast.AST, env: dict[str, Any]) -> Any:
    """A keyword value as a JSON-ready Python value (tuples as lists), ``_UNKNOWN`` else."""
    if isinstance(node, ast.Constant) and (
        node.value is None or isinstance(node.value, (bool, int, float, str))
    ):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = literal(node.operand, env)
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return -value if is_number else _UNKNOWN
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [literal(elt, env) for elt in node.elts]
        return _UNKNOWN if any(i is _UNKNOWN for i in items) else items
    if isinstance(node, ast.Name):
        return env.get(node.id, _UNKNOWN)
    return _UNKNOWN


def module_constants(tree: ast.Module) -> dict[str, Any]:
    """Top-level ``name = <literal>`` bindings, in order (a later one replaces an earlier)."""
    env: dict[str, Any] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target = stmt.targets[0]
            if isinstance(target, ast.Name):
                value = literal(stmt.value, env)
                if value is _UNKNOWN:
                    env.pop(target.id, None)
                else:
                    env[target.id] = value
    return env


def count_arguments(codes: Iterable[str]) -> tuple[Counter[str], dict[str, dict[str, Counter]]]:
    """Calls per operator name, and per operator and keyword the values passed (``None``'s
    key is the JSON ``null``; an unknown value is counted under ``"?"``)."""
    calls: Counter[str] = Counter()
    passed: dict[str, dict[str, Counter]] = {}
    for code in codes:
        try:
            tree = ast.parse(code)
        except (SyntaxError, ValueError):
            continue
        aliases, env = aliases_of(tree), module_constants(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = canonical(node.func, aliases)
            if name is None or not name.startswith(("torch.", "nn.", "F.")):
                continue
            calls[name] += 1
            for keyword in node.keywords:
                if keyword.arg is None or keyword.arg in NOT_KEPT:
                    continue
                value = literal(keyword.value, env)
                key = "?" if value is _UNKNOWN else json.dumps(value)  # exact and hashable
                passed.setdefault(name, {}).setdefault(keyword.arg, Counter())[key] += 1
    return calls, passed


def argument_profile(codes: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Per operator (called at least ``MIN_CALLS`` times), per optional keyword its calls pass
    (at least ``MIN_SHARE`` of them, in the order the set first passes them): the share of
    calls passing it and its most frequent known values with their counts, as
    ``{"calls": n, "keywords": {kw: {"share": s, "values": [[value, count], ...]}}}``."""
    calls, passed = count_arguments(codes)
    profile: dict[str, dict[str, Any]] = {}
    for name in sorted(passed):
        total = calls[name]
        if total < MIN_CALLS:
            continue
        keywords = {}
        for keyword in passed[name]:  # in the order the set first passes them
            counts = passed[name][keyword]
            share = sum(counts.values()) / total
            if share < MIN_SHARE:
                continue
            known = sorted(
                ((k, c) for k, c in counts.items() if k != "?"), key=lambda kc: (-kc[1], kc[0])
            )
            keywords[keyword] = {
                "share": round(share, SHARE_DIGITS),
                "values": [[json.loads(k), c] for k, c in known[:TOP_VALUES]],
            }
        if keywords:
            profile[name] = {"calls": total, "keywords": keywords}
    return profile


def checked_arguments(value: Any) -> dict[str, dict[str, Any]]:
    """A profile's ``arguments`` as read from its JSON, checked to the shape
    ``argument_profile`` writes; a malformed one is a ``ValueError`` naming where."""
    if not isinstance(value, dict):
        raise ValueError("arguments: expected an object")
    for name, entry in value.items():
        keywords = entry.get("keywords") if isinstance(entry, dict) else None
        if not isinstance(keywords, dict) or not isinstance(entry.get("calls"), int):
            raise ValueError(f"arguments.{name}: expected {{'calls': n, 'keywords': {{...}}}}")
        for keyword, stats in keywords.items():
            share = stats.get("share") if isinstance(stats, dict) else None
            values = stats.get("values") if isinstance(stats, dict) else None
            pairs = isinstance(values, list) and all(
                isinstance(p, list) and len(p) == 2 and isinstance(p[1], int) for p in values
            )
            if not isinstance(share, (int, float)) or not 0 <= share <= 1 or not pairs:
                raise ValueError(
                    f"arguments.{name}.{keyword}: expected a share in [0, 1] and "
                    "[value, count] pairs"
                )
    return value
