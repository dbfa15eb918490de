"""A sandboxed harness from outside the project's packages, for the runner's registry test.

The job's code is a list of reason codes, one per stage: the harness reports them as its
verdicts (a stage whose code is not ``ok`` refuses the job), with the uid it ran as.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from opsynth.filters.harness import CODE_FILE, Harness, register

STAGES = ("first", "second")
HARNESS = register(
    Harness("plugin", "plugin_harness:run", STAGES, {"plugin_refused": "the script said no"})
)


def run(workdir: str, settings: dict[str, Any], emit: Callable[[dict[str, Any]], None]) -> None:
    with open(os.path.join(workdir, CODE_FILE)) as fh:
        said = fh.read().split()
    for stage, reason in zip(settings.get("stages") or STAGES, said, strict=False):
        emit({"event": "stage", "stage": stage})
        passed = reason == "ok"
        row = {"stage": stage, "passed": passed, "reason": reason, "detail": ""}
        emit({"event": "verdict", "verdict": {**row, "measures": {"uid": os.getuid()}}})
        if not passed:
            break
    emit({"event": "done"})
