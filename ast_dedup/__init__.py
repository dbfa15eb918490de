"""KernelBench decontamination and intra-set deduplication for opsynth.

``decontaminate_tasks`` / ``Decontaminator``: drop tasks whose ``Model`` class is too similar
(``PythonASTSimilarity`` > 0.9) to a KernelBench problem's, as CUDA Agent did for Ops-6K.
``dedup``: drop exact, near and structural duplicates within a set. ``screen``: both, parsing
each code once. None of them executes task code; all work offline from the structure index in
``data/``.

Names are imported on first use, so ``python -m opsynth.ast_dedup.index`` does not import its own
module twice.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Decontaminator": "opsynth.ast_dedup.decontam",
    "decontaminate_tasks": "opsynth.ast_dedup.decontam",
    "KERNELBENCH_SIMILAR": "opsynth.ast_dedup.decontam",
    "dedup": "opsynth.ast_dedup.dedup",
    "EXACT": "opsynth.ast_dedup.dedup",
    "NEAR": "opsynth.ast_dedup.dedup",
    "STRUCTURAL": "opsynth.ast_dedup.dedup",
    "KernelBenchIndex": "opsynth.ast_dedup.index",
    "build_index": "opsynth.ast_dedup.index",
    "Nearest": "opsynth.ast_dedup.nearest",
    "nearest_kernelbench": "opsynth.ast_dedup.nearest",
    "screen": "opsynth.ast_dedup.screen",
    "model_class_similarity": "opsynth.ast_dedup.similarity",
    "python_ast_similarity": "opsynth.ast_dedup.similarity",
    "NO_MODEL_CLASS": "opsynth.ast_dedup.source",
    "UNPARSEABLE": "opsynth.ast_dedup.source",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ast_dedup' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
