"""The ``opsynth`` command line. Every user error is one line on stderr and exit code 2."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from opsynth.config import ConfigError, RunConfig, load_config
from opsynth.filters.pool import PoolError
from opsynth.flows.cli_common import (
    UserError,
    console,
    fail,
    print_funnel,
    resolve_device,
    start_prefect,
    with_unsafe,
)
from opsynth.flows.runners import RunnerError
from opsynth.funnel import funnel_rows
from opsynth.store import (
    COMPLETE,
    FINISHED,
    STOPPED,
    RunDir,
    RunDirError,
    read_verdicts,
    write_tasks,
)

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Regenerate and extend CUDA-Agent-Ops-6K.",
)
# `opsynth run --time-limit` stopped at a chunk boundary: not an error, not finished either.
EXIT_STOPPED = 3

RunnerOption = Annotated[
    str | None,
    typer.Option("--runner", help="local | dask: where filter shards run [runner]"),
]
RunnerAddressOption = Annotated[
    str | None,
    typer.Option("--runner-address", help="existing Dask cluster; empty = start one"),
]
UnsafeOption = Annotated[
    bool,
    typer.Option(
        "--unsafe",
        help="run untrusted task code without the bubblewrap sandbox if it is unusable "
        "[filters.allow_unsafe]",
    ),
]


@app.command()
def run(
    out: Annotated[Path, typer.Option("--out", help="run directory (created if missing)")] = Path(
        "runs/default"
    ),
    config: Annotated[Path | None, typer.Option("--config", help="TOML config file")] = None,
    target: Annotated[int | None, typer.Option("--target", help="accepted tasks wanted")] = None,
    device: Annotated[str, typer.Option("--device", help="auto | cpu | cuda")] = "auto",
    runner: RunnerOption = None,
    runner_address: RunnerAddressOption = None,
    unsafe: UnsafeOption = False,
    time_limit: Annotated[
        float | None,
        typer.Option(
            "--time-limit",
            help="seconds this invocation may take: no candidate starts that would not end by "
            "then, judged by how long this invocation's jobs took (the two-stage path: no chunk "
            "that would end later); the run writes what it has and a re-run resumes",
        ),
    ] = None,
    drop_rechecked: Annotated[
        Path | None,
        typer.Option(
            "--drop-rechecked",
            help="an `opsynth audit` of OUT's accepted.parquet: the rows it rejected are "
            "recorded in OUT and left out of this and every later export, rows past the target "
            "taking their places",
        ),
    ] = None,
) -> None:
    """Regenerate a task set into OUT; re-running resumes and recomputes nothing finished."""
    stop_at = None if time_limit is None else time.time() + time_limit
    try:
        if time_limit is not None and time_limit <= 0:
            raise UserError(f"--time-limit must be positive, got {time_limit:g}")
        if drop_rechecked is not None:
            _drop_rechecked(out, drop_rechecked)
        cfg = with_unsafe(_with_runner(load_config(config), runner, runner_address), unsafe)
        if target is not None:
            if target < 1:
                raise UserError(f"--target must be at least 1, got {target}")
            cfg = cfg.with_overrides(target=target)
        resolved = resolve_device(device if device != "auto" else cfg.filters.device, cfg.runner)
        run_dir = RunDir.create(out)
        manifest = _run_flow(run_dir, cfg, resolved, stop_at)
    except (ConfigError, RunDirError, UserError, RunnerError, PoolError) as exc:
        fail(str(exc))
        return
    counts = manifest["counts"]
    print_funnel(manifest["funnel"], f"funnel ({resolved})")
    Console().print(
        f"accepted {counts['accepted']} / target {cfg.target} from {counts['candidates']} "
        f"candidates -> {out / 'accepted.parquet'}"
    )
    if manifest.get("publish", {}).get("error"):
        console.print(f"[yellow]warning:[/] not published: {manifest['publish']['error']}")
    if manifest["status"] == STOPPED:
        console.print(stopped_line(manifest, time_limit, cfg.target))
        raise typer.Exit(EXIT_STOPPED)
    if manifest["status"] != COMPLETE:
        dropped = manifest.get("rechecked_dropped") or 0
        fix = (
            f"the {dropped} rows re-checks dropped outnumber the rows past the target"
            if dropped
            else "raise max_rounds or compose.oversample"
        )
        console.print(
            f"[yellow]warning:[/] only {counts['accepted']} of {cfg.target} accepted after "
            f"{cfg.max_rounds} rounds; {fix}"
        )
        raise typer.Exit(1)


def _drop_rechecked(out: Path, audit: Path) -> None:
    from opsynth.rechecked import RecheckError, record_rechecked

    try:
        new, total = record_rechecked(RunDir.open_existing(out), audit)
    except RecheckError as exc:
        raise UserError(str(exc)) from None
    console.print(f"{new} more rows the re-check {audit} rejected are dropped ({total} in all)")


def _with_runner(cfg: RunConfig, kind: str | None, address: str | None) -> RunConfig:
    """The config with ``--runner`` / ``--runner-address`` applied (validated as config)."""
    values = {k: v for k, v in (("kind", kind), ("address", address)) if v is not None}
    if not values:
        return cfg
    try:
        return cfg.with_section("runner", **values)
    except ValueError as exc:
        raise UserError(f"--runner must be local or dask, not {kind!r}") from exc


def _progress_bar():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )


def _progress_callback(bar):
    """One bar per stage on a terminal; elsewhere (a log, a pipe), where a bar shows nothing
    until it ends, a plain line when a stage starts, at most every ``LINE_EVERY_S`` while it
    runs, and when it is done."""
    ids: dict[str, int] = {}
    base: dict[str, int] = {}
    printed: dict[str, float] = {}

    def progress(stage: str, done: int, total: int) -> None:
        # each shard reports done/total of its own; accumulate into one bar per stage
        if stage not in ids:
            ids[stage] = bar.add_task(stage, total=0)
            base[stage] = 0
        if done == 0:
            base[stage] = int(bar.tasks[ids[stage]].completed)
        completed, whole = base[stage] + done, max(base[stage] + total, 1)
        bar.update(ids[stage], completed=completed, total=whole)
        if not console.is_terminal:
            now = time.monotonic()
            due = now - printed.get(stage, -LINE_EVERY_S) >= LINE_EVERY_S
            if stage not in printed or completed >= whole or due:
                printed[stage] = now
                console.print(f"{stage}: {completed}/{whole}", highlight=False)

    return progress


LINE_EVERY_S = 10.0


def _starting(what: str, run_dir: RunDir, device: str) -> None:
    """The first line a long command prints, before Prefect's server starts: one line
    whatever the path's length (``soft_wrap``: a log holds it whole, a terminal wraps it)."""
    console.print(
        f"{what} -> {run_dir.root} on {device}: starting Prefect's local server",
        highlight=False,
        soft_wrap=True,
    )


