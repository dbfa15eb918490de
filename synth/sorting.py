"""Sorts whose order is defined where values tie (``compose.stable_sort``).

An unstable sort may put tied values in any order, and eager and ``torch.compile`` put them
in different ones: at the filters' sizes a row holds tied values (a softmax's, a relu's
zeros, rounded or integer data), so the indices ``torch.argsort`` and ``torch.sort`` return
differ, and the task is ``compile_mismatch`` whatever its kernel would do. With
``stable=True`` the order of ties is the input's, the same for every correct implementation.
The flag is keyword-only where the call also takes ``dim``, so the literals a call passes
become keywords too; a call with a literal this module cannot name is left as it is.
"""

from __future__ import annotations

from dataclasses import replace

from opsynth.synth.catalog.spec import CatalogSpec, InputSpec

# (kind, target) of the calls that sort: torch's functions and the tensor methods
SORTS = {
    ("function", "torch.sort"),
    ("function", "torch.argsort"),
    ("method", "sort"),
    ("method", "argsort"),
}
# The literals a sort takes besides ``stable``, by name: written as keywords beside it.
NAMED = ("dim", "descending")
STABLE = "stable"


def stable_sort(spec: CatalogSpec) -> CatalogSpec:
    """``spec`` calling its sort with ``stable=True`` (and its other literals as keywords);
    any other spec, or a sort passing a literal not in ``NAMED``, unchanged."""
    if (spec.kind, spec.target) not in SORTS:
        return spec
    literals = [a for a in spec.args if not a.tensor and a.name != STABLE]
    if any(a.name not in NAMED for a in literals):
        return spec
    args = tuple(a if a.tensor else replace(a, keyword=True) for a in spec.args if a.name != STABLE)
    return replace(spec, args=(*args, InputSpec(STABLE, tensor=False, value=True, keyword=True)))
