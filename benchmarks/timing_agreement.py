"""How far a run's independent timings of one task agree, and what that means for re-checking
its accepted rows against the runtime window.

    .venv/bin/python -m benchmarks.timing_agreement [RUN_DIR]

A run times each task's eager forward three times, each its own way: its last sizing probe at
the chosen size (``sizing.probe_timed_runs`` runs after one warm-up, CUDA events, the GPU held
alone), the ``runtime`` stage (``filters.warmup_runs`` + ``filters.timed_runs``, events, alone)
and ``verify`` (the worker's clock around the trusted side's requests, less the fastest ping).
The window decision (``too_fast``/``too_slow``) rests on the last two, and the release's audit
(``opsynth audit``) times every accepted row once more, so a row the run accepted near an edge
can be rejected there by noise alone.

Prints, per band of eager time: the quantiles of probe/runtime and verify/runtime, and of the
runtime stage's median over its fastest run (the spread inside one exclusive section); how
many accepted rows lie within 10% and 20% of a window edge; and the number of accepted rows a
second ``runtime`` measurement would put outside the window if it scattered around the first
as the probes did in the row's band. That last number is an estimate from the run's own data,
not a measured re-check, and an upper one: a probe's median of three runs scatters more than a
median of ten.
"""

from __future__ import annotations

import argparse
import bisect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opsynth.store import read_tasks, read_verdicts

RELEASE_RUN = Path(__file__).resolve().parent.parent / "data/releases/v1.0.0/run"
# Upper bounds (ms of eager median) of the bands the ratios are grouped in.
BANDS = (2.0, 5.0, 20.0, float("inf"))
QUANTILES = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)


@dataclass(frozen=True)
class Timed:
    """One task's three timings: raw eager medians in ms (``verify``'s scaled back)."""

    task_id: str
    runtime_ms: float
    runtime_min_ms: float
    scaled_ms: float
    probe_ms: float | None
    verify_ms: float | None


def band_of(ms: float) -> int:
    return bisect.bisect_left(BANDS, ms)


def band_name(index: int) -> str:
    if index == 0:
        return f"< {BANDS[0]:g} ms"
    if BANDS[index] == float("inf"):
        return f">= {BANDS[index - 1]:g} ms"
    return f"{BANDS[index - 1]:g}-{BANDS[index]:g} ms"


def quantile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of values already sorted."""
    return ordered[round(q * (len(ordered) - 1))]


def last_probe_ms(sizing: Any) -> float | None:
    """The last probe's eager median at the size the search chose, if it measured one."""
    if not isinstance(sizing, dict):
        return None
    found = [
        step.get("ms")
        for step in sizing.get("steps") or []
        if isinstance(step, dict) and step.get("value") == sizing.get("chosen") and step.get("ms")
    ]
    return float(found[-1]) if found else None


def timings(run: Path) -> tuple[list[Timed], tuple[float, float], float]:
    """Every task with a ``runtime`` measurement, and the run's window and speed factor."""
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    for verdict in read_verdicts(run / "verdicts.parquet"):
        if verdict.stage in ("eager", "runtime", "verify"):
            rows.setdefault(verdict.task_id, {})[verdict.stage] = verdict.measures
    window, factor = (1.0, 100.0), 1.0
    found = []
    for task_id, stages in rows.items():
        runtime = stages.get("runtime") or {}
        if not isinstance(runtime.get("eager_ms_median"), int | float):
            continue
        window = tuple(runtime.get("window_ms") or window)  # type: ignore[assignment]
        factor = float(runtime.get("speed_factor") or factor)
        judged = (stages.get("verify") or {}).get("judged_ms")
        found.append(
            Timed(
                task_id,
                float(runtime["eager_ms_median"]),
                float(runtime["eager_ms_min"]),
                float(runtime["scaled_ms"]),
                last_probe_ms((stages.get("eager") or {}).get("sizing")),
                float(judged) / factor if isinstance(judged, int | float) else None,
            )
        )
    return found, window, factor


