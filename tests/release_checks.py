"""What a released dataset folder (``opsynth publish --dry-run`` output, as committed under
``data/releases/<version>/hub``) must hold, checked the way a user meets it: loaded with
``datasets`` from the folder, its card read as text and every number there compared with the
parquet files beside it. ``tests/test_release.py`` runs it on the committed release and, so
the checks themselves are exercised before a release exists, on a small dry run.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

OPS6K_COLUMNS = ["ops", "data_source", "code"]
KERNELBENCH_THRESHOLD = 0.9


def markdown_tables(card: str, heading: str) -> list[list[dict[str, str]]]:
    """The tables under ``heading`` (a ``## `` or ``### `` line) up to the next heading of
    any level, each as rows keyed by its header cells."""
    lines = card.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == heading)
    tables: list[list[dict[str, str]]] = []
    block: list[str] = []
    for line in [*lines[start + 1 :], "#"]:  # a last heading ends the last table
        if line.startswith("|"):
            block.append(line)
            continue
        if block:
            tables.append(_table(block))
            block = []
        if line.startswith("#"):
            break
    return tables


def _table(block: list[str]) -> list[dict[str, str]]:
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in block]
    header, rows = cells[0], cells[2:]
    return [dict(zip(header, row, strict=True)) for row in rows]


def _parquet(folder: Path, config: str) -> list[dict]:
    [path] = (folder / ("data" if config == "default" else config)).glob("*.parquet")
    return pq.read_table(path).to_pylist()


def check_release_folder(
    folder: Path,
    cache: Path,
    *,
    rows: int | None = None,
    mix_tolerance: float | None = None,
    recheck: bool = False,
) -> dict:
    """Assert what the release at ``folder`` must hold; return what was read (row count,
    config hash, device). ``cache``: where ``datasets`` keeps what it loads; ``rows``: the
    count it must have; ``mix_tolerance``: how far each data source's share may be from CUDA
    Agent's Table 3 (the card's difference column); ``recheck``: the card must state a second
    pass over every row that passed them all, found no duplicate and ran on the same device."""
    import datasets

    tasks = datasets.load_dataset(str(folder), split="train", cache_dir=str(cache))
    assert tasks.column_names == OPS6K_COLUMNS, tasks.column_names
    assert {str(v) for v in tasks.features.values()} == {"Value('string')"}, tasks.features
    full = datasets.load_dataset(str(folder), "full", split="train", cache_dir=str(cache))
    n = tasks.num_rows
    assert rows is None or n == rows, (n, rows)
    default_rows = tasks.to_list()
    full_rows = full.to_list()
    assert [{k: r[k] for k in OPS6K_COLUMNS} for r in full_rows] == default_rows
    assert all(isinstance(json.loads(r["ops"]), list) for r in default_rows)
    for column in ("id", "code", "exact_cluster", "near_cluster"):
        values = [r[column] for r in full_rows]
        assert None not in values and len(set(values)) == n, f"{column} repeats"
    for r in full_rows:
        assert r["kb_similarity"] <= KERNELBENCH_THRESHOLD, (r["id"], r["kb_similarity"])
        assert r["kb_nearest_problem_id"] is not None and r["kb_nearest_name"], r["id"]

    card = (folder / "README.md").read_text()
    assert re.search(rf"^{n:,} PyTorch tasks|^{n} PyTorch tasks", card, re.M), "row count"
    rejected, verdicts = _parquet(folder, "rejected"), _parquet(folder, "verdicts")
    counts = {
        "default": n,
        "full": full.num_rows,
        "rejected": len(rejected),
        "verdicts": len(verdicts),
    }
    [configs] = markdown_tables(card, "## Configs")
    assert {r["config"]: int(r["rows"]) for r in configs} == counts

    entered = Counter(v["stage"] for v in verdicts)
    passed = Counter(v["stage"] for v in verdicts if v["passed"])
    funnel = markdown_tables(card, "## Filter funnel")[0]
    stated = {r["stage"]: (int(r["entered"]), int(r["passed"])) for r in funnel}
    assert stated == {s: (entered[s], passed[s]) for s in entered}, stated
    rejected_ids = {r["id"] for r in rejected}
    failed_ids = {v["task_id"] for v in verdicts if not v["passed"]}
    assert rejected_ids == failed_ids and not rejected_ids & {r["id"] for r in full_rows}

    by_source = Counter(r["data_source"] for r in default_rows)
    [mix] = markdown_tables(card, "## Composition vs. CUDA Agent Table 3")
    for r in mix:
        assert int(r["accepted"]) == by_source[r["data_source"]], r
        assert abs(float(r["share"]) - by_source[r["data_source"]] / n) < 1e-3, r
        if mix_tolerance is not None:
            assert abs(float(r["difference"])) <= mix_tolerance, r
    assert sum(int(r["accepted"]) for r in mix) == n

    [software] = markdown_tables(card, "## Device and software")
    stated_env = {r[""]: r["value"] for r in software}
    devices = {r["device"] for r in full_rows}
    assert devices == {f"{stated_env['device']}:{stated_env['device name']}"}, devices
    assert {r["torch_version"] for r in full_rows} == {stated_env["torch"]}
    assert {r["cuda_version"] for r in full_rows} == {stated_env["CUDA"]}
    hashes = {r["config_hash"] for r in full_rows}
    assert len(hashes) == 1 and f"config hash `{next(iter(hashes))}`" in card, hashes
    manifest = json.loads((folder / "opsynth" / "run.json").read_text())
    assert manifest["config_hash"] in hashes
    assert "opsynth run " in card and "--config config.toml" in card  # the regenerating command
    if recheck:
        facts, recheck_funnel = markdown_tables(card, "## Re-check")[:2]
        found = {r[""]: r["value"] for r in facts}
        assert int(found["rows re-checked"]) == int(found["passed"]) == n, found
        assert int(found["exact or near duplicates"]) == 0, found
        assert float(found["largest KernelBench AST similarity"]) <= KERNELBENCH_THRESHOLD
        assert found["device name"] == stated_env["device name"], found
        last = recheck_funnel[-1]
        assert int(last["passed"]) == n and last["stage"] == "dedup", last
    return {"rows": n, "config_hash": manifest["config_hash"], "device": devices.pop()}
