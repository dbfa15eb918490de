"""How many sizing probes a different first probe would need, replayed on a run's own probes.

    python -m benchmarks.sizing_replay --run data/releases/v1.0.0/run --scale 1 8 32 64

Sizing (``filters.sizing.Search``) probes a candidate at its composed size first, which the
composer picks from a CPU cost model, so on a GPU most searches start far below the target and
need two more probes. This replays the search, under the run's own sizing rule and runtime
window (its ``run.json``), on every candidate of ``--run`` that recorded two or more
successful probes (the eager row's ``sizing`` claim, a stopped chunk's journal left out), as
if its first probe had been at ``scale`` times the composed size (the nearest power of two),
against a model fitted to that candidate's own two largest probes: runtime a power of the size
(exponent clamped to 0.3-1.2), device memory linear in it, and a probe above
``--oom-gib`` an out-of-memory failure. Prints, per scale, the mean probes per candidate, how
many the search ended with, the share whose chosen size the model puts inside the runtime
window and within the memory cap, how many ended with no size (a first probe that failed), and
the sizing seconds per candidate that implies: each replayed search costs what the run's own
searches of that many probes took on average (their recorded ``seconds``).

A model, not a measurement: scale 1 replays today's rule, so its mean against the recorded
one says how far the model is off. Writes nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opsynth.config import RunConfig
from opsynth.filters.sizing import Probe, Search, target_ms
from opsynth.store import read_verdicts

Model = Callable[[int], tuple[float, float]]


def run_config(run: Path) -> RunConfig:
    """The run's own config (its ``run.json``), so the replay follows the rule and window it
    sized with; the built-in one for a folder without it."""
    manifest = run / "run.json"
    if not manifest.is_file():
        return RunConfig()
    return RunConfig.model_validate(json.loads(manifest.read_text()).get("config") or {})


def sized_claims(run: Path) -> list[dict[str, Any]]:
    """The sizing claims of ``run``'s eager rows with at least two successful probes."""
    claims = []
    for v in read_verdicts(run / "verdicts.parquet"):
        claim = v.measures.get("sizing") if v.stage == "eager" else None
        steps = claim.get("steps") if isinstance(claim, dict) else None
        if steps and len([s for s in steps if s.get("ms")]) >= 2:
            claims.append(claim)
    return claims


def fitted(steps: list[dict[str, Any]]) -> Model:
    """size -> (ms, device GiB) through the two largest successful probes."""
    measured = sorted(
        (s["value"], s["ms"], s.get("device_gib") or 0.0) for s in steps if s.get("ms")
    )
    (v1, ms1, gib1), (v2, ms2, gib2) = measured[-2], measured[-1]
    exponent = math.log(ms2 / ms1) / math.log(v2 / v1) if v2 != v1 else 1.0
    exponent = min(max(exponent, 0.3), 1.2)
    slope = (gib2 - gib1) / (v2 - v1) if v2 != v1 else 0.0

    def model(value: int) -> tuple[float, float]:
        return ms2 * (value / v2) ** exponent, gib2 + slope * (value - v2)

    return model


def replay(
    claim: dict[str, Any], scale: float, cfg: Any, window: tuple[float, float], oom_gib: float
) -> tuple[int, bool | None]:
    """(probes, whether the chosen size is inside the window and the cap; None: no size)."""
    model = fitted(claim["steps"])
    composed = claim["steps"][0]["value"]
    value = composed if scale == 1 else 2 ** round(math.log2(max(1.0, composed * scale)))
    search = Search(value, target_ms(window), cfg)
    probes = 0
    while value is not None:
        probes += 1
        ms, gib = model(value)
        probe = Probe(None, reason="oom") if gib > oom_gib else Probe(ms, device_gib=gib)
        value = search.observe(probe)
    chosen = search.chosen()
    if chosen is None:
        return probes, None
    ms, gib = model(chosen)
    return probes, window[0] <= ms <= window[1] and gib <= cfg.max_device_gib


def seconds_by_probes(claims: list[dict[str, Any]]) -> dict[int, float]:
    """Mean recorded sizing seconds of the searches that took each number of probes."""
    by: dict[int, list[float]] = {}
    for c in claims:
        by.setdefault(len(c["steps"]), []).append(float(c.get("seconds") or 0.0))
    return {n: round(statistics.mean(xs), 3) for n, xs in sorted(by.items())}


def _cost(cost: dict[int, float], probes: int) -> float:
    """A search of ``probes`` probes, priced as the run's own were; a count the run never
    recorded, at the nearest count's price per probe."""
    if probes in cost:
        return cost[probes]
    nearest = min(cost, key=lambda n: abs(n - probes))
    return cost[nearest] / nearest * probes


def main(argv: list[str] | None = None) -> dict[float, dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a run directory")
    parser.add_argument("--scale", type=float, nargs="+", default=[1, 8, 16, 32, 64])
    parser.add_argument("--oom-gib", type=float, default=60.0, help="a probe above this fails")
    args = parser.parse_args(argv)
    cfg = run_config(args.run)
    window = cfg.filters.window_ms("cuda")
    claims = sized_claims(args.run)
    recorded = statistics.mean(len(c["steps"]) for c in claims) if claims else 0.0
    cost = seconds_by_probes(claims)
    print(f"{len(claims)} candidates with two or more probes; recorded {recorded:.3f} probes each")
    print(f"recorded sizing seconds by probes: {cost}")
    results: dict[float, dict[str, Any]] = {}
    for scale in args.scale:
        outcomes = [replay(c, scale, cfg.sizing, window, args.oom_gib) for c in claims]
        if not outcomes:
            continue
        chosen = [ok for _, ok in outcomes if ok is not None]
        results[scale] = {
            "probes": round(statistics.mean(n for n, _ in outcomes), 3),
            "ended_after": dict(sorted(Counter(n for n, _ in outcomes).items())),
            "in_window": round(sum(chosen) / len(outcomes), 3),
            "no_size": len(outcomes) - len(chosen),
            "sizing_s": round(statistics.mean(_cost(cost, n) for n, _ in outcomes), 3),
        }
        print(f"first probe x{scale:g}: {results[scale]}")
    return results


if __name__ == "__main__":
    main()
