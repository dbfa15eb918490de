"""Re-derive a catalogue spec for another input shape, so a composer can chain it.

A seed is validated at one probe shape; in a chain its first tensor argument takes whatever
shape the running tensor has there. The torch library replays the derivation that found the
seed's arguments (``torch_library.rebind``), so sizes that follow the input (``in_features``,
``normalized_shape``, an index's range) follow it again. Any other library gets the generic
rebinding: the same call with only the first tensor argument's shape replaced, which fits
shape-polymorphic operators (an einops pattern over any sizes of its rank) and is refused by
the shape solver where it does not.
"""

from __future__ import annotations

from dataclasses import replace

from opsynth.synth.catalog.spec import CatalogSpec

Shape = tuple[int, ...]


def main_index(spec: CatalogSpec, dtype: str = "") -> int | None:
    """Where a chain feeds its running tensor: the first tensor argument of ``dtype`` (the
    values of ``torch.where(cond, x, y)``, not its mask), else the first tensor argument."""
    tensors = [i for i, a in enumerate(spec.args) if a.tensor]
    return next(
        (i for i in tensors if spec.args[i].dtype == dtype), tensors[0] if tensors else None
    )


def generic(spec: CatalogSpec, shape: Shape) -> list[CatalogSpec]:
    i = main_index(spec)
    if i is None:
        return []
    args = list(spec.args)
    args[i] = replace(args[i], shape=tuple(shape))
    return [replace(spec, args=tuple(args))]


def rebind(spec: CatalogSpec, shape: Shape, limit: int = 24) -> list[CatalogSpec]:
    """Candidate specs for ``shape``, in a fixed order (replaying index i at another batch
    size gives the same choice)."""
    if spec.library == "torch":
        from opsynth.synth.catalog.torch_library import rebind as torch_rebind

        try:
            found = torch_rebind(spec, shape, limit)
        except Exception:  # introspection of an exotic callable; the generic form remains
            found = []
        return found or generic(spec, shape)
    return generic(spec, shape)
