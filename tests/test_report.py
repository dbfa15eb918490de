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

from opsynth.profile import load_profile
from opsynth.publish import publish_run
from opsynth.report.fidelity import compare, task_rows
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
    cmd = [sys.executable, "-m", "opsynth.flows.cli", "report", *args]
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


def test_report_fidelity_section(run, audit, tmp_path):
    data = load_run(run)
    reference = task_rows(load_run(audit).accepted)
    fidelity = compare(task_rows(data.accepted), reference, "audit set", run_structural=0.2)
    table = {(r["section"], r["measure"]): r for r in fidelity.table.iter_rows(named=True)}
    assert table[("operators", "tasks")]["run"] == 5
    assert table[("operators", "tasks")]["reference"] == len(reference)
    assert table[("operators", "structural duplicates")]["run"] == 20.0
    assert table[("operators", "structural duplicates")]["reference"] is None
    # runfactory tasks chain torch.relu/tanh/sigmoid/abs/exp/sin on one rank-2 input
    assert table[("categories", "conv")]["run"] == 0.0
    assert table[("categories", "activation")]["reference"] > 0
    assert table[("structure", "an input of rank 2")]["run"] == 100.0
    assert table[("structure", "more than one input")]["difference"] == 0.0
    assert {m for s, m in table if s == "data_source"} >= {"torch#1", "torch#2", "torch#3"}
    report = write_report(data, tmp_path / "r", fidelity)
    assert {p.stem for p in report.tables.values()} == TABLES | {"fidelity"}
    assert {p.stem for p in report.plots.values()} == PLOTS | {"categories"}
    markdown = report.markdown.read_text()
    assert "## Fidelity to the reference set" in markdown and "Reference: audit set." in markdown
    assert "plots/categories.png" in markdown and "more rows not shown" not in markdown
    assert report.html.read_text().count("data:image/png;base64,") == len(PLOTS) + 1


def test_report_cli_with_a_reference(run, audit, tmp_path):
    proc = report_cli(str(run), "--out", str(tmp_path / "p"), "--reference", "ops6k")
    assert proc.returncode == 0, proc.stderr
    csv = (tmp_path / "p" / "tables" / "fidelity.csv").read_text()
    assert "categories,conv,%,0.0,24.95,-24.95" in csv  # the shipped Ops-6K profile
    assert "structural duplicates,%,0.0,," in csv  # a profile has no code to hash
    reference = str(audit / "accepted.parquet")
    proc = report_cli(str(run), "--out", str(tmp_path / "q"), "--reference", reference)
    assert proc.returncode == 0, proc.stderr
    markdown = (tmp_path / "q" / "report.md").read_text()
    assert f"Reference: {reference} ({load_run(audit).accepted.height} tasks)." in markdown
    (tmp_path / "bad.json").write_text("[]")
    for bad, needle in (
        (tmp_path / "bad.json", "not a profile"),
        (tmp_path / "none.parquet", "no such file"),
        ("not-a-hub-id", "no such file and not a Hub dataset id"),
    ):
        proc = report_cli(str(run), "--out", str(tmp_path / "x"), "--reference", str(bad))
        assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
        assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1


def test_dataset_card_shows_the_report_fidelity(tmp_path):
    run = make_run(tmp_path / "run", seed=7, target=5)
    before = publish_run(run, "org/set", dry_run=tmp_path / "before")
    assert "## Fidelity" not in (before.export.root / "README.md").read_text()
    data = load_run(run)
    write_report(
        data, run / "report", compare(task_rows(data.accepted), load_profile("ops6k"), "x")
    )
    after = publish_run(run, "org/set", dry_run=tmp_path / "after")
    card = (after.export.root / "README.md").read_text()
    assert "## Fidelity to a reference set" in card
    assert "| categories | conv | % | 0 | 24.95 | -24.95 |" in card


def test_notebook_executes_on_a_run(run, tmp_path):
    text, images = outputs(execute(tmp_path, {"OPSYNTH_RUN": str(run)}))
    assert "'accepted': 5" in text and "'plots': ['funnel'" in text
    assert images == len(PLOTS)


def test_a_run_timed_in_verify_reports_and_exports_its_timings(tmp_path):
    """Where verify decides the window (``filters.timing_in_verify``) the runtime and compile
    numbers come from its rows: the report's tables and the full config's columns."""
    from opsynth.publish.layout import full_frame
    from opsynth.report import tables as t
    from opsynth.rundata import load_run

    data = load_run(make_run(tmp_path / "run", seed=8, verify_times=True))
    assert "runtime" not in set(data.verdicts["stage"].to_list())
    values = t.runtime_values(data)
    timed = data.verdicts.filter(data.verdicts["stage"] == "verify").height
    assert len(values["eager_ms"]) == timed and len(values["compile_speedup"]) == timed
    assert t.runtime_window(data) == (0.1, 1000.0)
    assert sum(t.runtime_histogram(data)["tasks"]) == data.accepted.height
    full = full_frame(data)
    assert full["eager_ms"].null_count() == full["compiled_ms"].null_count() == 0
    assert full["compile_s"].null_count() == 0
    assert ("verify", "too_fast") in set(t.reasons(data).select("stage", "reason").iter_rows())
