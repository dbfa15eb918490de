"""Softmax-family calls written with their ``dim`` (``compose.explicit_dim``).

``F.softmax``, ``F.log_softmax``, ``F.softmin`` and their modules default to ``dim=None``,
which picks a dimension from the input's rank (0 for ranks 0, 1 and 3, else 1) with a
deprecation warning: a 3-d task then normalises across its batch. The catalogue validates
such a seed in its cheapest form, without the optional ``dim``; Ops-6K writes the dim
(its share of explicit calls: benchmarks/RESULTS.md), so the composer tries the argument sets
that name it first.
"""

from __future__ import annotations

from opsynth.synth.catalog.spec import CatalogSpec

# operators whose omitted dim is torch's implicit, rank-dependent choice
IMPLICIT_DIM = frozenset(
    {"F.softmax", "F.log_softmax", "F.softmin", "nn.Softmax", "nn.LogSoftmax", "nn.Softmin"}
)
DIM = "dim"


def implicit_dim(spec: CatalogSpec) -> bool:
    """Whether ``spec``'s operator leaves its dim to torch when the call omits it."""
    return spec.name in IMPLICIT_DIM


def names_dim(spec: CatalogSpec) -> bool:
    """Whether the call (or the module's constructor) passes a ``dim``."""
    constructor = [name for name, _ in (*spec.init, *spec.init_kwargs)]
    return DIM in constructor or any(a.name == DIM and not a.tensor for a in spec.args)
