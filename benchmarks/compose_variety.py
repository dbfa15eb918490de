"""Compose a large candidate set offline and put it beside the released Ops-6K.

    .venv/bin/python -m benchmarks.compose_variety --catalogue DIR [--n 6000] [--out DIR] \
        [--set container_share=0.0 ...]

``--catalogue`` is an ``opsynth seeds extract --out`` directory (or a run's ``catalogue/``);
``--set`` gives a ``[compose]`` setting another value than its default (a JSON value).
Prints the compose wall time and rate, the composer's rejection reasons, and the fidelity table
(``opsynth.report.fidelity``) against the shipped ``ops6k`` profile, with the structural
duplicate share of the composed set; writes ``composed.parquet`` and ``results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import warnings
from pathlib import Path

from pydantic import ValidationError

from opsynth.config import ComposeConfig
from opsynth.flows.reference import structural_share
from opsynth.profile import load_profile
from opsynth.report.fidelity import fidelity_table
from opsynth.store import read_tasks, write_tasks
from opsynth.synth.compose import compose


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--catalogue", type=Path, required=True)
    parser.add_argument("--n", type=int, default=6000)
    parser.add_argument("--profile", default="ops6k")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    settings = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set {item!r}: give KEY=VALUE")
        try:
            settings[key] = json.loads(value)
        except json.JSONDecodeError:
            settings[key] = value
    try:
        cfg = ComposeConfig(profile=args.profile, **settings)
    except ValidationError as exc:
        parser.error(f"--set: {exc.errors()[0]['loc'][0]}: {exc.errors()[0]['msg']}")
    warnings.simplefilter("ignore")
    out = args.out or Path(tempfile.mkdtemp(prefix="opsynth-compose-"))
    out.mkdir(parents=True, exist_ok=True)
    seeds = read_tasks(args.catalogue / "seeds.parquet")
    start = time.perf_counter()
    tasks = compose(seeds, cfg, args.n)
    wall = time.perf_counter() - start
    write_tasks(tasks, out / "composed.parquet")
    rows = [{"ops": json.dumps(t.ops), "data_source": t.data_source, "code": t.code} for t in tasks]
    table = fidelity_table(rows, load_profile("ops6k"), run_structural=structural_share(rows))
    print(
        f"composed {len(tasks)} candidates in {wall:.1f} s ({len(tasks) / wall * 60:.0f}/min) "
        f"on {os.cpu_count()} cores from {len(seeds)} seeds"
    )
    for row in table.iter_rows(named=True):
        cells = [
            "" if row[k] is None else f"{row[k]:g}" for k in ("run", "reference", "difference")
        ]
        print(
            f"{row['section']:12} {row['measure']:34} {cells[0]:>10} {cells[1]:>10} {cells[2]:>9}"
        )
    results = {
        "n": len(tasks),
        "wall_s": round(wall, 1),
        "cores": os.cpu_count(),
        "seeds": len(seeds),
        "settings": settings,
        "fidelity": table.to_dicts(),
    }
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    print(f"-> {out}")


if __name__ == "__main__":
    main()