def stopped_line(manifest: dict, time_limit: float, target: int) -> str:
    """What a run stopped by its time limit says: how far it got, the settled jobs a part-done
    chunk keeps in its journal (in no count until the chunk ends), and how to go on."""
    return (
        f"[yellow]stopped[/] at the time limit ({time_limit:g} s) with "
        f"{manifest['counts']['accepted']} of {target} accepted{_journal_part(manifest)}; "
        "re-run to resume"
    )


def _run_flow(run_dir: RunDir, cfg: RunConfig, device: str, stop_at: float | None) -> dict:
    _starting("opsynth run", run_dir, device)
    start_prefect(run_dir)
    from opsynth.flows.regenerate import regenerate
    from opsynth.flows.runners import LocalOnly, task_runner

    engine = task_runner(cfg.runner, device, cfg.filters)
    flow = regenerate.with_options(task_runner=engine) if engine is not None else regenerate
    with _progress_bar() as bar:
        return flow(str(run_dir.root), cfg, device, LocalOnly(_progress_callback(bar)), stop_at)


@app.command()
def audit(
    input: Annotated[str, typer.Option("--input", help="Ops-6K-shaped parquet or Hub id")],
    out: Annotated[Path, typer.Option("--out", help="audit directory")] = Path("runs/audit"),
    sample: Annotated[int | None, typer.Option("--sample", help="audit a seeded sample")] = None,
    seed: Annotated[int, typer.Option("--seed", help="sample seed")] = 0,
    config: Annotated[Path | None, typer.Option("--config", help="TOML config file")] = None,
    device: Annotated[str, typer.Option("--device", help="auto | cpu | cuda")] = "auto",
    runner: RunnerOption = None,
    runner_address: RunnerAddressOption = None,
    unsafe: UnsafeOption = False,
    time_limit: Annotated[
        float | None,
        typer.Option(
            "--time-limit",
            help="seconds this invocation may take: no task starts that would not end by "
            "then; the audit writes what it has checked and a re-run resumes",
        ),
    ] = None,
    reuse: Annotated[
        Path | None,
        typer.Option(
            "--reuse",
            help="an earlier audit with the same config and device: its verdicts on the "
            "tasks it checked are taken as they are, only the others are checked (dedup "
            "covers every task); e.g. a re-check after rows were replaced",
        ),
    ] = None,
) -> None:
    """Run the filters, decontamination and dedup over an existing task set."""
    stop_at = None if time_limit is None else time.time() + time_limit
    try:
        if time_limit is not None and time_limit <= 0:
            raise UserError(f"--time-limit must be positive, got {time_limit:g}")
        cfg = with_unsafe(_with_runner(load_config(config), runner, runner_address), unsafe)
        resolved = resolve_device(device if device != "auto" else cfg.filters.device, cfg.runner)
        if reuse is not None:
            _check_reuse(reuse, cfg, resolved)
        run_dir = RunDir.create(out)
        tasks_file = run_dir.path("input.parquet")
        write_tasks(_load_input(input, sample, seed), tasks_file)
        _starting("opsynth audit", run_dir, resolved)
        start_prefect(run_dir)
        from opsynth.flows.audit import audit as audit_flow
        from opsynth.flows.runners import LocalOnly, task_runner

        engine = task_runner(cfg.runner, resolved, cfg.filters)
        flow = audit_flow.with_options(task_runner=engine) if engine is not None else audit_flow
        with _progress_bar() as bar:
            progress = LocalOnly(_progress_callback(bar))
            manifest = flow(
                str(run_dir.root),
                cfg,
                str(tasks_file),
                resolved,
                input,
                progress,
                stop_at,
                None if reuse is None else str(reuse),
            )
    except (ConfigError, RunDirError, UserError, RunnerError, PoolError) as exc:
        fail(str(exc))
        return
    print_funnel(manifest["funnel"], f"audit of {input} ({resolved})")
    counts = manifest["counts"]
    Console().print(
        f"{manifest['input_rows']} rows, {manifest['unique_rows']} unique, "
        f"{counts['candidates']} checked: kept {counts['accepted']}, rejected "
        f"{counts['rejected']} -> {out}/accepted.parquet, {out}/verdicts.parquet"
    )
    if manifest["status"] == STOPPED:
        console.print(audit_stopped_line(manifest, time_limit))
        raise typer.Exit(EXIT_STOPPED)


