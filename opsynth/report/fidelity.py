"""Fidelity: how closely a run's accepted tasks resemble a reference set.

The funnel says what the filters did; this says whether what survived still looks like the
set it regenerates. Run and reference are both reduced to a profile (``opsynth.profile``) and
compared side by side: operator coverage and variety, sequence repeats, category shares
(``opsynth.taxonomy``), input/output structure, how many keyword arguments a call passes
(over the operators both call, weighted by the reference's calls; a required argument
passed by keyword counts too) and the data_source mix.
The structural duplicate share needs the dedup machinery, which the core does not import;
the caller computes it and passes it in.

Shares are shown as percent of tasks; ``difference`` is run minus reference, in percentage
points for shares and in units for counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl
from matplotlib.figure import Figure

from opsynth.call_arguments import MIN_CALLS
from opsynth.profile import Profile, build_profile
from opsynth.report.plots import ACCEPT_COLOR, REFERENCE_COLOR, _empty, _figure
from opsynth.taxonomy import CATEGORIES, OTHER

RANKS = (1, 2, 3, 4, 5)
COUNT, PERCENT = "count", "%"
SCHEMA = {
    "section": pl.String,
    "measure": pl.String,
    "unit": pl.String,
    "run": pl.Float64,
    "reference": pl.Float64,
    "difference": pl.Float64,
}
STRUCTURE = (
    ("multi_input", "more than one input"),
    ("tuple_output", "tuple output"),
    ("int_input", "integer or bool input"),
)


@dataclass(frozen=True)
class Fidelity:
    """The comparison the report shows: ``reference`` says what the run was held against."""

    reference: str
    table: pl.DataFrame


Rows = Iterable[Mapping[str, Any]]


def task_rows(frame: pl.DataFrame) -> list[dict[str, Any]]:
    """``ops``, ``data_source`` and ``code`` of each row of a task frame."""
    return frame.select("ops", "data_source", "code").to_dicts()


def as_profile(source: Profile | Rows, name: str) -> Profile:
    if isinstance(source, Profile):
        return source
    return Profile.from_dict(build_profile(source, name), name)


def _percent(share: float | None) -> float | None:
    return None if share is None else round(100 * share, 2)


def _repeat_share(profile: Profile) -> float | None:
    """Share of tasks whose operator sequence another task already has."""
    return 1 - profile.sequences / profile.tasks if profile.tasks else None


def keywords_per_call(profile: Profile, weights: Mapping[str, int]) -> float | None:
    """Keyword arguments a call passes on average (the sum of its operator's keyword shares,
    ``opsynth.call_arguments``), over the operators in ``weights``, weighted by them; None
    without any. An operator whose calls pass none counts 0."""
    total = sum(weights.values())
    if not total:
        return None
    passed = 0.0
    for name, weight in weights.items():
        keywords = profile.arguments.get(name, {}).get("keywords", {})
        passed += weight * sum(k["share"] for k in keywords.values())
    return round(passed / total, 3)


def _keyword_weights(mine: Profile, theirs: Profile) -> dict[str, int]:
    """The operators both sets call often enough to be counted (``MIN_CALLS``), weighted by
    the reference's calls of them."""
    return {
        name: entry["calls"]
        for name, entry in theirs.arguments.items()
        if mine.occurrences.get(name, 0) >= MIN_CALLS
    }


