"""Compose the same candidates with one composer setting at two values, and say what it changed.

    .venv/bin/python -m benchmarks.compose_setting --catalogue DIR --setting explicit_dim \
        [--values false true] [--n 3000] [--profile ops6k] [--dims F.softmax nn.Softmax ...] \
        [--calls nn.ConvTranspose2d ...]

``--catalogue`` is an ``opsynth seeds extract --out`` directory (or a run's ``catalogue/``);
``--setting`` names a ``[compose]`` setting and ``--values`` its two values (``false true``
for a boolean one, required for others). Both sets are drawn from the same seeds
with the same RNG: a setting that rewrites calls without changing which draws pass leaves
every op sequence where it was; one that changes a draw's fate moves the later draws of its
chunk. Prints each set's compose time and structural-duplicate share, how many tasks keep
their op sequence and their code; how the calls of the ``--dims`` names pass ``dim``, and
for each ``--calls`` name the share of its calls passing each keyword, in each set and in
Ops-6K (when the reference data is found).
"""

from __future__ import annotations

import argparse
import ast
import json
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import polars as pl
from pydantic import ValidationError

from opsynth.call_arguments import count_arguments
from opsynth.config import ComposeConfig
from opsynth.flows.reference import structural_share
from opsynth.record import Task
from opsynth.refdata import OPS6K, shared_file
from opsynth.store import read_tasks
from opsynth.synth.compose import compose

UNREADABLE = "unparsed"


def dim_forms(codes: Iterable[str], names: Sequence[str]) -> Counter[str]:
    """How the calls of ``names`` in ``codes`` pass ``dim``: ``dim=<source>`` by keyword or
    as the second positional argument (or a module's first), ``none`` without one."""
    wanted = set(names)
    forms: Counter[str] = Counter()
    for code in codes:
        try:
            tree = ast.parse(code)
        except SyntaxError:
            forms[UNREADABLE] += 1
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or ast.unparse(node.func) not in wanted:
                continue
            by_name = [k.value for k in node.keywords if k.arg == "dim"]
            position = 0 if ast.unparse(node.func).startswith("nn.") else 1
            given = by_name or node.args[position : position + 1]
            forms[f"dim={ast.unparse(given[0])}" if given else "none"] += 1
    return forms


def keyword_shares(codes: Iterable[str], names: Sequence[str]) -> dict[str, dict[str, float]]:
    """Per name in ``names``: its calls, and the share of them passing each keyword (read as
    the profile reads them, ``opsynth.call_arguments``)."""
    calls, passed = count_arguments(codes)
    shares: dict[str, dict[str, float]] = {}
    for name in names:
        total = calls[name]
        keywords = passed.get(name, {})
        shares[name] = {"calls": total} | {
            k: round(sum(v.values()) / total, 3) for k, v in sorted(keywords.items()) if total
        }
    return shares


def changes(off: Sequence[Task], on: Sequence[Task]) -> dict[str, int]:
    """Position by position: tasks with the same op sequence, and with the same code."""
    pairs = list(zip(off, on, strict=False))
    return {
        "compared": len(pairs),
        "same_ops": sum(a.ops == b.ops for a, b in pairs),
        "same_code": sum(a.code == b.code for a, b in pairs),
    }


def _rows(tasks: Sequence[Task]) -> list[dict]:
    return [{"ops": json.dumps(t.ops), "data_source": t.data_source, "code": t.code} for t in tasks]


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--catalogue", type=Path, required=True)
    parser.add_argument("--setting", required=True, help="a [compose] setting")
    parser.add_argument("--values", nargs=2, help="its two values (default: false true)")
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--profile", default="ops6k", help="compose.profile of both sets")
    parser.add_argument("--dims", nargs="*", default=[], help="names whose dim to read")
    parser.add_argument("--calls", nargs="*", default=[], help="names whose keywords to count")
    args = parser.parse_args(argv)
    configs = _configs(parser, args)
    warnings.simplefilter("ignore")
    seeds = read_tasks(args.catalogue / "seeds.parquet")
    made: dict[str, list[Task]] = {}
    results: dict = {"setting": args.setting, "n": args.n}
    for key, cfg in configs.items():
        start = time.perf_counter()
        made[key] = compose(seeds, cfg, args.n)
        wall = time.perf_counter() - start
        share = structural_share(_rows(made[key])) or 0.0
        results[key] = {
            "tasks": len(made[key]),
            "wall_s": round(wall, 1),
            "structural_duplicate_pct": round(100 * share, 2),
            "distinct_operators": len({op for t in made[key] for op in t.ops}),
            "dim_forms": dict(dim_forms((t.code for t in made[key]), args.dims)),
            "keywords": keyword_shares([t.code for t in made[key]], args.calls),
        }
        print(
            f"{args.setting}={key}: {len(made[key])} tasks in {wall:.1f} s, "
            f"{results[key]['distinct_operators']} distinct operators, "
            f"structural duplicates {100 * share:.2f}%"
        )
    first, second = configs
    results["changes"] = changes(made[first], made[second])
    print(
        "position by position: {same_ops} of {compared} keep their op sequence, "
        "{same_code} their code".format(**results["changes"])
    )
    reference = shared_file(OPS6K)
    if (args.calls or args.dims) and reference is not None:
        codes = pl.read_parquet(reference, columns=["code"])["code"].to_list()
        results["ops6k_dim_forms"] = dict(dim_forms(codes, args.dims))
        results["ops6k_keywords"] = keyword_shares(codes, args.calls)
    forms = {key: results[key]["dim_forms"] for key in configs}
    if "ops6k_dim_forms" in results:
        forms["ops6k"] = results["ops6k_dim_forms"]
    for key, counted in forms.items() if args.dims else ():
        top = ", ".join(f"{form} {count}" for form, count in Counter(counted).most_common(6))
        print(f"dim of {' / '.join(args.dims)} ({key}): {top}")
    sets = {key: results[key]["keywords"] for key in configs}
    if "ops6k_keywords" in results:
        sets["ops6k"] = results["ops6k_keywords"]
    for name in args.calls:
        for key, shares in sets.items():
            passed = ", ".join(f"{k} {v:g}" for k, v in shares[name].items() if k != "calls")
            print(f"keywords of {name} ({key}, {shares[name]['calls']} calls): {passed or '-'}")
    return results


def _configs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, ComposeConfig]:
    """The two configs compared, keyed by the values as given (``false``/``true`` for a
    boolean setting without ``--values``); a bad setting or value is the parser's error."""
    field = ComposeConfig.model_fields.get(args.setting)
    if field is None:
        parser.error(f"--setting {args.setting!r} is not a [compose] setting")
    values = args.values
    if values is None:
        if field.annotation is not bool:
            parser.error(f"--setting {args.setting!r} is not boolean: give --values A B")
        values = ["false", "true"]
    if values[0] == values[1]:
        parser.error("--values must differ")
    configs = {}
    for raw in values:
        try:
            configs[raw] = ComposeConfig(**{args.setting: raw, "profile": args.profile})
        except ValidationError as exc:
            parser.error(f"--values {raw!r}: {exc.errors()[0]['msg']}")
    return configs


if __name__ == "__main__":
    main()
