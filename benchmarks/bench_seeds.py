"""Time a full seed extraction (every library of ``seeds.libraries``) and print the numbers.

    .venv/bin/python -m benchmarks.bench_seeds [--out DIR]

The target is under 5 minutes on a 2-core machine without a GPU. Prints per-library runnable
and rejected counts and seconds, the wall time, and the coverage of the released Ops-6K.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from opsynth.config import SeedsConfig
from opsynth.refdata import OPS6K, shared_file
from opsynth.synth.catalog.extract import extract
from opsynth.synth.catalog.report import write_catalogue


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    cfg = SeedsConfig()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-seeds-"))
    t0 = time.perf_counter()
    result = write_catalogue(out, extract(cfg.libraries, cfg), shared_file(OPS6K))
    wall = time.perf_counter() - t0
    for name, row in result["libraries"].items():
        print(
            f"{name:13s} runnable {row['runnable']:5d}  rejected {row['rejected']:5d}  "
            f"families {row['families']:3d}  {row['elapsed_s']:6.1f} s  {row['status']}"
        )
    print(f"wall time {wall:.1f} s for {len(cfg.libraries)} libraries -> {out}")
    for part, row in result.get("coverage", {}).items():
        if isinstance(row, dict):
            share = f"{row['covered']}/{row['reference']} ({100 * row['fraction']:.1f}%)"
            print(f"coverage {part}: {share}")
    print(json.dumps({"wall_s": round(wall, 1)}))


if __name__ == "__main__":
    main()
