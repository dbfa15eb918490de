"""``opsynth eval``: score solutions against tasks with the bundled evaluator.

Writes ``results.jsonl`` (one score per task: reward, reason, timings, flags),
``verdicts.parquet`` (every guard/build/correctness/timing row) and ``summary.json`` (the
Table 1 metrics, per KernelBench level when scoring KernelBench) into ``--out``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from opsynth.config import ConfigError, load_config
from opsynth.store import write_verdicts


def evaluate(
    tasks: Annotated[
        Path, typer.Option("--tasks", help="a task .py, KernelBench .jsonl or dataset .parquet")
    ],
    solutions: Annotated[
        Path | None,
        typer.Option("--solutions", help="a solution (file or dir), or a dir of <task key>/"),
    ] = None,
    reference: Annotated[
        bool, typer.Option("--reference", help="score each task's own Model (sanity check)")
    ] = False,
    levels: Annotated[
        list[int] | None, typer.Option("--level", help="KernelBench levels (repeatable)")
    ] = None,
    out: Annotated[Path, typer.Option("--out", help="results directory")] = Path("runs/eval"),
    device: Annotated[str, typer.Option("--device", help="auto | cpu | cuda")] = "auto",
    config: Annotated[Path | None, typer.Option("--config", help="TOML config file")] = None,
    unsafe: Annotated[
        bool,
        typer.Option("--unsafe", help="run solutions unsandboxed if bubblewrap is unusable"),
    ] = False,
) -> None:
    """Score solutions (ModelNew + optional CUDA/C++ kernels) against their tasks."""
    from opsynth.evaluator.reward import metrics
    from opsynth.evaluator.score import score_pairs
    from opsynth.evaluator.solution import SolutionError
    from opsynth.evaluator.tasks import group_of, load_tasks, pair_up
    from opsynth.filters.pool import PoolError
    from opsynth.flows.cli_common import UserError, fail, resolve_device, with_unsafe

    try:
        cfg = with_unsafe(load_config(config), unsafe)
        if reference:
            cfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"strict": False})})
        resolved = resolve_device(device if device != "auto" else cfg.filters.device)
        pairs, missing = pair_up(load_tasks(tasks, levels), solutions, reference)
        if not pairs:
            raise UserError(f"no task under --tasks {tasks} has a solution under --solutions")
        scores, verdicts = score_pairs(pairs, cfg.eval, cfg.filters, resolved, group_of)
    except (ConfigError, SolutionError, UserError, ValueError, PoolError) as exc:
        fail(str(exc))
        return
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.jsonl", "w") as fh:
        for score in scores:
            fh.write(json.dumps(score.to_dict()) + "\n")
    write_verdicts(verdicts, out / "verdicts.parquet")
    summary = {"device": resolved, "missing_solutions": missing, "metrics": metrics(scores)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    _print(scores, summary["metrics"])
    if missing:
        Console(stderr=True).print(f"[yellow]note:[/] {len(missing)} task(s) had no solution")


def _print(scores, table_metrics) -> None:
    from opsynth.evaluator.reward import explain_flags

    # a file or a pipe gets whole rows: rich would otherwise cut them at 80 columns
    console = Console(width=None if sys.stdout.isatty() else 200)
    table = Table(title="scores")
    for col in ("task", "solution", "reward", "reason", "eager ms", "compile ms", "ours ms"):
        table.add_column(col)
    for s in scores[:50]:
        table.add_row(
            s.task_id,
            s.solution,
            str(s.reward),
            s.reason if not s.flags else f"{s.reason} (flags: {', '.join(s.flags)})",
            *(
                f"{v:.4g}" if v is not None else "-"
                for v in (s.eager_ms, s.compile_ms, s.solution_ms)
            ),
        )
    console.print(table)
    summary = Table(title="Table 1 metrics")
    keys = [
        "tasks",
        "pass_rate",
        "faster_than_eager",
        "faster_than_compile",
        "geomean_speedup_eager",
        "geomean_speedup_compile",
        "mean_reward",
        "flagged",
    ]
    summary.add_column("group")
    for key in keys:
        summary.add_column(key)
    for group, row in table_metrics.items():
        summary.add_row(group, *(str(row[k]) for k in keys))
    console.print(summary)
    flags = explain_flags(scores)
    if flags:
        console.print("flags (the reward stands; these ask for a human look):")
        for line in flags:
            console.print(f"  {line}", highlight=False, markup=False)
