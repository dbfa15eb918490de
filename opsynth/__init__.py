"""opsynth's shared kernel (the record type, the config and the filter protocol), and the one
import name of the project: the stages are its subpackages (``opsynth.flows``,
``opsynth.synth``, ``opsynth.filters``, ``opsynth.ast_dedup``, ``opsynth.evaluator``,
``opsynth.trainer``) and the committed data is ``opsynth.data``.

An installed wheel holds them inside this folder. A checkout keeps them as folders beside it
(the project's layout), so there this package also looks in its parent folder, for those
names only: nothing else of the checkout becomes importable as ``opsynth.*``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

__version__ = "0.1.0"

STAGES = ("flows", "synth", "filters", "ast_dedup", "evaluator", "trainer", "data")


class _CheckoutStages(importlib.abc.MetaPathFinder):
    """Finds ``opsynth.<stage>`` in the checkout's folder ``<stage>/`` beside this package."""

    def __init__(self, root: str) -> None:
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        prefix, _, name = fullname.partition(".")
        if prefix != __name__ or name not in STAGES:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [self.root])


def _checkout_root() -> str | None:
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    installed = os.path.isdir(os.path.join(here, "filters"))
    beside = os.path.isfile(os.path.join(root, "filters", "__init__.py"))
    project = os.path.isfile(os.path.join(root, "pyproject.toml"))
    return root if beside and project and not installed else None


_root = _checkout_root()
if _root is not None and not any(isinstance(f, _CheckoutStages) for f in sys.meta_path):
    sys.meta_path.insert(0, _CheckoutStages(_root))