def _check_reuse(reuse: Path, cfg: RunConfig, device: str) -> None:
    """One line, before anything starts, when ``--reuse`` names no audit of this config."""
    from opsynth.rechecked import RecheckError, check_reusable
    from opsynth.rundata import load_run

    try:
        check_reusable(load_run(reuse, partial=True), cfg.config_hash(), device)
    except RecheckError as exc:
        raise UserError(str(exc)) from None


def audit_stopped_line(manifest: dict, time_limit: float) -> str:
    """What an audit stopped by its time limit says: how many of its unique tasks are checked,
    the settled jobs a part-done chunk keeps in its journal, and how to go on."""
    return (
        f"[yellow]stopped[/] at the time limit ({time_limit:g} s) with "
        f"{manifest['counts']['candidates']} of {manifest['unique_rows']} unique tasks checked"
        f"{_journal_part(manifest)}; re-run with the same --input to resume"
    )


def _journal_part(manifest: dict) -> str:
    """The settled jobs a part-done chunk keeps in its journal, in no count until it ends, and
    what it leaves to the next invocation (``ChunkStopped.left``)."""
    journaled = manifest.get("journaled_jobs") or 0
    kept = f"; {journaled} settled jobs of a part-done chunk kept in its journal" * bool(journaled)
    left = (manifest.get("invocations") or [{}])[-1].get("left_mid_chunk") or {}
    words = {
        "candidates_not_started": "candidates not started",
        "jobs_not_retried": "set-aside jobs not retried",
        "jobs_abandoned": "jobs abandoned past the limit",
    }
    parts = [f"{left[key]} {text}" for key, text in words.items() if left.get(key)]
    return kept + (f" (left to the next invocation: {', '.join(parts)})" if parts else "")


def _load_input(input: str, sample: int | None, seed: int) -> list:
    from opsynth.flows.inputs import AuditInputError, load_input, sample_tasks

    if sample is not None and sample < 1:
        raise UserError(f"--sample must be at least 1, got {sample}")
    try:
        return sample_tasks(load_input(input), sample, seed)
    except AuditInputError as exc:
        raise UserError(str(exc)) from exc