def flip_estimate(
    accepted: list[Timed], ratios: dict[int, list[float]], window: tuple[float, float]
) -> tuple[float, float]:
    """Expected accepted rows a second measurement puts below and above ``window``: for each
    row, the share of its band's ratios r with scaled_ms * r outside the window, per edge."""
    low, high = window
    below = above = 0.0
    for t in accepted:
        band = ratios.get(band_of(t.runtime_ms)) or []
        if band:
            below += sum(t.scaled_ms * r < low for r in band) / len(band)
            above += sum(t.scaled_ms * r > high for r in band) / len(band)
    return below, above


def report(run: Path) -> dict[str, Any]:
    found, window, factor = timings(run)
    accepted_ids = {t.id for t in read_tasks(run / "accepted.parquet")}
    accepted = [t for t in found if t.task_id in accepted_ids]
    probe: dict[int, list[float]] = {}
    verify: dict[int, list[float]] = {}
    spread: dict[int, list[float]] = {}
    for t in found:
        band = band_of(t.runtime_ms)
        if t.probe_ms:
            probe.setdefault(band, []).append(t.probe_ms / t.runtime_ms)
        if t.verify_ms:
            verify.setdefault(band, []).append(t.verify_ms / t.runtime_ms)
        if t.runtime_min_ms > 0:
            spread.setdefault(band, []).append(t.runtime_ms / t.runtime_min_ms)
    low, high = window
    below, above = flip_estimate(accepted, probe, window)

    def near(share: float) -> int:
        return sum(
            t.scaled_ms < low * (1 + share) or t.scaled_ms > high * (1 - share) for t in accepted
        )

    def summary(groups: dict[int, list[float]]) -> dict[str, Any]:
        ordered = {b: sorted(v) for b, v in sorted(groups.items())}
        return {
            band_name(b): {"n": len(v), **{f"q{q:g}": round(quantile(v, q), 3) for q in QUANTILES}}
            for b, v in ordered.items()
        }

    return {
        "run": str(run),
        "timed_tasks": len(found),
        "accepted": len(accepted),
        "window_ms": list(window),
        "speed_factor": factor,
        "probe_over_runtime": summary(probe),
        "verify_over_runtime": summary(verify),
        "runtime_median_over_min": summary(spread),
        "accepted_within_10pct_of_an_edge": near(0.10),
        "accepted_within_20pct_of_an_edge": near(0.20),
        "accepted_expected_below_on_a_second_runtime": round(below, 1),
        "accepted_expected_above_on_a_second_runtime": round(above, 1),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, nargs="?", default=RELEASE_RUN)
    args = parser.parse_args(argv)
    result = report(args.run)
    print(
        f"{result['timed_tasks']} tasks timed, {result['accepted']} accepted; window "
        f"{result['window_ms']} ms (speed factor {result['speed_factor']})"
    )
    for name in ("probe_over_runtime", "verify_over_runtime", "runtime_median_over_min"):
        print(f"\n{name} (quantiles {', '.join(f'{q:g}' for q in QUANTILES)})")
        for band, row in result[name].items():
            values = " ".join(f"{row[f'q{q:g}']:6.3f}" for q in QUANTILES)
            print(f"  {band:>10s}  n={row['n']:5d}  {values}")
    print(
        f"\naccepted rows within 10% of a window edge: "
        f"{result['accepted_within_10pct_of_an_edge']}, within 20%: "
        f"{result['accepted_within_20pct_of_an_edge']}"
    )
    print(
        "accepted rows a second runtime measurement would put below / above the window "
        f"(estimate from the probes' scatter): "
        f"{result['accepted_expected_below_on_a_second_runtime']} / "
        f"{result['accepted_expected_above_on_a_second_runtime']}"
    )
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}))
    return result


if __name__ == "__main__":
    main()
