"""Throughput of decontamination and dedup on this machine; prints its figures.

1. Exact nearest-KernelBench similarity (levels 1-3, 250 problems) for every Ops-6K row, with
   the distribution of the maximum similarity (target: < 60 s on 2 cores).
2. Thresholded decontamination + dedup of 100,000 candidates synthesised from Ops-6K rows (1%
   from KernelBench problems, to be dropped) with perturbations (renamed variables,
   reformatting, an extra forward statement, reordered ``__init__`` statements, comments,
   changed batch size) (target: < 60 s on 2 cores).

Usage: ``python -m benchmarks.bench_decontam [--ops6k PATH] [--candidates N] [--workers N]``.
Reference data is looked up as ``opsynth.refdata`` says (``$OPSYNTH_SHARED``, ``shared/``
in or beside the checkout). The machine's load average is printed: the figures are wall-clock
times and scale with how much of the 2 cores other processes leave.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from opsynth.ast_dedup.decontam import decontaminate_tasks
from opsynth.ast_dedup.dedup import dedup
from opsynth.ast_dedup.index import KernelBenchIndex
from opsynth.ast_dedup.nearest import nearest_kernelbench
from opsynth.ast_dedup.screen import screen
from opsynth.config import DecontamConfig, DedupConfig
from opsynth.record import Task
from opsynth.refdata import KERNELBENCH, OPS6K, shared_file


def load_ops6k(path: Path) -> list[Task]:
    table = pq.read_table(path, columns=["ops", "data_source", "code"]).to_pylist()
    tasks = []
    for row in table:
        ops = row["ops"]
        ops = json.loads(ops) if ops.startswith("[") else [ops]
        tasks.append(Task(ops=ops, data_source=row["data_source"], code=row["code"]))
    return tasks


def kernelbench_tasks() -> list[Task]:
    path = shared_file(KERNELBENCH)
    if path is None:
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [
        Task(ops=[r["name"]], data_source="kernelbench", code=r["code"])
        for r in rows
        if r["level"] <= 3
    ]


def histogram(values: list[float], edges: list[float]) -> str:
    counts, _ = np.histogram(values, bins=edges)
    width = max(1, max(counts))
    lines = []
    for lo, hi, n in zip(edges[:-1], edges[1:], counts, strict=True):
        bar = "#" * int(round(40 * n / width))
        lines.append(f"  [{lo:.1f}, {min(hi, 1.0):.1f}{']' if hi > 1 else ')'} {n:6d} {bar}")
    return "\n".join(lines)


# -- candidate synthesis ---------------------------------------------------------------------


class _Renamer(ast.NodeTransformer):
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.Name:
        if node.id in self.names:
            node.id = f"{node.id}_r"
        return node

    def visit_arg(self, node: ast.arg) -> ast.arg:
        if node.arg in self.names and node.arg != "self":
            node.arg = f"{node.arg}_r"
        return node


def _model(tree: ast.Module) -> ast.ClassDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def variants(code: str) -> list[str]:
    """The code itself, plus renamed, extra-statement and reordered versions (unparsed, so
    also reformatted)."""
    out = [code]
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return out
    stored = {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    stored |= {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)}
    renamed = _Renamer(stored - {"self"}).visit(ast.parse(code))
    out.append(ast.unparse(renamed))
    model = _model(tree)
    if model is None:
        return out
    forward = _method(model, "forward")
    if forward is not None and len(forward.args.args) > 1:
        extra = ast.parse(code)
        fwd = _method(_model(extra), "forward")
        x = fwd.args.args[1].arg
        fwd.body.insert(0, ast.parse(f"{x} = {x} * 1.0").body[0])
        out.append(ast.unparse(extra))
    init = _method(model, "__init__")
    if init is not None and len(init.body) >= 3:
        swapped = ast.parse(code)
        body = _method(_model(swapped), "__init__").body
        body[1], body[2] = body[2], body[1]
        out.append(ast.unparse(swapped))
    return out


_BATCH = re.compile(r"^batch_size\s*=\s*\d+", re.MULTILINE)


def synthesise(
    tasks: list[Task], n: int, contaminated: list[Task] = (), seed: int = 0
) -> list[Task]:
    """``n`` candidates: Ops-6K rows, 1% of them replaced by KernelBench problems (which
    decontamination must drop), each in a random variant with random text edits."""
    rng = random.Random(seed)
    pool = [(t, variants(t.code)) for t in tasks]
    bad = [(t, variants(t.code)) for t in contaminated]
    out = []
    for i in range(n):
        source = bad if bad and rng.random() < 0.01 else pool
        task, codes = source[rng.randrange(len(source))]
        code = codes[rng.randrange(len(codes))]
        if rng.random() < 0.5:
            code = f"# candidate {i}\n{code}"
        if rng.random() < 0.3:
            code = code.replace(
                "class Model(", f"# variant {rng.randrange(10**6)}\nclass Model(", 1
            )
        if rng.random() < 0.5:
            code = _BATCH.sub(f"batch_size = {rng.choice([8, 16, 32, 64, 128, 256])}", code, 1)
        if rng.random() < 0.2:
            code = code.replace("\ndef ", "\n\n\ndef ")
        out.append(
            Task(ops=task.ops, data_source=task.data_source, code=code, meta={"synthetic": i})
        )
    return out


# -- benchmarks ------------------------------------------------------------------------------


def bench_nearest(tasks: list[Task], index: KernelBenchIndex, workers: int) -> None:
    codes = [t.code for t in tasks]
    start = time.perf_counter()
    results = nearest_kernelbench(codes, index, levels=(1, 2, 3), workers=workers)
    elapsed = time.perf_counter() - start
    sims = [r.similarity for r in results if r.ok]
    bad = Counter(r.reason for r in results if not r.ok)
    scored = np.mean([r.scored for r in results if r.ok])
    top = max((r for r in results if r.ok), key=lambda r: r.similarity)
    print(f"exact nearest KernelBench L1-3 for {len(codes)} Ops-6K rows: {elapsed:.1f} s")
    print(f"  exact pair scores per row: {scored:.1f} of {len(index.select((1, 2, 3)))}")
    print(f"  unscoreable rows: {dict(bad) or 0}")
    print(
        f"  max similarity {top.similarity:.4f} (L{top.level}/{top.problem_id} {top.name}); "
        f"mean {np.mean(sims):.4f}, median {np.median(sims):.4f}, "
        f"rows > 0.9: {sum(s > 0.9 for s in sims)}"
    )
    print("  distribution of the max similarity:")
    print(histogram(sims, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0001]))


def bench_pipeline(tasks: list[Task], n: int, workers: int, separate: bool) -> None:
    start = time.perf_counter()
    candidates = synthesise(tasks, n, kernelbench_tasks())
    print(f"\nsynthesised {len(candidates)} candidates in {time.perf_counter() - start:.1f} s")
    print(f"  distinct code strings: {len({c.code for c in candidates})}")
    decon_cfg = DecontamConfig(exact_max=False, workers=workers)
    dedup_cfg = DedupConfig(workers=workers)
    start = time.perf_counter()
    decon, dd = screen(candidates, decon_cfg, dedup_cfg)
    elapsed = time.perf_counter() - start
    print(
        f"thresholded decontamination + dedup of {len(candidates)} candidates "
        f"(ast_dedup.screen, one parse per distinct code): {elapsed:.1f} s"
    )
    exact = sum(v.measures["kb_similarity_exact"] for v in decon.verdicts)
    print(f"  decontam: {dict(decon.counts)}; rows with an exact max similarity: {exact}")
    print(f"  dedup:    {dict(dd.counts)}")
    if separate:
        start = time.perf_counter()
        alone = decontaminate_tasks(candidates, decon_cfg)
        middle = time.perf_counter()
        dedup(alone.kept, dedup_cfg)
        end = time.perf_counter()
        print(
            f"  as separate stages: decontaminate_tasks {middle - start:.1f} s + "
            f"dedup {end - middle:.1f} s = {end - start:.1f} s"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ops6k", type=Path, default=None)
    parser.add_argument("--candidates", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=0, help="0 = every core")
    parser.add_argument(
        "--separate",
        action="store_true",
        help="also time decontaminate_tasks and dedup as separate stages (each parses)",
    )
    args = parser.parse_args()
    ops6k = args.ops6k or shared_file(OPS6K)
    if ops6k is None:
        print("Ops-6K parquet not found; pass --ops6k or set OPSYNTH_SHARED", file=sys.stderr)
        return 2
    tasks = load_ops6k(ops6k)
    index = KernelBenchIndex.load()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"machine: {os.cpu_count()} cores, load average {load}; workers={args.workers or 'all'}")
    bench_nearest(tasks, index, args.workers)
    bench_pipeline(tasks, args.candidates, args.workers, args.separate)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
