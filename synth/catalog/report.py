"""Write an extraction to a directory: the seeds, every verdict, the per-reason table and,
when the released set is at hand, the coverage report.

Files: ``seeds.parquet`` (runnable seeds, ``Task`` rows), ``verdicts.parquet`` (one ``seeds``
verdict per operator, runnable or not), ``reasons.csv`` (library, reason, count, examples),
``coverage.json`` and ``summary.json`` (per-library counts and extraction time).
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
from collections import Counter, defaultdict
from importlib import metadata
from pathlib import Path
from typing import Any

from opsynth.config import SeedsConfig
from opsynth.record import Verdict
from opsynth.refdata import OPS6K, shared_file, user_cache_dir
from opsynth.store import digest, write_tasks, write_text_atomic, write_verdicts
from opsynth.synth.catalog.coverage import coverage
from opsynth.synth.catalog.extract import Extraction, extract
from opsynth.synth.catalog.validate import CATALOGUE_VERSION

EXAMPLES = 5


def reason_rows(verdicts: list[Verdict]) -> list[dict[str, Any]]:
    counts: Counter[tuple[str, str]] = Counter()
    examples: dict[tuple[str, str], list[str]] = defaultdict(list)
    for v in verdicts:
        key = (v.measures.get("library", ""), v.reason)
        counts[key] += 1
        if len(examples[key]) < EXAMPLES:
            examples[key].append(v.measures.get("name", ""))
    return [
        {
            "library": lib,
            "reason": reason,
            "count": n,
            "examples": " ".join(examples[(lib, reason)]),
        }
        for (lib, reason), n in sorted(counts.items(), key=lambda kv: (kv[0][0], -kv[1]))
    ]


def summary(extraction: Extraction) -> dict[str, Any]:
    out = {}
    for lib in extraction.libraries:
        families = {v.measures.get("family") for v in lib.verdicts if v.passed} - {"", None}
        out[lib.name] = {
            "runnable": len(lib.tasks),
            "rejected": sum(not v.passed for v in lib.verdicts),
            "families": len(families),
            "elapsed_s": lib.elapsed_s,
            "status": lib.status,
        }
    return out


def write_catalogue(out: Path, extraction: Extraction, reference: Path | None) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    write_tasks(extraction.tasks, out / "seeds.parquet")
    write_verdicts(extraction.verdicts, out / "verdicts.parquet")
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=["library", "reason", "count", "examples"])
    writer.writeheader()
    writer.writerows(reason_rows(extraction.verdicts))
    write_text_atomic(out / "reasons.csv", buffer.getvalue())
    result = {"libraries": summary(extraction)}
    if reference is not None:
        result["coverage"] = coverage(extraction.tasks, extraction.verdicts, reference)
        write_text_atomic(out / "coverage.json", json.dumps(result["coverage"], indent=2))
    write_text_atomic(out / "summary.json", json.dumps(result["libraries"], indent=2))
    return result


def catalogue_key(cfg: SeedsConfig) -> str:
    """What a catalogue depends on: the seeds config, the extraction's own version
    (``CATALOGUE_VERSION``) and the versions of every library extracted."""
    versions = {}
    for name in cfg.libraries:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = ""
    # work_dump: a setting added later is left out at what catalogues were made with before
    settings = {k: v for k, v in cfg.work_dump().items() if k not in ("cache_dir", "workers")}
    return digest(settings, f"catalogue {CATALOGUE_VERSION}", versions)


def cache_root(cfg: SeedsConfig) -> Path | None:
    """Where catalogues are kept across runs; None when ``seeds.cache_dir`` is 'none'."""
    if cfg.cache_dir == "none":
        return None
    if cfg.cache_dir:
        return Path(cfg.cache_dir).expanduser()
    return user_cache_dir()


def ensure_catalogue(run_root: Path, cfg: SeedsConfig) -> bool:
    """Extract ``cfg.libraries`` into ``<run>/catalogue/`` through the content-addressed
    ``catalogue-<key>/`` of the user cache (or of ``<run>/work/`` without one); returns
    whether an earlier extraction was reused."""
    root = cache_root(cfg) or run_root / "work"
    work = root / f"catalogue-{catalogue_key(cfg)}"
    reused = (work / "summary.json").is_file()
    if not reused:
        tmp = work.with_name(f".{work.name}.{os.getpid()}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        write_catalogue(tmp, extract(cfg.libraries, cfg), shared_file(OPS6K))
        try:
            tmp.rename(work)
        except OSError:  # another run finished the same extraction first
            shutil.rmtree(tmp, ignore_errors=True)
    target = run_root / "catalogue"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(work, target)
    return reused
