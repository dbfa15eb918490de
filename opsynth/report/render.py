"""Writing the audit report: CSV tables, PNG plots, and one HTML and one Markdown page.

The HTML page embeds its plots (one self-contained file to mail or attach to a CI run); the
Markdown page links ``plots/*.png`` next to it (renderers do not show inline image data).
Given a ``Fidelity`` (``opsynth report --reference``), the report ends with the run held
against that reference set: its table, a sentence naming the reference, and a category plot.
"""

from __future__ import annotations

import base64
import html
import time
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from opsynth.report.fidelity import Fidelity, category_plot, summary_line
from opsynth.report.markdown import MAX_ROWS, html_table, markdown_table
from opsynth.report.plots import build_plots, png
from opsynth.report.tables import build_tables
from opsynth.rundata import STOPPED, RunData
from opsynth.store import write_bytes_atomic

TITLES = {
    "funnel": "Filter funnel",
    "reasons": "Rejection reasons by stage",
    "op_rejects": "Rejections per seed operator",
    "composition": "Composition vs. CUDA Agent Table 3",
    "runtime": "Runtime and compile statistics (ms; speedup = eager / compiled)",
    "runtime_histogram": "Accepted tasks per eager runtime bin (ms, as the window saw it)",
    "similarity": "Similarity to the nearest KernelBench problem",
    "nearest_kernelbench": "KernelBench problems most often nearest",
    "fidelity": "Fidelity to the reference set",
}
PLOT_AFTER = {  # each plot is shown after the table it illustrates
    "funnel": ["funnel"],
    "reasons": ["reasons"],
    "composition": ["mix"],
    "runtime": ["runtime", "speedup"],
    "similarity": ["similarity"],
    "fidelity": ["categories"],
}
ROW_LIMITS = {"fidelity": 200}  # tables shown whole in the documents (MAX_ROWS cuts the rest)
STYLE = (
    "body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em}"
    "table{border-collapse:collapse;margin:.5em 0 1.5em}"
    "td,th{border:1px solid #ccc;padding:.2em .5em;text-align:right}"
    "td:first-child,th:first-child{text-align:left}img{max-width:100%}"
)


@dataclass
class Report:
    """What was written, and how long building it took."""

    html: Path
    markdown: Path
    tables: dict[str, Path]
    plots: dict[str, Path]
    seconds: float


def header_lines(data: RunData) -> list[str]:
    """Where the run came from and what it ran on, one fact per line."""
    m = data.manifest
    versions = m.get("versions", {})
    counts = ", ".join(f"{k} {v}" for k, v in m.get("counts", {}).items())
    facts = [
        ("source", data.source),
        ("kind", data.kind + (f" of {m['source']}" if m.get("source") else "")),
        ("status", m.get("status", "")),
        ("partial", partial_note(m)),
        ("device", f"{m.get('device', '')} {m.get('filters_runtime', {}).get('device_name', '')}"),
        ("versions", ", ".join(f"{k} {v}" for k, v in versions.items())),
        ("config hash", m.get("config_hash", "")),
        ("counts", counts),
    ]
    return [f"{name}: {value}".strip() for name, value in facts if str(value).strip()]


def partial_note(manifest: dict) -> str:
    """For a run a time limit stopped, what its report covers; empty for a finished run."""
    if manifest.get("status") != STOPPED:
        return ""
    accepted = manifest.get("counts", {}).get("accepted", 0)
    target = manifest.get("config", {}).get("target", "?")
    return (
        f"the run stopped at its time limit with {accepted} of {target} accepted; this "
        "report covers its finished chunks, not the run"
    )


def write_report(data: RunData, out: Path, fidelity: Fidelity | None = None) -> Report:
    """Write ``out/{report.html, report.md, tables/*.csv, plots/*.png}``; each file is written
    whole (temporary name, then rename), so a reader never sees half a report file.
    ``fidelity`` adds the reference comparison (``tables/fidelity.csv``, ``plots/categories``)."""
    started = time.perf_counter()
    out = Path(out)
    (out / "tables").mkdir(parents=True, exist_ok=True)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    tables = build_tables(data)
    figures = build_plots(data, tables)
    notes = {}
    if fidelity is not None:
        tables["fidelity"] = fidelity.table
        figures["categories"] = category_plot(fidelity.table, fidelity.reference)
        notes["fidelity"] = summary_line(fidelity)
    images = {name: png(fig) for name, fig in figures.items()}
    table_paths = {name: out / "tables" / f"{name}.csv" for name in tables}
    plot_paths = {name: out / "plots" / f"{name}.png" for name in images}
    for name, frame in tables.items():
        write_bytes_atomic(table_paths[name], _csv(frame))
    for name, blob in images.items():
        write_bytes_atomic(plot_paths[name], blob)
    title = f"opsynth audit report: {data.source}"
    markdown = render_markdown(title, data, tables, notes)
    write_bytes_atomic(out / "report.md", markdown.encode())
    page = render_html(title, data, tables, images, notes)
    write_bytes_atomic(out / "report.html", page.encode())
    seconds = round(time.perf_counter() - started, 3)
    return Report(out / "report.html", out / "report.md", table_paths, plot_paths, seconds)


def _csv(frame: pl.DataFrame) -> bytes:
    # nested columns (lists) have no CSV form; write them as their text
    flat = frame.with_columns(
        pl.col(c).cast(pl.String) for c, d in frame.schema.items() if d.is_nested()
    )
    return flat.write_csv().encode()


def render_markdown(
    title: str,
    data: RunData,
    tables: dict[str, pl.DataFrame],
    notes: dict[str, str] | None = None,
) -> str:
    """The Markdown page; ``notes`` puts a sentence under a table's heading."""
    notes = notes or {}
    parts = [f"# {title}\n", *(f"- {line}" for line in header_lines(data)), ""]
    for name, frame in tables.items():
        parts.append(f"## {TITLES[name]}\n")
        if name in notes:
            parts.append(f"{notes[name]}\n")
        parts.append(markdown_table(frame, ROW_LIMITS.get(name, MAX_ROWS)))
        parts += [f"![{plot}](plots/{plot}.png)\n" for plot in PLOT_AFTER.get(name, [])]
    return "\n".join(parts)


def render_html(
    title: str,
    data: RunData,
    tables: dict[str, pl.DataFrame],
    images: dict[str, bytes],
    notes: dict[str, str] | None = None,
) -> str:
    notes = notes or {}
    facts = "".join(f"<li>{html.escape(line)}</li>" for line in header_lines(data))
    body = [f"<h1>{html.escape(title)}</h1><ul>{facts}</ul>"]
    for name, frame in tables.items():
        body.append(f"<h2>{html.escape(TITLES[name])}</h2>")
        if name in notes:
            body.append(f"<p>{html.escape(notes[name])}</p>")
        body.append(html_table(frame, ROW_LIMITS.get(name, MAX_ROWS)))
        for plot in PLOT_AFTER.get(name, []):
            encoded = base64.b64encode(images[plot]).decode()
            body.append(f'<img alt="{plot}" src="data:image/png;base64,{encoded}">')
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>\n"
    )
