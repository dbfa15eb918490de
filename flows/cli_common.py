"""What the ``opsynth`` commands share: the one-line user error, the device they run on, the
funnel table, the sandbox refusal and Prefect's start. Both ``flows/cli.py`` and the
``flows/cli_*.py`` command modules import it; it imports none of them."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from opsynth.config import RunConfig, RunnerConfig
from opsynth.filters.pool import isolation_problem
from opsynth.filters.pool import resolve_device as resolve_here
from opsynth.store import RunDir

console = Console(stderr=True)
DEVICES = ("auto", "cpu", "cuda")


class UserError(Exception):
    """Raised for problems the user can fix; printed as one line."""


def fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def resolve_device(requested: str, runner: RunnerConfig | None = None) -> str:
    """The device the filters run on. Asked of this host's torch, except ``cuda`` with a
    cluster at an address: its workers have the GPUs, and this host runs no candidate."""
    if requested not in DEVICES:
        raise UserError(f"unknown device {requested!r}; use one of {', '.join(DEVICES)}")
    if requested == "cuda" and runner is not None and runner.kind != "local" and runner.address:
        return requested
    try:
        return resolve_here(requested)
    except ValueError as exc:
        raise UserError(f"--device {requested}: {exc}") from None


def print_funnel(manifest_funnel: list[dict], title: str) -> None:
    table = Table(title=title)
    for col in ("stage", "entered", "passed", "rejected"):
        table.add_column(col, justify="left" if col == "stage" else "right")
    table.add_column("top reasons")
    for row in manifest_funnel:
        reasons = sorted(row["reasons"].items(), key=lambda kv: -kv[1])[:3]
        table.add_row(
            row["stage"],
            str(row["entered"]),
            str(row["passed"]),
            str(row["entered"] - row["passed"]),
            ", ".join(f"{r} {n}" for r, n in reasons),
        )
    Console().print(table)


def with_unsafe(cfg: RunConfig, unsafe: bool) -> RunConfig:
    """The config with ``--unsafe`` applied; without it, a run that could only execute task
    code unsandboxed is refused here, before anything is computed (an existing cluster's
    workers may have a sandbox this host lacks: their pools decide)."""
    if unsafe:
        return cfg.with_section("filters", allow_unsafe=True)
    if cfg.runner.kind != "local" and cfg.runner.address:
        return cfg
    why = isolation_problem(cfg.filters)
    if why:
        raise UserError(why)
    return cfg


def start_prefect(run_dir: RunDir) -> None:
    from opsynth.flows.prefect_env import attach_log_file, configure_prefect

    configure_prefect(run_dir.root.resolve() / ".prefect")
    import prefect  # noqa: F401  (settings are read now, after configure_prefect)

    attach_log_file(run_dir.root / "prefect.log")
