"""Readers for task sets opsynth did not make: KernelBench problems as Task rows."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from opsynth.record import Task


def load_kernelbench(path: Path, levels: Iterable[int] | None = None) -> list[Task]:
    """KernelBench's jsonl (fields level, problem_id, name, code) as tasks. ``ops`` holds the
    problem name (level-2 names encode their operator sequence); ``data_source`` is
    ``kernelbench_l<level>`` so these rows can never pass for composed ones."""
    wanted = set(levels) if levels is not None else None
    tasks = []
    with open(path) as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                level, name, code = int(row["level"]), str(row["name"]), str(row["code"])
            except (json.JSONDecodeError, KeyError, ValueError) as exc:
                raise ValueError(f"{path}:{line_no} is not a KernelBench row ({exc})") from exc
            if wanted is not None and level not in wanted:
                continue
            tasks.append(
                Task(
                    ops=[name],
                    data_source=f"kernelbench_l{level}",
                    code=code,
                    meta={"level": level, "problem_id": row.get("problem_id"), "name": name},
                )
            )
    return tasks


def load_kernelbench_timings(path: Path, level: int) -> dict[int, float]:
    """KernelBench's published baseline timings (``baseline_time_torch.json``: level -> file
    name -> {mean, ...} in ms) keyed by problem id, the number before the first ``_`` of the
    file name. These are measurements of a known device, so they can calibrate another."""
    try:
        table = json.loads(Path(path).read_text())[f"level{level}"]
        return {int(name.split("_", 1)[0]): float(row["mean"]) for name, row in table.items()}
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        problem = f"{path} is not a KernelBench timing file with level {level}: {exc}"
        raise ValueError(problem) from exc
