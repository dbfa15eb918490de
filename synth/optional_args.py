"""Optional keyword arguments drawn as the profile's set passes them
(``compose.optional_arguments``).

The catalogue validates each operator with its required arguments, so without this every
transposed convolution is composed at stride 1 without padding, every mean drops its dim and
no LSTM is batch-first, where Ops-6K passes those arguments in most calls. The profile counts
which optional keywords each operator's calls pass, how often and with which values
(``opsynth.call_arguments``); a link draws each keyword its spec does not pass yet at that
share, with a value drawn by its count. A drawn set that torch refuses is one failed
variation: the solver goes on to the next, and last to the catalogue's own arguments.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from opsynth.synth.catalog.spec import CatalogSpec

# keywords the solver sets by rules of its own: a loss unreduced, dropout at p=0
SOLVER_OWNED = frozenset({"reduction", "p"})


def passed_names(spec: CatalogSpec) -> set[str]:
    """The argument names ``spec`` passes already (constructor and call)."""
    names = {k for k, _ in (*spec.init, *spec.init_kwargs)}
    return names | {a.name for a in spec.args}


def draw_optional(
    spec: CatalogSpec, table: Mapping[str, Any], rng: random.Random
) -> tuple[tuple[str, Any], ...]:
    """(keyword, value) pairs to add to ``spec``'s call, drawn from its operator's entry in
    ``table`` (a profile's ``arguments``); () for an operator the table does not hold. A
    keyword without a known value is never drawn; a list value is passed as a tuple."""
    entry = table.get(spec.name)
    if not entry:
        return ()
    passed = passed_names(spec)
    drawn = []
    for keyword, stats in entry["keywords"].items():  # written in the set's order
        values = stats.get("values") or []
        if keyword in passed or keyword in SOLVER_OWNED or not values:
            continue
        if rng.random() >= stats["share"]:
            continue
        [value] = rng.choices([v for v, _ in values], weights=[c for _, c in values])
        drawn.append((keyword, _as_argument(value)))
    return tuple(drawn)


def _as_argument(value: Any) -> Any:
    return tuple(_as_argument(v) for v in value) if isinstance(value, list) else value
