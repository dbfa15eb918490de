"""The audit report's plots: matplotlib figures built from the report tables.

Figures are made with ``matplotlib.figure.Figure`` directly, never through pyplot's global
state, so building them needs no display and works the same in the CLI, a headless test and a
notebook kernel. ``png`` turns one into bytes for the HTML/Markdown report and the notebook.
"""

from __future__ import annotations

import io

import polars as pl
from matplotlib.figure import Figure

from opsynth.report import tables as t
from opsynth.rundata import RunData

SIZE = (7.0, 3.6)  # inches; readable at 100 dpi in an HTML page and a notebook
DPI = 100
TOP_REASONS_SHOWN = 15
HIST_BINS = 30
ACCEPT_COLOR, REJECT_COLOR, REFERENCE_COLOR = "#3b7dd8", "#d8643b", "#777777"


def _figure(title: str) -> tuple[Figure, object]:
    fig = Figure(figsize=SIZE, dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title, fontsize=11)
    return fig, ax


def _empty(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} in this run", ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def funnel_plot(funnel: pl.DataFrame) -> Figure:
    fig, ax = _figure("Filter funnel: candidates entering and passing each stage")
    if funnel.is_empty():
        _empty(ax, "verdicts")
        return fig
    x = range(funnel.height)
    ax.bar(x, funnel["entered"], color=REJECT_COLOR, label="rejected")
    ax.bar(x, funnel["passed"], color=ACCEPT_COLOR, label="passed")
    ax.set_xticks(list(x), funnel["stage"].to_list(), rotation=30, ha="right")
    ax.set_ylabel("tasks")
    ax.legend()
    return fig


def mix_plot(composition: pl.DataFrame) -> Figure:
    fig, ax = _figure("Composition: accepted set vs. CUDA Agent Table 3")
    x = list(range(composition.height))
    width = 0.4
    ax.bar([i - width / 2 for i in x], composition["share"], width, color=ACCEPT_COLOR)
    reference = composition["table3_share"].fill_null(0.0)
    ax.bar([i + width / 2 for i in x], reference, width, color=REFERENCE_COLOR)
    ax.set_xticks(x, composition["data_source"].to_list())
    ax.set_ylabel("share of tasks")
    ax.legend(["this set", "Table 3 (Ops-6K)"])
    return fig


def runtime_plot(eager_ms: pl.Series, window: tuple[float, float] | None) -> Figure:
    fig, ax = _figure("Eager runtime of every timed candidate (log scale)")
    edges = t.log_edges(eager_ms)
    if not edges:
        _empty(ax, "runtime measurements")
        return fig
    ax.hist(eager_ms.to_list(), bins=edges, color=ACCEPT_COLOR)
    ax.set_xscale("log")
    ax.set_xlabel("eager ms (median)")
    ax.set_ylabel("tasks")
    if window:
        for edge in window:
            ax.axvline(edge, color=REJECT_COLOR, linestyle="--")
        ax.legend([f"window {window[0]:g}-{window[1]:g} ms"])
    return fig


def speedup_plot(speedup: pl.Series) -> Figure:
    fig, ax = _figure("torch.compile speedup over eager (eager ms / compiled ms)")
    if not len(speedup):
        _empty(ax, "compile measurements")
        return fig
    edges = t.log_edges(speedup, per_decade=8)
    ax.hist(speedup.to_list(), bins=edges, color=ACCEPT_COLOR)
    ax.set_xscale("log")
    ax.axvline(1.0, color=REFERENCE_COLOR, linestyle="--")
    ax.set_xlabel("speedup")
    ax.set_ylabel("tasks")
    return fig


def similarity_plot(similarity: pl.Series, threshold: float | None) -> Figure:
    fig, ax = _figure("AST similarity to the nearest KernelBench problem")
    if not len(similarity):
        _empty(ax, "decontamination measurements")
        return fig
    ax.hist(similarity.to_list(), bins=HIST_BINS, range=(0.0, 1.0), color=ACCEPT_COLOR)
    if threshold is not None:
        ax.axvline(threshold, color=REJECT_COLOR, linestyle="--")
        ax.legend([f"drop threshold {threshold:g}"])
    ax.set_xlabel("similarity")
    ax.set_ylabel("tasks")
    return fig


def reasons_plot(reasons: pl.DataFrame) -> Figure:
    fig, ax = _figure("Top rejection reasons")
    if reasons.is_empty():
        _empty(ax, "rejections")
        return fig
    top = reasons.head(TOP_REASONS_SHOWN).reverse()
    labels = [f"{s}: {r}" for s, r in top.select("stage", "reason").iter_rows()]
    ax.barh(labels, top["count"], color=REJECT_COLOR)
    ax.set_xlabel("tasks")
    return fig


def build_plots(data: RunData, tables: dict[str, pl.DataFrame]) -> dict[str, Figure]:
    """Every report plot by name (the PNG file stem), in the order the report shows them."""
    values = t.runtime_values(data)
    return {
        "funnel": funnel_plot(tables["funnel"]),
        "mix": mix_plot(tables["composition"]),
        "runtime": runtime_plot(values["eager_ms"], t.runtime_window(data)),
        "speedup": speedup_plot(values["compile_speedup"]),
        "similarity": similarity_plot(t.similarity_values(data), t.similarity_threshold(data)),
        "reasons": reasons_plot(tables["reasons"]),
    }


def png(fig: Figure) -> bytes:
    """The figure as PNG bytes, without the Software stamp: the same data, the same file."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()
