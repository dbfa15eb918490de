"""``opsynth seeds``: list seed libraries, extract their catalogue, report Ops-6K coverage.

Extraction needs no Prefect: every library runs in its own subprocess with a deadline
(``synth.catalog.extract``). Errors are one line and exit code 2, like the rest of the CLI.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from opsynth.config import ConfigError, load_config

seeds_app = typer.Typer(
    no_args_is_help=True, help="Seed libraries: list, extract the catalogue, coverage."
)
ConfigOption = Annotated[Path | None, typer.Option("--config", help="TOML config file")]


def fail(message: str) -> None:
    from opsynth.flows.cli_common import fail

    fail(message)


def _reference(path: Path | None) -> Path | None:
    from opsynth.refdata import OPS6K, shared_file

    if path is not None and not path.is_file():
        raise ValueError(f"reference {path} does not exist; pass the released Ops-6K parquet")
    return path or shared_file(OPS6K)


def _print_summary(libraries: dict, title: str) -> None:
    table = Table(title=title)
    for col in ("library", "runnable", "rejected", "families", "seconds", "status"):
        table.add_column(col, justify="left" if col in ("library", "status") else "right")
    for name, row in libraries.items():
        table.add_row(
            name,
            str(row["runnable"]),
            str(row["rejected"]),
            str(row["families"] or ""),
            f"{row['elapsed_s']:.1f}",
            row["status"],
        )
    Console().print(table)


def _print_coverage(cov: dict) -> None:
    for part in ("torch", "transformers"):
        row = cov[part]
        Console().print(
            f"{part}: {row['covered']}/{row['reference']} Ops-6K names runnable "
            f"({100 * row['fraction']:.1f}%), {len(row['misses'])} missed"
        )


@seeds_app.command("list")
def list_libraries(
    config: ConfigOption = None,
    catalogue: Annotated[
        Path | None, typer.Option("--catalogue", help="an extract --out directory, for counts")
    ] = None,
) -> None:
    """Known seed libraries (built-in, entry points, config) and, given a catalogue, counts."""
    from opsynth.synth.catalog.plugins import known_libraries

    try:
        cfg = load_config(config)
        counts = {}
        if catalogue is not None:
            summary = catalogue / "summary.json"
            if not summary.is_file():
                raise ValueError(f"{catalogue} has no summary.json; run `opsynth seeds extract`")
            counts = json.loads(summary.read_text())
    except (ConfigError, ValueError) as exc:
        fail(str(exc))
        return
    table = Table(title="seed libraries")
    for col in ("library", "origin", "adapter", "runnable", "rejected"):
        table.add_column(col)
    for name, (ref, origin) in sorted(known_libraries(cfg.seeds).items()):
        row = counts.get(name, {})
        table.add_row(name, origin, ref, str(row.get("runnable", "")), str(row.get("rejected", "")))
    Console().print(table)


@seeds_app.command()
def extract(
    library: Annotated[
        list[str] | None, typer.Option("--library", help="library to extract (repeatable)")
    ] = None,
    out: Annotated[Path, typer.Option("--out", help="output directory")] = Path("runs/seeds"),
    config: ConfigOption = None,
    reference: Annotated[
        Path | None, typer.Option("--reference", help="released Ops-6K parquet, for coverage")
    ] = None,
) -> None:
    """Discover, run and write seeds: seeds.parquet, verdicts.parquet, reasons.csv."""
    from opsynth.synth.catalog.extract import extract as run_extract
    from opsynth.synth.catalog.plugins import resolve_names
    from opsynth.synth.catalog.report import write_catalogue

    try:
        cfg = load_config(config)
        names = list(library or cfg.seeds.libraries)
        resolve_names(names, cfg.seeds)
        ref = _reference(reference)
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out} is a file, not a directory; pass a directory path")
    except (ConfigError, ValueError) as exc:
        fail(str(exc))
        return
    result = write_catalogue(out, run_extract(names, cfg.seeds), ref)
    _print_summary(result["libraries"], f"seed catalogue -> {out}")
    if "coverage" in result:
        _print_coverage(result["coverage"])


@seeds_app.command()
def coverage(
    catalogue: Annotated[Path, typer.Option("--catalogue", help="an extract --out directory")],
    reference: Annotated[
        Path | None, typer.Option("--reference", help="released Ops-6K parquet")
    ] = None,
) -> None:
    """Coverage of the released Ops-6K names by a catalogue; writes coverage.json into it."""
    from opsynth.store import RunDirError, read_tasks, read_verdicts
    from opsynth.synth.catalog.coverage import coverage as measure

    try:
        ref = _reference(reference)
        if ref is None:
            raise ValueError("no released Ops-6K parquet found; pass --reference")
        cov = measure(
            read_tasks(catalogue / "seeds.parquet"),
            read_verdicts(catalogue / "verdicts.parquet"),
            ref,
        )
    except (ValueError, RunDirError, FileNotFoundError) as exc:
        fail(str(exc))
        return
    (catalogue / "coverage.json").write_text(json.dumps(cov, indent=2))
    _print_coverage(cov)
    for part in ("torch", "transformers"):
        misses = ", ".join(f"{m['name']} ({m['reason']})" for m in cov[part]["misses"])
        Console().print(f"{part} misses: {misses or 'none'}")
