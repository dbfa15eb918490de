"""``opsynth report``: tables, plots, HTML and Markdown from a run or an audit, and the
notebook executed headlessly on the same small run so it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from nbrun import execute, outputs
from runfactory import make_run

from opsynth.report.render import write_report
from opsynth.report.tables import build_tables
from opsynth.rundata import load_run

ROOT = Path(__file__).resolve().parents[1]
TABLES = {
    "funnel",
    "reasons",
    "op_rejects",
    "composition",
    "runtime",
    "runtime_histogram",
    "similarity",
    "nearest_kernelbench",
}
PLOTS = {"funnel", "mix", "runtime", "speedup", "similarity", "reasons"}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("run") / "run", seed=5, target=5)


@pytest.fixture(scope="module")
def audit(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("audit") / "audit", seed=6, audit=True)


def test_tables_explain_the_run(run):
    tables = build_tables(load_run(run))
    assert set(tables) == TABLES
    funnel = {r["stage"]: r for r in tables["funnel"].iter_rows(named=True)}
    assert funnel["compose"]["entered"] == 12 and funnel["static"]["rejected"] == 1
    assert funnel["export"]["top_reasons"].startswith("over_target")
    reasons = {(r["stage"], r["reason"]) for r in tables["reasons"].iter_rows(named=True)}
    assert ("decontam", "kernelbench_similar") in reasons and ("runtime", "too_fast") in reasons
    ops = tables["op_rejects"]
    assert ops["rejected"].sum() >= 5 and "over_target" not in ops["top_reason"].to_list()
    mix = {r["data_source"]: r for r in tables["composition"].iter_rows(named=True)}
    assert (
        mix["torch#2"]["table3_share"] == 0.8377 and sum(r["accepted"] for r in mix.values()) == 5
    )
    assert tables["runtime_histogram"]["tasks"].sum() == 5
    assert tables["similarity"]["dropped"][0] == 1


def test_report_files(run):
    report = write_report(load_run(run), run / "report")
    assert {p.stem for p in report.plots.values()} == PLOTS
    for path in report.plots.values():
        assert path.read_bytes().startswith(b"\x89PNG")
    html = report.html.read_text()
    assert html.count("data:image/png;base64,") == len(PLOTS)
    markdown = report.markdown.read_text()
    assert all(f"plots/{name}.png" in markdown for name in PLOTS)
    assert "Filter funnel" in markdown and "over_target" in markdown
    assert set(p.stem for p in (run / "report" / "tables").glob("*.csv")) == TABLES


def test_report_of_an_audit_has_no_compose_stage(audit):
    data = load_run(audit)
    assert data.kind == "audit"
    tables = build_tables(data)
    assert "compose" not in tables["funnel"]["stage"].to_list()
    report = write_report(data, audit / "report")
    assert "kind: audit of ops6k.parquet" in report.markdown.read_text()


def report_cli(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "flows.cli", "report", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_report_cli_and_bad_input(audit, tmp_path):
    proc = report_cli(str(audit), "--out", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "r" / "report.html").is_file()
    running = make_run(tmp_path / "running")
    manifest = json.loads((running / "run.json").read_text())
    (running / "run.json").write_text(json.dumps({**manifest, "status": "running"}))
    for bad, needle in ((running, "not finished"), (tmp_path / "nothing", "no run.json")):
        proc = report_cli(str(bad))
        assert proc.returncode == 2 and needle in proc.stderr
        assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1


def test_notebook_executes_on_a_run(run, tmp_path):
    text, images = outputs(execute(tmp_path, {"OPSYNTH_RUN": str(run)}))
    assert "'accepted': 5" in text and "'plots': ['funnel'" in text
    assert images == len(PLOTS)
