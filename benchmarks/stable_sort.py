"""A run's ``compile_mismatch`` candidates that sort, as they are and with their sorts made
stable, as two task files to audit on a GPU (``compose.stable_sort``'s evidence).

    python -m benchmarks.stable_sort --run data/releases/v1.0.0/run --out /tmp/stable
    for s in as_run stable; do opsynth audit --input /tmp/stable/$s.parquet \
        --out /tmp/a_$s --config data/releases/v1.0.0/recheck.toml --device cuda; done

Each candidate keeps its run's size (its ``sizing`` record; the audit checks tasks as given).
Every ``torch.sort``/``torch.argsort`` call gets ``stable=True``, its positional literals
written by name (``dim``, ``descending``), as the composer writes them with the setting on;
a candidate with a call that cannot be rewritten so is left out of both files. Prints the
counts.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
from pathlib import Path

from opsynth.store import read_tasks, read_verdicts, write_tasks
from opsynth.synth.sorting import NAMED, SORTS, STABLE

FUNCTIONS = {target for kind, target in SORTS if kind == "function"}


def stable_source(code: str) -> str | None:
    """``code`` with every torch sort call stable; None when it has none, or one passing more
    positional literals than ``NAMED`` or a ``stable`` of its own."""
    lines = code.splitlines(keepends=True)
    edits = []
    for node in ast.walk(ast.parse(code)):
        if not (isinstance(node, ast.Call) and ast.unparse(node.func) in FUNCTIONS):
            continue
        if len(node.args) > 1 + len(NAMED) or any(k.arg == STABLE for k in node.keywords):
            return None
        named = [f"{n}={ast.unparse(a)}" for n, a in zip(NAMED, node.args[1:], strict=False)]
        rest = [ast.unparse(k) for k in node.keywords]
        call = f"{ast.unparse(node.func)}({', '.join([ast.unparse(node.args[0]), *named, *rest])}"
        edits.append((node, call + f", {STABLE}=True)"))
    if not edits:
        return None
    for node, text in sorted(edits, key=lambda e: (e[0].lineno, e[0].col_offset), reverse=True):
        if node.lineno != node.end_lineno:
            return None
        raw = lines[node.lineno - 1]
        lines[node.lineno - 1] = raw[: node.col_offset] + text + raw[node.end_col_offset :]
    return "".join(lines)


def main(argv: list[str] | None = None) -> tuple[int, int]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    mismatched = {
        v.task_id
        for v in read_verdicts(args.run / "verdicts.parquet")
        if v.reason == "compile_mismatch"
    }
    as_run, stable = [], []
    for task in read_tasks(args.run / "candidates.parquet"):
        source = stable_source(task.code) if task.id in mismatched else None
        if source is not None:
            as_run.append(task)
            stable.append(dataclasses.replace(task, code=source, id=""))
    write_tasks(as_run, args.out / "as_run.parquet")
    write_tasks(stable, args.out / "stable.parquet")
    print(f"{len(mismatched)} compile_mismatch candidates, {len(as_run)} that sort -> {args.out}")
    return len(mismatched), len(as_run)


if __name__ == "__main__":
    main()
