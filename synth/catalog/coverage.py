"""Coverage of the released Ops-6K: which of its operator names are runnable seeds here.

The reference names are the distinct entries of the ``ops`` lists of its non-transformers rows
(330: ``nn.Conv2d``, ``F.gelu``, ``torch.cumsum``, ``+``...) and the class names of its
transformers rows (50; their ``ops`` is ``ResNetShortCut_2``, a class and a variant index).
Every miss carries the reason its seed was rejected, or ``not_discovered``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from opsynth.record import Task, Verdict

TRANSFORMERS = "transformers"
_VARIANT = re.compile(r"_\d+$")


def reference_names(path: Path) -> tuple[set[str], set[str]]:
    """(torch operator names, transformers class names) of an Ops-6K-shaped parquet."""
    table = pq.read_table(path, columns=["ops", "data_source"]).to_pylist()
    torch_names, classes = set(), set()
    for row in table:
        if row["data_source"] == TRANSFORMERS:
            classes.add(_VARIANT.sub("", row["ops"].strip('[]"')))
        else:
            torch_names.update(json.loads(row["ops"]))
    return torch_names, classes


def _part(wanted: set[str], runnable: set[str], reasons: dict[str, str]) -> dict[str, Any]:
    covered = sorted(wanted & runnable)
    misses = [
        {"name": n, "reason": reasons.get(n, "not_discovered")} for n in sorted(wanted - runnable)
    ]
    return {
        "reference": len(wanted),
        "covered": len(covered),
        "fraction": round(len(covered) / len(wanted), 4) if wanted else 0.0,
        "misses": misses,
    }


def coverage(tasks: list[Task], verdicts: list[Verdict], reference: Path) -> dict[str, Any]:
    torch_names, classes = reference_names(reference)
    runnable_ops = {t.ops[0] for t in tasks if t.data_source != TRANSFORMERS}
    runnable_classes = {t.ops[0] for t in tasks if t.data_source == TRANSFORMERS}
    reasons = {v.measures.get("name", ""): v.reason for v in verdicts if not v.passed}
    return {
        "reference": str(reference),
        "torch": _part(torch_names, runnable_ops, reasons),
        TRANSFORMERS: _part(classes, runnable_classes, reasons),
    }
