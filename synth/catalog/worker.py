"""The extraction subprocess of one library: load its adapter, validate every spec it yields,
stream one JSON line per seed (``{"task": row|null, "verdict": row}``) to the output file.

Lines are flushed as they are written, so when the orchestrator kills a library at its
deadline every seed finished so far is kept. Anything the adapter does wrong (raising while
constructed or while iterating, yielding a non-spec or a duplicate name) becomes a verdict.
Run as ``python -m opsynth.synth.catalog.worker NAME REF CONFIG_JSON OUT``.
"""

from __future__ import annotations

import json
import sys
import warnings
from dataclasses import replace
from typing import IO, Any

from opsynth.config import SeedsConfig
from opsynth.synth.catalog.plugins import load_adapter
from opsynth.synth.catalog.spec import CatalogSpec
from opsynth.synth.catalog.validate import rejection, validate


def _emit(out: IO[str], task: Any, verdict: Any) -> None:
    row = {"task": task.to_row() if task is not None else None, "verdict": verdict.to_row()}
    out.write(json.dumps(row, default=str) + "\n")
    out.flush()


def _library_spec(name: str, label: str = "") -> CatalogSpec:
    return CatalogSpec(library=name, name=label or f"<{name}>", kind="function")


def _invalid(spec: Any, library: str) -> str:
    if not isinstance(spec, CatalogSpec):
        return f"yielded a {type(spec).__name__}, not a CatalogSpec"
    if not spec.name or not isinstance(spec.name, str):
        return "a spec without a name"
    if spec.kind not in ("module", "function", "method", "operator", "layer"):
        return f"unknown kind {spec.kind!r}"
    if not spec.code and not spec.target and not spec.reason:
        return "neither code nor a target to call"
    return ""


def extract_library(name: str, ref: str, cfg: SeedsConfig, out: IO[str]) -> None:
    warnings.simplefilter("ignore")
    try:
        specs = iter(load_adapter(ref, cfg).specs())
    except Exception as exc:
        detail = f"{type(exc).__name__}: {str(exc)[:300]}"
        _emit(out, None, rejection(_library_spec(name), "library_error", detail))
        return
    seen: set[str] = set()
    index = 0
    while True:
        try:
            spec = next(specs)
        except StopIteration:
            return
        except Exception as exc:
            detail = f"after {index} specs: {type(exc).__name__}: {str(exc)[:300]}"
            _emit(out, None, rejection(_library_spec(name), "library_error", detail))
            return
        index += 1
        problem = _invalid(spec, name)
        if problem:
            label = getattr(spec, "name", None)
            label = label if isinstance(label, str) and label else f"<{name}#{index}>"
            _emit(out, None, rejection(_library_spec(name, label), "invalid_spec", problem))
            continue
        spec = replace(spec, library=name)
        if cfg.operators and spec.name not in cfg.operators:
            continue  # seeds.operators narrows every library to the named operators
        if spec.name in seen:
            _emit(out, None, rejection(spec, "duplicate_name", "name already yielded"))
            continue
        seen.add(spec.name)
        task, verdict = validate(spec, cfg.seed_timeout_s, cfg.fill_uninitialized)
        _emit(out, task, verdict)


def main(argv: list[str]) -> None:
    name, ref, cfg_json, path = argv
    cfg = SeedsConfig.model_validate_json(cfg_json)
    with open(path, "a") as out:
        extract_library(name, ref, cfg, out)


if __name__ == "__main__":
    main(sys.argv[1:])
