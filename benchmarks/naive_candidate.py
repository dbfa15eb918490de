"""The naive harness's unit of work: one fresh Python process for one candidate file.

    python benchmarks/naive_candidate.py CANDIDATE.py SETTINGS.json DATA_SOURCE

Runs the same filters as the warm pool (the static check, then ``filters.checks.run_candidate``
in this process, under the pool's per-candidate rlimits) with nothing reused: torch is
imported afresh and the caller points ``TORCHINDUCTOR_CACHE_DIR`` at an empty directory.
Prints one JSON line: the verdict rows.
``benchmarks/throughput.py`` runs it sequentially to compare with the pool.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(code_path: str, settings_path: str, data_source: str) -> None:
    from opsynth.filters.static_check import StaticCheck
    from opsynth.record import Task

    code = Path(code_path).read_text()
    # the data source decides what the static check allows (transformers imports)
    decision = StaticCheck().filter(Task(ops=["naive"], data_source=data_source, code=code))
    if not decision.keep:
        rows = [{"stage": "static", "passed": False, "reason": decision.reason}]
        print(json.dumps(rows))
        return
    from opsynth.filters.childio import apply_limits as _apply_limits

    settings = json.loads(Path(settings_path).read_text())
    _apply_limits(settings, settings["device"])  # the pool's per-candidate rlimits

    from opsynth.filters.checks import run_candidate

    rows = []
    run_candidate(code_path, settings, lambda e: rows.append(e["verdict"]) if "verdict" in e else 0)
    print(json.dumps(rows))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
