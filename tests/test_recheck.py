"""A release's re-check (``opsynth publish --recheck AUDIT``): the card states what a second,
independent audit of the accepted rows found, its run.json ships beside the run's, and an audit
that is not of exactly those rows, or has not finished, is refused in one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from runfactory import make_run

from opsynth.config import load_config
from opsynth.publish import PublishError, publish_run
from opsynth.publish.layout import RECHECK_CONFIG_PATH, RECHECK_MANIFEST_PATH, data_path
from opsynth.store import read_tasks
from opsynth.tasksets import load_task_file

ROOT = Path(__file__).resolve().parents[1]
REPO = "org/kernels"


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("release") / "run", seed=1)


def recheck_of(release: Path, root: Path, reject: dict | None = None, drop: int = 0) -> Path:
    """An audit of the release's accepted rows (less the last ``drop``), rejecting as told."""
    rows = read_tasks(release / "accepted.parquet")
    return make_run(root, seed=7, audit=True, tasks=rows[: len(rows) - drop], reject=reject or {})


def card_of(release: Path, recheck: Path, out: Path) -> str:
    publish_run(release, REPO, dry_run=out, recheck=recheck)
    return (out / "README.md").read_text()


def test_the_card_states_a_clean_recheck_and_ships_its_manifest(release, tmp_path):
    audit = recheck_of(release, tmp_path / "recheck")
    rows = len(read_tasks(release / "accepted.parquet"))
    card = card_of(release, audit, tmp_path / "dry")
    section = card.split("## Re-check", 1)[1].split("## How to regenerate", 1)[0]
    assert f"all {rows} pass every stage" in section
    assert (
        f"| rows re-checked | {rows} |" in section and "| exact or near duplicates | 0 |" in section
    )
    assert "did not pass" not in section  # no failure table when every row passed
    similarity = max(
        json.loads(v["measures"])["kb_similarity"]
        for v in read_verdict_rows(audit)
        if v["stage"] == "decontam"
    )
    assert f"| largest KernelBench AST similarity | {similarity:.4f} |" in section
    shipped = json.loads((tmp_path / "dry" / RECHECK_MANIFEST_PATH).read_text())
    assert shipped == json.loads((audit / "run.json").read_text())
    # the command repeats it on the published rows, with the re-check's own config
    rows_file, config_file = data_path("default"), RECHECK_CONFIG_PATH
    assert (
        f"hf download {REPO} {rows_file} {config_file} --repo-type dataset --revision v1.0.0 "
        "--local-dir ." in section
    )
    assert (
        f"opsynth audit --input {rows_file} --out recheck --config {config_file} --device cpu"
        in section
    )
    config = load_config(tmp_path / "dry" / config_file)
    assert config.config_hash() == shipped["config_hash"]
    published = {t.id for t in load_task_file(tmp_path / "dry" / rows_file)}
    assert published == {t.id for t in read_tasks(audit / "candidates.parquet")}
    # without --recheck, neither the section nor the file
    plain = tmp_path / "plain"
    publish_run(release, REPO, dry_run=plain)
    assert "## Re-check" not in (plain / "README.md").read_text()
    assert not (plain / RECHECK_MANIFEST_PATH).exists() and not (plain / config_file).exists()


def test_rows_the_recheck_rejects_are_counted_with_their_reasons(release, tmp_path):
    reject = {0: ("runtime", "too_fast"), 2: ("dedup", "near_duplicate")}
    audit = recheck_of(release, tmp_path / "recheck", reject)
    rows = len(read_tasks(release / "accepted.parquet"))
    section = card_of(release, audit, tmp_path / "dry").split("## Re-check", 1)[1]
    assert f"{rows - 2} of {rows} pass every stage" in section
    assert "| exact or near duplicates | 1 |" in section
    failures = section.split("did not pass", 1)[1].split("```", 1)[0]
    assert "| runtime | too_fast | 1 |" in failures and "| dedup | near_duplicate | 1 |" in failures


def read_verdict_rows(run: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(run / "verdicts.parquet").to_pylist()


def test_a_recheck_of_other_rows_or_unfinished_is_refused(release, tmp_path):
    short = recheck_of(release, tmp_path / "short", drop=1)
    with pytest.raises(PublishError, match="the run accepted .*1 of the run's rows not checked"):
        publish_run(release, REPO, dry_run=tmp_path / "a", recheck=short)
    with pytest.raises(PublishError, match="is a run, not an audit"):
        publish_run(release, REPO, dry_run=tmp_path / "b", recheck=release)
    stopped = recheck_of(release, tmp_path / "stopped")
    manifest = json.loads((stopped / "run.json").read_text())
    (stopped / "run.json").write_text(json.dumps({**manifest, "status": "stopped"}))
    with pytest.raises(PublishError, match="--recheck .*has not finished"):
        publish_run(release, REPO, dry_run=tmp_path / "c", recheck=stopped)
    # the command line says it in one line, exit code 2
    proc = subprocess.run(
        [sys.executable, "-m", "opsynth.flows.cli", "publish", str(release)]
        + ["--repo-id", REPO, "--dry-run", str(tmp_path / "d"), "--recheck", str(short)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "--recheck" in lines[0], proc.stderr


def test_the_card_says_which_rows_were_replaced_and_what_was_carried(release, tmp_path):
    """After ``run --drop-rechecked`` and ``audit --reuse``: the run's ``recheck`` verdicts
    are counted as replaced rows, and the rows the re-check carried are stated."""
    from opsynth.record import Verdict
    from opsynth.store import read_verdicts, write_verdicts

    run = tmp_path / "run"
    shutil.copytree(release, run)
    rejected = read_tasks(run / "rejected.parquet")
    verdicts = read_verdicts(run / "verdicts.parquet")
    extra = Verdict(rejected[0].id, "recheck", False, "too_fast", "runtime: 0.8 ms < 1 ms")
    write_verdicts([*verdicts, extra], run / "verdicts.parquet")
    audit = recheck_of(run, tmp_path / "recheck")
    manifest = json.loads((audit / "run.json").read_text())
    carried = len(read_tasks(run / "accepted.parquet")) - 1
    manifest |= {"reused_from": "recheck-1", "reused_rows": carried}
    (audit / "run.json").write_text(json.dumps(manifest))
    section = card_of(run, audit, tmp_path / "dry").split("## Re-check", 1)[1]
    assert "1 rows an earlier re-check rejected were replaced by rows past the target" in section
    assert f"verdicts on the {carried} rows that one had checked" in section
    assert f"| of them carried from an earlier re-check | {carried} |" in section
    # a plain re-check says neither
    plain = card_of(release, recheck_of(release, tmp_path / "plain"), tmp_path / "dry2")
    assert "replaced" not in plain and "carried" not in plain
