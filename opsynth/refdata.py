"""Where the read-only reference data (KernelBench jsonl, released Ops-6K parquet) lives.

It is not part of the repository: a checkout finds it in ``$OPSYNTH_SHARED``, in ``shared/``
inside the checkout, in ``shared/`` beside it (how CI lays it out), or in the user cache
(``$OPSYNTH_CACHE/shared``, else ``~/.cache/opsynth/shared``), where ``opsynth refdata fetch``
puts the Hub's copies. Only the benchmarks, the tests, the index builder and report
references read it; decontamination itself needs only the committed index.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
KERNELBENCH = Path("kernelbench") / "kernelbench.jsonl"
OPS6K = Path("ops6k") / "cuda_agent_ops_6k.parquet"
# Where ``opsynth refdata fetch`` reads them from by default.
KERNELBENCH_HUB = "ScalingIntelligence/KernelBench"
OPS6K_HUB = "BytedTsinghua-SIA/CUDA-Agent-Ops-6K"
KERNELBENCH_FIELDS = ("level", "problem_id", "name", "code")
OPS6K_FIELDS = ("ops", "data_source", "code")


def user_cache_dir() -> Path:
    """Where opsynth keeps files across runs (catalogues, fetched reference data):
    ``$OPSYNTH_CACHE``, else ``~/.cache/opsynth``."""
    return Path(os.environ.get("OPSYNTH_CACHE") or Path.home() / ".cache" / "opsynth").expanduser()


def user_shared_dir() -> Path:
    """The user cache's copy of the reference data."""
    return user_cache_dir() / "shared"


def shared_dir() -> Path | None:
    """The first existing shared-data folder, or None."""
    candidates = [os.environ.get("OPSYNTH_SHARED"), ROOT / "shared", ROOT.parent / "shared"]
    candidates.append(user_shared_dir())
    for candidate in candidates:
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return None


def shared_file(relative: Path) -> Path | None:
    base = shared_dir()
    if base is None or not (base / relative).is_file():
        return None
    return base / relative


def kernelbench_rows(rows: Iterable[Mapping[str, Any]], split: str = "") -> list[dict[str, Any]]:
    """KernelBench problems as ``kernelbench.jsonl`` holds them (``level``, ``problem_id``,
    ``name``, ``path``, ``code``), from Hub rows; a row without a level takes its split's
    (``level_2`` -> 2). ValueError when a field is missing."""
    from_split = int(split.rsplit("_", 1)[-1]) if split.rsplit("_", 1)[-1].isdigit() else None
    out = []
    for row in rows:
        level = row.get("level") if row.get("level") is not None else from_split
        missing = [f for f in KERNELBENCH_FIELDS if f != "level" and row.get(f) is None]
        if missing or level is None:
            raise ValueError(f"a KernelBench row lacks {', '.join(missing) or 'level'}")
        name, problem = str(row["name"]), int(row["problem_id"])
        path = f"KernelBench/level{int(level)}/{problem}_{name}.py"
        code = str(row["code"])
        out.append(
            {"level": int(level), "problem_id": problem, "name": name, "path": path, "code": code}
        )
    return sorted(out, key=lambda r: (r["level"], r["problem_id"]))


def write_kernelbench(rows: list[dict[str, Any]], base: Path) -> Path:
    """``rows`` (``kernelbench_rows``) as ``base/kernelbench/kernelbench.jsonl``."""
    from opsynth.store import write_text_atomic

    dest = base / KERNELBENCH
    write_text_atomic(dest, "".join(json.dumps(r) + "\n" for r in rows))
    return dest


def write_ops6k(rows: Iterable[Mapping[str, Any]], base: Path) -> Path:
    """Ops-6K rows as ``base/ops6k/cuda_agent_ops_6k.parquet``: ``ops`` (a JSON list, as the
    released file has it), ``data_source``, ``code``. ValueError when a column is missing."""
    import pyarrow as pa

    from opsynth.store import write_table_atomic

    table: dict[str, list[str]] = {name: [] for name in OPS6K_FIELDS}
    for row in rows:
        missing = [f for f in OPS6K_FIELDS if row.get(f) is None]
        if missing:
            raise ValueError(f"an Ops-6K row lacks {', '.join(missing)}")
        ops = row["ops"]
        table["ops"].append(ops if isinstance(ops, str) else json.dumps(list(ops)))
        table["data_source"].append(str(row["data_source"]))
        table["code"].append(str(row["code"]))
    dest = base / OPS6K
    write_table_atomic(pa.table(table), dest)
    return dest
