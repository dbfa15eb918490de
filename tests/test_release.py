"""The v1.0.0 release as committed under ``data/releases/v1.0.0``: its config, and its run
directory, which is the release's prefix while ``status`` is not ``complete``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from release_checks import check_release_folder
from runfactory import make_run

from opsynth.config import OPS6K_MIX, FiltersConfig, load_config
from opsynth.filters.verify import EDGE_TOLERANCE
from opsynth.store import read_tasks, read_verdicts
from opsynth.verdicts import group_by_task, passed_all

ROOT = Path(__file__).resolve().parents[1]
RELEASE = ROOT / "data" / "releases" / "v1.0.0"
RUN = RELEASE / "run"


def test_release_config_asks_for_ops6k() -> None:
    cfg = load_config(RELEASE / "config.toml")
    assert cfg.target == 6000 and cfg.compose.mix == OPS6K_MIX
    assert cfg.seeds.cache_dir == "none"  # the catalogue travels in the run directory


def test_recheck_config_differs_from_the_run_only_where_it_says() -> None:
    """The re-check filters as the run did but for today's filters (``verify`` decides every
    degenerate fact and the runtime window, with a small sample after each timed run; an input
    handed back is a trivial answer; every output must move for another draw; every draw has
    one tensor structure) and the
    runtime window widened by the share ``verify`` allows."""
    run = load_config(RELEASE / "config.toml").filters.model_dump()
    recheck = load_config(RELEASE / "recheck.toml").filters.model_dump()
    changed = {k for k in run if run[k] != recheck[k]}
    today = {
        "judge_every_degenerate_fact",
        "timing_in_verify",
        "timed_sample_positions",
        "input_as_answer",
        "nested_inputs",
        "every_output_distinct",
        "stable_inputs",
    }
    assert changed == {*today, "window_ms_cuda"}
    defaults = FiltersConfig().model_dump()
    for name in today:
        assert recheck[name] == defaults[name] != run[name]
    low, high = run["window_ms_cuda"]
    slack = EDGE_TOLERANCE
    assert recheck["window_ms_cuda"] == pytest.approx((low * (1 - slack), high * (1 + slack)))
    assert (
        load_config(RELEASE / "recheck.toml").decontam
        == load_config(RELEASE / "config.toml").decontam
    )


def test_committed_catalogue_is_the_one_the_run_reads() -> None:
    """The seed catalogue extracted on the GPU host travels with the run: the copy the run
    reads (``run/catalogue``) is the keyed work copy, and it holds both seed libraries."""
    if not (RUN / "catalogue").is_dir():
        pytest.skip("no run directory committed yet")
    [keyed] = (RUN / "work").glob("catalogue-*")
    seeds = read_tasks(RUN / "catalogue" / "seeds.parquet")
    assert [t.id for t in seeds] == [t.id for t in read_tasks(keyed / "seeds.parquet")]
    sources = {t.data_source for t in seeds}
    assert len(seeds) > 1000 and {"torch#1", "transformers"} <= sources, sources


@pytest.fixture(scope="module")
def manifest() -> dict:
    if not (RUN / "run.json").is_file():
        pytest.skip("no run directory committed yet")
    return json.loads((RUN / "run.json").read_text())


def test_committed_run_is_consistent(manifest: dict) -> None:
    """Every accepted row passed every stage it reached, once; the counts agree; the run says
    how far it is and keeps every invocation that made it."""
    assert manifest["status"] in ("stopped", "complete")
    assert manifest["config_hash"] == load_config(RELEASE / "config.toml").config_hash()
    accepted = read_tasks(RUN / "accepted.parquet")
    verdicts = group_by_task(read_verdicts(RUN / "verdicts.parquet"))
    assert len(accepted) == manifest["counts"]["accepted"] > 0
    assert len({t.id for t in accepted}) == len(accepted)
    assert len({t.code for t in accepted}) == len(accepted)
    for task in accepted:
        assert passed_all(task.id, verdicts), task.id
        assert {"verify", "compile", "runtime", "dedup"} <= {v.stage for v in verdicts[task.id]}
        assert task.data_source in OPS6K_MIX
        assert "class Model" in task.code and "def get_inputs" in task.code
    assert manifest["invocations"] and manifest["invocations"][-1]["status"] == manifest["status"]
    assert all(i["device"] == "cuda" for i in manifest["invocations"])
    if manifest["status"] == "complete":
        assert len(accepted) == 6000


def test_committed_run_loads_with_datasets(manifest: dict) -> None:
    datasets = pytest.importorskip("datasets")
    rows = datasets.load_dataset("parquet", data_files=str(RUN / "accepted.parquet"), split="train")
    assert rows.num_rows == manifest["counts"]["accepted"]
    assert {"id", "ops", "data_source", "code"} <= set(rows.column_names)


def _dry_run(run: Path, out: Path, recheck: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "opsynth.flows.cli", "publish", str(run), "--repo-id", "org/x"]
        + ["--version", "1.0.0", "--dry-run", str(out), "--recheck", str(recheck)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_release_checks_hold_on_a_dry_run_and_catch_a_changed_one(tmp_path: Path) -> None:
    """The release folder's checks, on a small run's ``publish --dry-run`` with its re-check:
    they pass on what publish wrote, and fail when a row is dropped, a row repeats, a card
    number moves or the re-check rejected a row."""
    run = make_run(tmp_path / "run", seed=4, n=20)
    rows = read_tasks(run / "accepted.parquet")
    clean = make_run(tmp_path / "recheck", seed=7, audit=True, tasks=rows, reject={})
    failing = make_run(
        tmp_path / "recheck-2", seed=7, audit=True, tasks=rows, reject={3: ("runtime", "too_slow")}
    )
    _dry_run(run, tmp_path / "hub-2", failing)
    with pytest.raises(AssertionError):
        check_release_folder(tmp_path / "hub-2", tmp_path / "cache-r", recheck=True)
    folder = tmp_path / "hub"
    _dry_run(run, folder, clean)
    read = check_release_folder(folder, tmp_path / "cache", rows=15, recheck=True)
    assert read["rows"] == 15 and read["device"] == "cpu:Test CPU"
    with pytest.raises(AssertionError):
        check_release_folder(folder, tmp_path / "cache-2", rows=6000)
    with pytest.raises(AssertionError):
        check_release_folder(folder, tmp_path / "cache-3", mix_tolerance=0.015)

    data = next((folder / "data").glob("*.parquet"))
    table = pq.read_table(data)
    changed = {
        "a row dropped": lambda: pq.write_table(table.slice(0, 14), data),
        "a row repeated": lambda: pq.write_table(
            pa.concat_tables([table.slice(0, 14), table.slice(0, 1)]), data
        ),
    }
    for i, change in enumerate(changed.values()):
        change()
        with pytest.raises(AssertionError):
            check_release_folder(folder, tmp_path / f"cache-c{i}")
        pq.write_table(table, data)
    card = folder / "README.md"
    text = card.read_text()
    moved = re.sub(r"^\| static \| 20 \| 19 \|", "| static | 20 | 18 |", text, flags=re.M)
    assert moved != text
    card.write_text(moved)
    with pytest.raises(AssertionError):
        check_release_folder(folder, tmp_path / "cache-card")


def test_committed_release_folder(tmp_path: Path) -> None:
    """The release as a user loads it from the repository: 6,000 Ops-6K rows with ``datasets``,
    unique, decontaminated, within 1.5 points of Table 3's mix, its card's numbers those of
    its parquet files, made by the committed config."""
    if not (RELEASE / "hub" / "README.md").is_file():
        pytest.skip("the release's dataset folder is not committed yet")
    read = check_release_folder(
        RELEASE / "hub", tmp_path / "cache", rows=6000, mix_tolerance=0.015, recheck=True
    )
    assert read["config_hash"] == load_config(RELEASE / "config.toml").config_hash()
    assert read["device"].startswith("cuda:NVIDIA H200")
