"""``opsynth publish`` (a finished run as a tagged Hub dataset version with a generated card)
and ``opsynth report`` (the audit report: tables, plots, HTML and Markdown). Both are thin:
the work is in ``opsynth.publish`` and ``opsynth.report``; neither needs Prefect.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

RunArgument = Annotated[Path, typer.Argument(help="a finished run (or audit) directory")]


def publish(
    run: RunArgument,
    repo_id: Annotated[
        str | None, typer.Option("--repo-id", help="ORG/NAME (default: the run's publish.repo_id)")
    ] = None,
    version: Annotated[
        str | None, typer.Option("--version", help="X.Y.Z, tagged vX.Y.Z (default 1.0.0)")
    ] = None,
    private: Annotated[
        bool | None, typer.Option("--private/--public", help="visibility of a new repo")
    ] = None,
    dry_run: Annotated[
        Path | None, typer.Option("--dry-run", help="write what would be pushed to DIR, no push")
    ] = None,
    recheck: Annotated[
        Path | None,
        typer.Option(
            "--recheck",
            help="a finished `opsynth audit` of RUN's accepted.parquet: the card states it",
        ),
    ] = None,
) -> None:
    """Push RUN to the Hub as one version: data configs, dataset card, config, manifest."""
    from opsynth.flows.cli_common import fail
    from opsynth.publish import PublishError, publish_run

    try:
        done = publish_run(run, repo_id, version, private, dry_run, recheck)
    except PublishError as exc:
        fail(str(exc))
        return
    export, pushed = done.export, done.pushed
    rows = ", ".join(f"{name} {n}" for name, n in export.rows.items())
    out = Console()
    out.print(f"exported {len(export.files)} files to {export.root} ({rows})", highlight=False)
    if pushed is None:
        out.print("dry run: nothing pushed", highlight=False)
    elif pushed.changed:
        out.print(f"published {pushed.tag} at {pushed.commit[:12]}: {pushed.url}", highlight=False)
    else:
        out.print(f"{pushed.tag} is already published with these files: {pushed.url}")


def report(
    run: RunArgument,
    out: Annotated[
        Path | None, typer.Option("--out", help="report directory (default: RUN/report)")
    ] = None,
    reference: Annotated[
        str | None,
        typer.Option(
            "--reference",
            help="compare with a reference set: ops6k, a profile JSON, a task parquet or ORG/NAME",
        ),
    ] = None,
    partial: Annotated[
        bool,
        typer.Option(
            "--partial",
            help="report a run its time limit stopped: its finished chunks, marked partial",
        ),
    ] = False,
) -> None:
    """Write RUN's audit report: report.html, report.md, tables/*.csv, plots/*.png; with
    --reference, also how the accepted tasks compare with that set (tables/fidelity.csv)."""
    from opsynth.flows.cli_common import fail
    from opsynth.flows.reference import ReferenceLoadError, fidelity_for
    from opsynth.report.render import write_report
    from opsynth.rundata import load_run
    from opsynth.store import RunDirError

    try:
        data = load_run(run, partial=partial)
        fidelity = fidelity_for(data, reference) if reference is not None else None
        written = write_report(data, out or run / "report", fidelity)
    except (RunDirError, ReferenceLoadError) as exc:
        fail(str(exc))
        return
    Console().print(
        f"report in {written.seconds:.1f} s: {written.html}, {written.markdown} "
        f"({len(written.tables)} tables, {len(written.plots)} plots)",
        highlight=False,
    )
