"""Where the read-only reference data (KernelBench jsonl, released Ops-6K parquet) lives.

It is not part of the repository: a checkout finds it in ``$OPSYNTH_SHARED``, in ``shared/``
inside the checkout, or in ``shared/`` beside it (how CI lays it out). Only the benchmark, the
tests and the index builder read it; decontamination itself needs only the committed index.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNELBENCH = Path("kernelbench") / "kernelbench.jsonl"
OPS6K = Path("ops6k") / "cuda_agent_ops_6k.parquet"


def shared_dir() -> Path | None:
    """The first existing shared-data folder, or None."""
    candidates = [os.environ.get("OPSYNTH_SHARED"), ROOT / "shared", ROOT.parent / "shared"]
    for candidate in candidates:
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return None


def shared_file(relative: Path) -> Path | None:
    base = shared_dir()
    if base is None or not (base / relative).is_file():
        return None
    return base / relative