def fidelity_table(
    run: Profile | Rows,
    reference: Profile | Rows,
    *,
    run_structural: float | None = None,
    reference_structural: float | None = None,
) -> pl.DataFrame:
    """Run against reference, one measure a row: ``section``, ``measure``, ``unit`` (``count``
    or ``%`` of tasks), ``run``, ``reference``, ``difference`` (run minus reference).
    ``*_structural`` are structural-duplicate shares (0-1) where the caller has them."""
    mine, theirs = as_profile(run, "run"), as_profile(reference, "reference")
    rows: list[tuple[str, str, str, float | None, float | None]] = []

    def count(section: str, measure: str, a: float, b: float) -> None:
        rows.append((section, measure, COUNT, float(a), float(b)))

    def share(section: str, measure: str, a: float | None, b: float | None) -> None:
        rows.append((section, measure, PERCENT, _percent(a), _percent(b)))

    covered = len(set(mine.ops) & set(theirs.ops))
    count("operators", "tasks", mine.tasks, theirs.tasks)
    count("operators", "distinct operators", len(mine.ops), len(theirs.ops))
    share(
        "operators",
        "reference operators covered",
        covered / len(theirs.ops) if theirs.ops else None,
        1.0 if theirs.ops else None,
    )
    count("operators", "operators not in the reference", len(set(mine.ops) - set(theirs.ops)), 0)
    count("operators", "distinct op sequences", mine.sequences, theirs.sequences)
    share("operators", "sequence repeats", _repeat_share(mine), _repeat_share(theirs))
    if run_structural is not None or reference_structural is not None:
        share("operators", "structural duplicates", run_structural, reference_structural)
    for cat in (*CATEGORIES, OTHER):
        share("categories", cat, mine.categories.get(cat, 0.0), theirs.categories.get(cat, 0.0))
    for key, label in STRUCTURE:
        share("structure", label, mine.structure.get(key, 0.0), theirs.structure.get(key, 0.0))
    mine_ranks, their_ranks = mine.structure.get("ranks", {}), theirs.structure.get("ranks", {})
    for rank in RANKS:
        label = f"an input of rank {rank}"
        share("structure", label, mine_ranks.get(str(rank), 0.0), their_ranks.get(str(rank), 0.0))
    weights = _keyword_weights(mine, theirs)
    if weights:  # a profile written before keywords were counted has none to compare
        a, b = keywords_per_call(mine, weights), keywords_per_call(theirs, weights)
        count("arguments", "keyword arguments per call", a or 0.0, b or 0.0)
    for source in sorted(set(mine.data_source) | set(theirs.data_source)):
        share(
            "data_source",
            source,
            mine.data_source.get(source, 0.0),
            theirs.data_source.get(source, 0.0),
        )
    frame = pl.DataFrame(rows, schema={k: SCHEMA[k] for k in list(SCHEMA)[:-1]}, orient="row")
    return frame.with_columns((pl.col("run") - pl.col("reference")).round(2).alias("difference"))


def compare(
    run: Profile | Rows,
    reference: Profile | Rows,
    reference_name: str,
    *,
    run_structural: float | None = None,
    reference_structural: float | None = None,
) -> Fidelity:
    """The ``Fidelity`` the report renders."""
    table = fidelity_table(
        run,
        reference,
        run_structural=run_structural,
        reference_structural=reference_structural,
    )
    return Fidelity(reference_name, table)


def section(table: pl.DataFrame, name: str) -> pl.DataFrame:
    return table.filter(pl.col("section") == name)


def category_plot(table: pl.DataFrame, reference: str = "reference") -> Figure:
    """Each category's share of tasks, run and reference side by side."""
    fig, ax = _figure("Operator categories: share of tasks using each")
    cats = section(table, "categories")
    if cats.is_empty():
        _empty(ax, "categories")
        return fig
    x = list(range(cats.height))
    width = 0.4
    ax.bar([i - width / 2 for i in x], cats["run"].fill_null(0.0), width, color=ACCEPT_COLOR)
    ax.bar(
        [i + width / 2 for i in x], cats["reference"].fill_null(0.0), width, color=REFERENCE_COLOR
    )
    ax.set_xticks(x, cats["measure"].to_list(), rotation=30, ha="right")
    ax.set_ylabel("% of tasks")
    short = reference.split(" (")[0].rstrip("/").rsplit("/", 1)[-1] or "reference"
    ax.legend(["this set", short], fontsize=9)
    return fig


def summary_line(fidelity: Fidelity) -> str:
    """One sentence for the report: what was compared and the largest category gap."""
    cats = section(fidelity.table, "categories").drop_nulls("difference")
    text = f"Reference: {fidelity.reference}."
    if cats.height:
        worst = cats.sort(pl.col("difference").abs(), descending=True).row(0, named=True)
        text += (
            f" Largest category gap: {worst['measure']} {worst['difference']:+.2f} pp "
            f"({worst['run']:.2f}% vs {worst['reference']:.2f}%)."
        )
    return text + " Shares are % of tasks; difference is run minus reference."
