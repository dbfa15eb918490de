"""``opsynth refdata``: where the read-only reference data is, and fetching it from the Hub.

The benchmarks, the tests, the index builder and report references read KernelBench's
problems and the released Ops-6K (``opsynth.refdata``). A checkout beside ``../shared`` has
them; anywhere else ``opsynth refdata fetch`` writes the Hub's copies into the user cache,
where they are found next. Errors are one line and exit code 2, like the rest of the CLI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from opsynth.refdata import KERNELBENCH_HUB, OPS6K_HUB

refdata_app = typer.Typer(
    no_args_is_help=True, help="Reference data (KernelBench, Ops-6K): where it is, fetch it."
)


@refdata_app.command("where")
def where() -> None:
    """Print the folder the reference data is read from, and which files it holds."""
    from opsynth.refdata import KERNELBENCH, OPS6K, shared_dir, user_shared_dir

    found = shared_dir()
    console = Console()
    if found is None:
        console.print(
            f"no reference data: set OPSYNTH_SHARED, put shared/ beside the checkout, or run "
            f"`opsynth refdata fetch` (into {user_shared_dir()})",
            highlight=False,
        )
        return
    for relative in (KERNELBENCH, OPS6K):
        state = "present" if (found / relative).is_file() else "missing"
        console.print(f"{found / relative}: {state}", highlight=False)


@refdata_app.command("fetch")
def fetch(
    to: Annotated[
        Path | None, typer.Option("--to", help="folder to write into; default: the user cache")
    ] = None,
    kernelbench: Annotated[
        str, typer.Option("--kernelbench", help="KernelBench's Hub dataset id")
    ] = KERNELBENCH_HUB,
    ops6k: Annotated[str, typer.Option("--ops6k", help="Ops-6K's Hub dataset id")] = OPS6K_HUB,
) -> None:
    """Download KernelBench's problems (every level) and the released Ops-6K from the Hub (or
    HF_ENDPOINT) into the user cache, where the tests, benchmarks and reports look for them."""
    from opsynth.flows.cli_common import fail
    from opsynth.flows.hub_data import HubLoadError, load_hub_dataset
    from opsynth.refdata import kernelbench_rows, user_shared_dir, write_kernelbench, write_ops6k

    base = to or user_shared_dir()
    console = Console()
    try:
        splits = load_hub_dataset(kernelbench, split=None)
        rows = [r for name, split in splits.items() for r in kernelbench_rows(split, name)]
        console.print(f"{write_kernelbench(rows, base)}: {len(rows)} problems", highlight=False)
        table = load_hub_dataset(ops6k, split="train")
        written = write_ops6k(table, base)
        console.print(f"{written}: {len(table)} tasks", highlight=False)
    except (HubLoadError, ValueError) as exc:
        fail(f"refdata fetch: {exc}")
