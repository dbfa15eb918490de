"""The einops seed library: its torch layers and functions, one spec per pattern.

einops (pure Python, no dependencies, works with any torch) proves the plugin API on a real
third-party library: it is discovered through the same entry point as torch and transformers,
and its operators (``einops.rearrange``, ``einops.layers.torch.Reduce``...) are described by
patterns, which introspection cannot guess, so this adapter states one pattern per operator
and input rank and lets validation run them like any other seed.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator

from opsynth.synth.catalog.spec import CatalogSpec, Code, InputSpec

LIBRARY = "einops"
SHAPE = (4, 8, 16, 16)
# Per function / layer: positional arguments after the input tensor.
FUNCTION_ARGS = {
    "rearrange": ["b c h w -> b (h w) c"],
    "reduce": ["b c h w -> b c", "mean"],
    "repeat": ["b c h w -> b c h w r", Code("2")],
}
LAYER_INIT = {
    "Rearrange": [("pattern", "b c h w -> b h w c")],
    "Reduce": [("pattern", "b c (h h2) (w w2) -> b c h w"), ("reduction", "max")],
    "EinMix": [("pattern", "b c h w -> b d h w"), ("weight_shape", "c d")],
}
LAYER_KWARGS = {"Reduce": [("h2", 2), ("w2", 2)], "EinMix": [("c", 8), ("d", 16)]}


class EinopsCatalog:
    """The einops adapter of the seed-library plugin API."""

    name = LIBRARY

    def specs(self) -> Iterator[CatalogSpec]:
        import einops
        import einops.layers.torch as layers

        x = InputSpec("x", SHAPE)
        for fname in sorted(n for n in dir(einops) if not n.startswith("_")):
            fn = getattr(einops, fname)
            if not inspect.isfunction(fn):
                continue
            args = FUNCTION_ARGS.get(fname)
            if args is None:
                yield CatalogSpec(
                    LIBRARY,
                    f"einops.{fname}",
                    "function",
                    f"einops.{fname}",
                    reason="no_signature",
                    detail="no pattern known for it",
                )
                continue
            literal = [InputSpec(f"arg{i}", tensor=False, value=v) for i, v in enumerate(args)]
            if fname == "repeat":
                literal = [literal[0], InputSpec("r", tensor=False, value=2, keyword=True)]
            yield CatalogSpec(
                LIBRARY, f"einops.{fname}", "function", f"einops.{fname}", args=(x, *literal)
            )
        for cname in sorted(n for n in dir(layers) if not n.startswith("_")):
            cls = getattr(layers, cname)
            if not inspect.isclass(cls) or cname not in LAYER_INIT:
                continue
            yield CatalogSpec(
                LIBRARY,
                f"einops.{cname}",
                "module",
                f"einops.layers.torch.{cname}",
                init=tuple(LAYER_INIT[cname]),
                init_kwargs=tuple(LAYER_KWARGS.get(cname, ())),
                args=(x,),
            )
