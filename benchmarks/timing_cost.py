"""What the filters' timing settings cost a run, variant against variant, on one candidate set.

    python -m benchmarks.timing_cost --config data/releases/v1.0.0/config.toml \
        --target 100 --device cuda --out timing-cost --repeat 2 \
        --variant as_configured= \
        --variant lean=filters.warmup_runs=1,filters.timed_runs=5,sizing.probe_timed_runs=2

Every variant is the same ``opsynth run`` (``--config`` with the variant's keys set over it) in
a folder of its own, started from a copy of ``--seed-run`` if given (a run directory to resume),
so all compose the same candidates; their seed catalogue is kept in ``--out`` (``seeds.cache_dir``,
unless a variant sets it) and extracted there before the first variant starts
(``--no-catalogue-first``: by the first variant, inside its ``--time-limit``). Timed
sections hold the GPU exclusively and every other worker's GPU work queues behind them
(``filters.gpulock``): this prints, per variant, the sandbox's candidates per minute between
its first and last result, the mean seconds per candidate of each stage, the part of them spent
waiting for the GPU lock and holding it alone, and how many of the variant's final reasons
differ from the first variant's on the same candidates. Writes ``timing_cost.json`` to
``--out``.

The first variant on a fresh host also pays for what every later one finds ready: the trusted
compile-cache layer (in the pool's start, outside the rate) and its workers' first CUDA
contexts, created all at once (inside it). ``--repeat 2`` runs the list twice (the second
round's names end in ``#2``), so each variant is measured once after the other. A
``--time-limit`` that stops a variant inside its chunk still counts the jobs that settled
(the chunk's journal), so variants can share one bounded device call; a variant runs on past
its limit until its begun candidates finish and its pool and server stop, and
``timing_cost.json`` is rewritten after each, so a call cut short keeps the variants done.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
import tomllib
from collections import defaultdict
from pathlib import Path
from typing import Any

from opsynth.flows.size_screen import JOURNAL_SUFFIX, Journal
from opsynth.record import Verdict
from opsynth.store import read_verdicts

# Stages run in the candidate's process, then the judge's; sizing is the eager row's claim.
STAGES = ("eager", "randomness", "degenerate", "runtime", "compile", "verify")


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """``name=section.key=value,...`` as (name, {"section.key": value}); values are read as
    TOML values (``5``, ``true``, ``"x"``)."""
    name, _, rest = text.partition("=")
    if not name:
        raise SystemExit(f"--variant {text!r}: expected NAME=section.key=value,...")
    overrides: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or "." not in key:
            raise SystemExit(f"--variant {text!r}: {item!r} is not section.key=value")
        overrides[key] = tomllib.loads(f"v = {value}")["v"]
    return name, overrides


def merged(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    config = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for dotted, value in overrides.items():
        section, key = dotted.split(".", 1)
        config.setdefault(section, {})[key] = value
    return config


def toml_value(value: Any) -> str:
    """One TOML value: tables inline, strings as JSON's (a subset of TOML's basic strings)."""
    if isinstance(value, dict):
        return (
            "{"
            + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items())
            + "}"
        )
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)


def to_toml(config: dict[str, Any]) -> str:
    """A config of top-level keys and one level of tables (a run config's shape) as TOML."""
    lines = [f"{k} = {toml_value(v)}" for k, v in config.items() if not isinstance(v, dict)]
    for section, table in config.items():
        if isinstance(table, dict):
            lines += ["", f"[{section}]"] + [f"{k} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def journaled(run: Path) -> list[Verdict]:
    """The verdicts of the jobs that settled in a chunk a ``--time-limit`` stopped: its
    journal (``flows.size_screen.Journal``) holds them until the chunk is done, and the run's
    ``verdicts.parquet`` does not."""
    return [
        verdict
        for path in sorted((run / "work").glob(f"*{JOURNAL_SUFFIX}"))
        for results in Journal(path).done.values()
        for found in results.values()
        for verdict in found
    ]


def summarise(run: Path) -> dict[str, Any]:
    """Per stage of the run's verdicts, those of a stopped chunk's settled jobs included:
    rows, mean seconds, lock wait and exclusive hold."""
    manifest = json.loads((run / "run.json").read_text())
    verdicts = read_verdicts(run / "verdicts.parquet") + journaled(run)
    per_stage: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    final: dict[str, str] = {}
    sizing = {"seconds": 0.0, "probes": 0, "candidates": 0}
    requests: dict[str, float] = defaultdict(float)  # verify's wait per kind of request
    timed_verifies = 0
    for v in verdicts:
        if v.stage not in STAGES:
            continue
        measures = v.measures
        entry = per_stage[v.stage]
        entry["rows"] += 1
        entry["seconds"] += v.elapsed_s or 0.0
        entry["lock_wait_s"] += measures.get("gpu_lock_wait_s") or measures.get("lock_wait_s") or 0
        entry["exclusive_s"] += measures.get("gpu_exclusive_s") or measures.get("timed_s") or 0
        if v.reason != "ok" or v.task_id not in final:
            final[v.task_id] = v.reason  # its first rejection, else ok
        spent = measures.get("requests_s")
        if v.stage == "verify" and isinstance(spent, dict):
            timed_verifies += 1
            for op, seconds in spent.items():
                requests[op] += float(seconds)
        claim = measures.get("sizing")
        if v.stage == "eager" and isinstance(claim, dict):
            sizing["seconds"] += float(claim.get("seconds") or 0.0)
            sizing["probes"] += len(claim.get("steps") or [])
            sizing["candidates"] += 1
    runtime = manifest.get("filters_runtime") or {}
    span = (runtime.get("last_result_at") or 0) - (runtime.get("first_result_at") or 0)
    sandboxed = per_stage["eager"]["rows"] if "eager" in per_stage else 0
    return {
        "sandboxed": int(sandboxed),
        "accepted": (manifest.get("counts") or {}).get("accepted"),
        "filter_span_s": round(span, 1),
        "candidates_per_min": round(60 * sandboxed / span, 1) if span > 0 else None,
        "stage_seconds": manifest.get("stage_seconds"),
        "stages": {
            stage: {
                "rows": int(e["rows"]),
                **{
                    k: round(e[k] / e["rows"], 3) for k in ("seconds", "lock_wait_s", "exclusive_s")
                },
            }
            for stage, e in per_stage.items()
        },
        "sizing": {
            "seconds": round(sizing["seconds"] / max(1, sizing["candidates"]), 3),
            "probes": round(sizing["probes"] / max(1, sizing["candidates"]), 2),
        },
        "verify_requests_s": {
            op: round(total / timed_verifies, 3) for op, total in sorted(requests.items())
        },
        "final": final,
    }


def table(results: dict[str, dict[str, Any]]) -> str:
    names = list(results)
    lines = ["| measure | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]

    def row(label: str, get: Any) -> None:
        lines.append(f"| {label} | " + " | ".join(str(get(results[n])) for n in names) + " |")

    row("candidates in the sandbox", lambda r: r["sandboxed"])
    row("candidates/min (first to last result)", lambda r: r["candidates_per_min"])
    row(
        "sizing s / probes per candidate",
        lambda r: f"{r['sizing']['seconds']} / {r['sizing']['probes']}",
    )
    for stage in STAGES:
        row(
            f"{stage}: s / lock wait / held alone",
            lambda r, s=stage: "{seconds} / {lock_wait_s} / {exclusive_s}".format(
                **r["stages"].get(s, {"seconds": "-", "lock_wait_s": "-", "exclusive_s": "-"})
            ),
        )
    row(
        "verify's waits by request (s)",
        lambda r: ", ".join(f"{op} {s}" for op, s in r.get("verify_requests_s", {}).items()),
    )
    first = results[names[0]]["final"]
    row(
        f"final reasons differing from {names[0]}",
        lambda r: sum(first.get(t, reason) != reason for t, reason in r["final"].items()),
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="the run config varied")
    parser.add_argument("--seed-run", type=Path, help="a run directory each variant starts from")
    parser.add_argument("--variant", action="append", required=True, help="NAME=sec.key=v,...")
    parser.add_argument("--target", type=int, default=100)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--time-limit", type=float, default=0.0, help="per variant; 0 = none")
    parser.add_argument("--repeat", type=int, default=1, help="run the variant list this often")
    parser.add_argument("--out", type=Path, default=Path("timing-cost"))
    parser.add_argument(
        "--catalogue-first",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="extract the seed catalogue before the first variant, outside its time limit",
    )
    args = parser.parse_args(argv)
    base = tomllib.loads(args.config.read_text())
    cache = (args.out / "seed-cache").resolve()
    if args.catalogue_first:
        print(catalogue_first(base, cache), flush=True)
    results: dict[str, dict[str, Any]] = {}
    variants = [parse_variant(text) for text in args.variant]
    rounds = [
        (name if k == 0 else f"{name}#{k + 1}", overrides)
        for k in range(max(1, args.repeat))
        for name, overrides in variants
    ]
    for name, overrides in rounds:
        folder = args.out / name.replace("#", "-")
        shutil.rmtree(folder, ignore_errors=True)
        if args.seed_run:
            shutil.copytree(args.seed_run, folder / "run")
        folder.mkdir(parents=True, exist_ok=True)
        shared = {"seeds.cache_dir": str(cache)}
        config = folder / "config.toml"
        config.write_text(to_toml(merged(base, {**shared, **overrides})))
        cmd = [sys.executable, "-m", "opsynth.flows.cli", "run", "--config", str(config)]
        cmd += ["--out", str(folder / "run"), "--target", str(args.target)]
        cmd += ["--device", args.device]
        if args.time_limit > 0:
            cmd += ["--time-limit", str(args.time_limit)]
        start = time.perf_counter()
        code = subprocess.run(cmd).returncode
        wall = time.perf_counter() - start
        print(f"{name}: exit {code} in {wall:.0f} s", flush=True)
        if not (folder / "run" / "verdicts.parquet").exists():
            continue  # the run said why; a variant that filtered nothing has no column
        results[name] = {"overrides": overrides, "returncode": code, "wall_s": round(wall, 1)}
        results[name].update(summarise(folder / "run"))
        # after every variant: a caller's own limit that cuts the list keeps those done
        write_results(args.out, results)
    if results:
        print(table(results))
    write_results(args.out, results)
    return results


def catalogue_first(base: dict[str, Any], cache: Path) -> str:
    """Extract the base config's seed catalogue into the variants' shared ``cache``, so that
    no variant's time limit pays for it (a variant that changes ``seeds.*`` still extracts its
    own); one line saying what happened. A failed extraction is left to the variants."""
    from opsynth.config import RunConfig
    from opsynth.synth.catalog.report import ensure_catalogue

    start = time.perf_counter()
    scratch = cache.parent / "catalogue-first"
    try:
        seeds = RunConfig.model_validate(merged(base, {"seeds.cache_dir": str(cache)})).seeds
        reused = ensure_catalogue(scratch, seeds)
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"
        return f"seed catalogue not extracted first ({why}); left to the variants"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    took = time.perf_counter() - start
    return (
        f"seed catalogue {'found' if reused else 'extracted'} in {took:.0f} s, before the variants"
    )


def write_results(out: Path, results: dict[str, dict[str, Any]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "timing_cost.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
