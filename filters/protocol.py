"""What a verdict row from a sandboxed process may look like, checked field by field.

Everything a candidate's process reports is untrusted: its child writes the rows the worker
relays, and the worker itself runs in the same sandbox. Both the worker (on its child's
rows) and the pool (on the worker's lines) check a row here before using it; a row that
fails is the candidate's ``protocol_violation``, never an exception in the orchestrator.

Standard library only: the sandboxed worker imports this module.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from opsynth.filters import harness as harnesses
from opsynth.filters import reasons

MAX_MEASURES = 64
MAX_KEY_CHARS = 64
MAX_TEXT_CHARS = 4000
MAX_DETAIL_CHARS = 20000
MAX_DEPTH = 6  # nesting of lists/objects inside one measure
# Values in all measures of one row together. Generous: a task returning a tuple of a thousand
# tensors reports a shape per output; the line-length cap bounds a row's size anyway.
MAX_ITEMS = 250_000
INT64 = 1 << 63


# A JSON escape of a UTF-16 surrogate: decoded alone it is a string no UTF-8 store can write.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def decode_line(line: bytes) -> Any:
    """One JSON line from a sandboxed process, its strings made writable: a lone surrogate
    (``"\\ud800"``, which an exception's message can carry) becomes its escape text instead
    of a string that fails the parquet writer long after the line was accepted. Raises
    ``ValueError`` for a line that is not JSON."""
    value = json.loads(line)
    return _writable(value) if _SURROGATE_ESCAPE.search(line) else value


def _writable(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, list):
        return [_writable(item) for item in value]
    if isinstance(value, dict):
        return {_writable(key): _writable(item) for key, item in value.items()}
    return value


def row_problem(
    row: Any, expected_stage: str | None, harness: harnesses.Harness = harnesses.FILTERS
) -> str:
    """Why ``row`` is not a well-formed verdict of ``harness`` for ``expected_stage``; ""
    when it is."""
    if not isinstance(row, dict):
        return f"a verdict must be an object, got {type(row).__name__}"
    if expected_stage is None:
        return "a verdict arrived after the last stage"
    if row.get("stage") != expected_stage:
        return f"verdict for stage {_show(row.get('stage'))}, expected {expected_stage!r}"
    passed = row.get("passed")
    if not isinstance(passed, bool):
        return f"'passed' must be true or false, got {_show(passed)}"
    reason = row.get("reason")
    if not isinstance(reason, str) or not harness.known(reason):
        return f"unknown reason code {_show(reason)}"
    if (reason == reasons.OK) != passed:
        return f"reason {reason!r} contradicts passed={passed}"
    detail = row.get("detail", "")
    if not isinstance(detail, str) or len(detail) > MAX_DETAIL_CHARS:
        return "'detail' must be a string of at most 20000 characters"
    elapsed = row.get("elapsed_s", 0.0)
    if not _finite_number(elapsed) or elapsed < 0:
        return f"'elapsed_s' must be a finite non-negative number, got {_show(elapsed)}"
    return measures_problem(row.get("measures", {}))


def measures_problem(measures: Any) -> str:
    """Why ``measures`` is not a small JSON map of names to plain values (numbers finite,
    nesting shallow, size bounded); "" when it is."""
    if not isinstance(measures, dict):
        return f"'measures' must be an object, got {type(measures).__name__}"
    if len(measures) > MAX_MEASURES:
        return f"'measures' has {len(measures)} entries > {MAX_MEASURES}"
    budget = [MAX_ITEMS]
    for key, value in measures.items():
        if not isinstance(key, str) or len(key) > MAX_KEY_CHARS:
            return f"measure name {_show(key)} is not a short string"
        if not _plain_value(value, MAX_DEPTH, budget):
            return f"measure {key!r} has a value of unexpected form: {_show(value)}"
    return ""


def _plain_value(value: Any, depth: int, budget: list[int]) -> bool:
    budget[0] -= 1
    if budget[0] < 0:
        return False
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, (int, float)):
        return _finite_number(value)
    if isinstance(value, str):
        return len(value) <= MAX_TEXT_CHARS
    if depth <= 0:
        return False
    if isinstance(value, list):
        return all(_plain_value(item, depth - 1, budget) for item in value)
    if isinstance(value, dict):
        return all(
            isinstance(key, str)
            and len(key) <= MAX_KEY_CHARS
            and _plain_value(item, depth - 1, budget)
            for key, item in value.items()
        )
    return False


def _finite_number(value: Any) -> bool:
    """A float that is finite, or an integer a 64-bit column holds (a larger one is no
    measure: ``math.isfinite`` itself raises on it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, int):
        return -INT64 <= value < INT64
    return math.isfinite(value)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
