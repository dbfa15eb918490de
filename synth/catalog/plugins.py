"""Seed libraries as plugins: adapters found by entry point or named in the config.

An adapter is any object with a ``name`` and ``specs()`` yielding ``CatalogSpec``s. It is
registered as ``name = "module:attr"`` under the entry-point group ``opsynth.seed_libraries``
(how torch, transformers and einops ship, see pyproject.toml) or in ``seeds.plugins`` of the
config; ``attr`` is a class or factory called with no arguments, or with ``config`` (the
``SeedsConfig``) when it takes that parameter. The built-in references are also known without
package metadata, so a plain checkout works before ``pip install -e .``.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterable
from importlib.metadata import entry_points
from typing import Any, Protocol

from opsynth.config import SeedsConfig
from opsynth.synth.catalog.spec import CatalogSpec

GROUP = "opsynth.seed_libraries"
BUILTIN: dict[str, str] = {
    "torch": "opsynth.synth.catalog.torch_library:TorchCatalog",
    "transformers": "opsynth.synth.catalog.transformers_library:TransformersCatalog",
    "einops": "opsynth.synth.catalog.einops_library:EinopsCatalog",
}


class SeedLibraryAdapter(Protocol):
    name: str

    def specs(self) -> Iterable[CatalogSpec]: ...


def known_libraries(cfg: SeedsConfig) -> dict[str, tuple[str, str]]:
    """name -> (``module:attr``, origin): built-in, entry point, then config (later wins)."""
    found = {name: (ref, "builtin") for name, ref in BUILTIN.items()}
    for ep in entry_points(group=GROUP):
        found[ep.name] = (ep.value, "entry point")
    for name, ref in cfg.plugins.items():
        found[name] = (ref, "config")
    return found


def resolve_names(names: Iterable[str], cfg: SeedsConfig) -> dict[str, str]:
    """``module:attr`` of each named library; an unknown name is a one-line ValueError."""
    known = known_libraries(cfg)
    unknown = [n for n in names if n not in known]
    if unknown:
        listed = ", ".join(sorted(known))
        raise ValueError(f"unknown seed library {unknown[0]!r}; known libraries: {listed}")
    return {n: known[n][0] for n in names}


def load_adapter(ref: str, cfg: SeedsConfig) -> Any:
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ValueError(f"plugin reference {ref!r} is not of the form 'module:attr'")
    factory = getattr(importlib.import_module(module_name), attr)
    try:
        takes_config = "config" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        takes_config = False
    return factory(config=cfg) if takes_config else factory()