def _pure_stage(input: str, out: Path, sample: int | None, seed: int, config, stage) -> None:
    """Load a set, run ``stage(tasks, cfg) -> (StepResult, title)`` on it (no task code runs),
    write kept rows, dropped rows and every verdict, and print the counts table."""
    from opsynth.store import write_tasks, write_verdicts

    try:
        cfg = load_config(config)
        result, title = stage(_load_input(input, sample, seed), cfg)
        run_dir = RunDir.create(out)
        write_tasks(result.kept, run_dir.path("kept.parquet"))
        write_tasks(result.dropped, run_dir.path("dropped.parquet"))
        write_verdicts(result.verdicts, run_dir.path("verdicts.parquet"))
    except (ConfigError, RunDirError, UserError) as exc:
        fail(str(exc))
        return
    print_funnel(funnel_rows(result.verdicts), title)
    Console().print(f"kept {len(result.kept)}, dropped {len(result.dropped)} -> {out}")


InputOption = Annotated[str, typer.Option("--input", help="Ops-6K-shaped parquet or Hub id")]
SampleOption = Annotated[int | None, typer.Option("--sample", help="a seeded sample")]
SeedOption = Annotated[int, typer.Option("--seed", help="sample seed")]
ConfigOption = Annotated[Path | None, typer.Option("--config", help="TOML config file")]


@app.command()
def decontam(
    input: InputOption,
    out: Annotated[Path, typer.Option("--out", help="output directory")] = Path("runs/decontam"),
    sample: SampleOption = None,
    seed: SeedOption = 0,
    config: ConfigOption = None,
) -> None:
    """Drop tasks whose Model class is too similar to a KernelBench problem (no execution)."""

    def stage(tasks, cfg):
        from opsynth.ast_dedup.decontam import decontaminate_tasks

        title = f"decontam of {input} (threshold {cfg.decontam.threshold})"
        return decontaminate_tasks(tasks, cfg.decontam), title

    _pure_stage(input, out, sample, seed, config, stage)


@app.command()
def dedup(
    input: InputOption,
    out: Annotated[Path, typer.Option("--out", help="output directory")] = Path("runs/dedup"),
    sample: SampleOption = None,
    seed: SeedOption = 0,
    config: ConfigOption = None,
) -> None:
    """Drop exact, near and structural duplicates within a set; one representative each."""

    def stage(tasks, cfg):
        from opsynth.ast_dedup.dedup import dedup as dedup_tasks

        return dedup_tasks(tasks, cfg.dedup), f"dedup of {input}"

    _pure_stage(input, out, sample, seed, config, stage)


@app.command()
def status(out: Annotated[Path, typer.Argument(help="a run directory")]) -> None:
    """Show a run's funnel so far (works while the run is going, from finished work files)."""
    try:
        run_dir = RunDir.open_existing(out)
        manifest = run_dir.read_manifest()
        if "funnel" in manifest and manifest.get("status") in (*FINISHED, STOPPED):
            rows = manifest["funnel"]
        else:
            verdicts = []
            for path in sorted((run_dir.root / "work").glob("*.parquet")):
                if path.name.startswith(("prefilter-", "filter-")):
                    verdicts += read_verdicts(path)
            rows = funnel_rows(verdicts)
    except RunDirError as exc:
        fail(str(exc))
        return
    print_funnel(rows, f"{out}: {manifest.get('status', 'unknown')}")
    counts = manifest.get("counts")
    if counts:
        Console().print(", ".join(f"{k} {v}" for k, v in counts.items()))


from opsynth.flows.cli_compose import compose  # noqa: E402  (registered here, defined on its own)

app.command(name="compose")(compose)

from opsynth.flows.cli_seeds import seeds_app  # noqa: E402  (registered here, defined on its own)

app.add_typer(seeds_app, name="seeds")

from opsynth.flows.cli_publish import publish, report  # noqa: E402  (registered here, defined on its own)

app.command(name="publish")(publish)
app.command(name="report")(report)

from opsynth.flows.cli_eval import evaluate  # noqa: E402  (registered here, defined on its own)

app.command(name="eval")(evaluate)

from opsynth.flows.cli_rollout import rft, rollout  # noqa: E402  (registered here, defined on its own)

app.command(name="rollout")(rollout)
app.command(name="rft")(rft)

from opsynth.flows.cli_refdata import refdata_app  # noqa: E402  (registered here, defined on its own)

app.add_typer(refdata_app, name="refdata")

from opsynth.flows.cli_train import train_app  # noqa: E402  (registered here, defined on its own)

app.add_typer(train_app, name="train")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        console.print("interrupted; re-run the same command to resume")
        sys.exit(130)


if __name__ == "__main__":
    main()
