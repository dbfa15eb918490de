"""Tables as Markdown and HTML text, shared by the report and the dataset card."""

from __future__ import annotations

import html

import polars as pl

MAX_ROWS = 30  # longer tables are cut in documents (the CSV keeps every row)


def cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def markdown_table(frame: pl.DataFrame, max_rows: int = MAX_ROWS) -> str:
    """A GitHub-flavoured Markdown table; ``|`` in cells is escaped."""
    if frame.is_empty():
        return "_(none)_\n"
    head = "| " + " | ".join(frame.columns) + " |"
    rule = "| " + " | ".join("---" for _ in frame.columns) + " |"
    rows = [
        "| " + " | ".join(cell(v).replace("|", "\\|").replace("\n", " ") for v in row) + " |"
        for row in frame.head(max_rows).iter_rows()
    ]
    more = [f"\n_{frame.height - max_rows} more rows not shown_"] if frame.height > max_rows else []
    return "\n".join([head, rule, *rows, *more]) + "\n"


def html_table(frame: pl.DataFrame, max_rows: int = MAX_ROWS) -> str:
    if frame.is_empty():
        return "<p><em>(none)</em></p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in frame.columns)
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell(v))}</td>" for v in row) + "</tr>"
        for row in frame.head(max_rows).iter_rows()
    )
    more = f"<p><em>{frame.height - max_rows} more rows not shown</em></p>"
    return f"<table><tr>{head}</tr>{rows}</table>" + (more if frame.height > max_rows else "")
