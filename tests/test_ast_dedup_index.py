"""The committed KernelBench structure index: reproducible from the source, structure only."""

from __future__ import annotations

import ast
import gzip
import json
import sys
import warnings

import pytest

from opsynth.ast_dedup.index import (
    DEFAULT_INDEX_PATH,
    KernelBenchIndex,
    KernelBenchIndexError,
    build_index,
    main,
    python_version,
    read_jsonl,
)
from opsynth.refdata import KERNELBENCH, shared_file


@pytest.fixture(scope="module")
def kernelbench_rows():
    path = shared_file(KERNELBENCH)
    if path is None:
        pytest.skip("KernelBench jsonl not found")
    return read_jsonl(path)


def test_committed_index_is_rebuilt_exactly_from_the_source(kernelbench_rows, tmp_path):
    committed = KernelBenchIndex.load()
    rebuilt = tmp_path / "rebuilt.json.gz"
    index = build_index(kernelbench_rows, committed.levels)
    # the Pythons it was checked under were found by running them (below, --verify-with)
    index.meta["pythons"] = committed.meta["pythons"]
    index.save(rebuilt)
    assert rebuilt.read_bytes() == DEFAULT_INDEX_PATH.read_bytes()
    assert python_version() in committed.meta["pythons"]  # the Python the tests run on


def test_other_pythons_are_recorded_only_if_they_parse_the_same(kernelbench_rows, tmp_path):
    """--verify-with rebuilds under each interpreter: the same structure is recorded as exact,
    a different one (here a stand-in interpreter that reports another digest) is not, and the
    build says so and exits 1."""
    source = shared_file(KERNELBENCH)
    other = tmp_path / "python-other"
    other.write_text("#!/bin/sh\necho 3.99 0000\n")
    other.chmod(0o755)
    out = tmp_path / "index.json.gz"
    args = ["--source", str(source), "--levels", "2", "--out", str(out), "--verify-with"]
    assert main([*args, sys.executable]) == 0
    assert KernelBenchIndex.load(out).meta["pythons"] == [python_version()]
    assert main([*args, sys.executable, str(other)]) == 1
    assert KernelBenchIndex.load(out).meta["pythons"] == [python_version()]


def test_loading_under_an_unchecked_python_warns(tmp_path, kernelbench_rows):
    index = build_index(kernelbench_rows, [2])
    index.meta["pythons"] = ["3.99"]
    path = tmp_path / "index.json.gz"
    index.save(path)
    with pytest.warns(UserWarning, match="3.99, running"):
        KernelBenchIndex.load(path)
    index.meta["pythons"] = ["3.99", python_version()]
    index.save(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        KernelBenchIndex.load(path)


def test_committed_index_covers_levels_1_to_3_with_provenance():
    index = KernelBenchIndex.load()
    counts = {level: len(index.select([level])) for level in (1, 2, 3)}
    assert counts == {1: 100, 2: 100, 3: 50}
    source = index.meta["source"]
    assert source["commit"] == "423217d9fda91e0c2d67e4a43bf62f96f6d104f1"
    assert source["license"] == "MIT"


def test_index_holds_no_source_text():
    raw = gzip.decompress(DEFAULT_INDEX_PATH.read_bytes()).decode()
    for fragment in ("def forward", "torch.randn", "get_inputs", "nn.Conv2d", "return x"):
        assert fragment not in raw
    data = json.loads(raw)
    assert all(isinstance(getattr(ast, name, None), type) for name in data["labels"])
    assert {"code", "source"}.isdisjoint(data["problems"][0])


def test_cli_builds_selected_levels(kernelbench_rows, tmp_path):
    out = tmp_path / "index.json.gz"
    source = shared_file(KERNELBENCH)
    assert main(["--source", str(source), "--levels", "2", "--out", str(out)]) == 0
    index = KernelBenchIndex.load(out)
    assert index.levels == [2]
    assert len(index.problems) == 100
    with pytest.raises(KernelBenchIndexError, match="levels"):
        index.select([1])


def test_missing_or_corrupt_index_is_a_clear_error(tmp_path):
    with pytest.raises(KernelBenchIndexError, match="does not exist"):
        KernelBenchIndex.load(tmp_path / "absent.json.gz")
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(KernelBenchIndexError, match="unreadable"):
        KernelBenchIndex.load(bad)


def test_problems_without_a_model_class_are_kept_but_not_scored():
    rows = [
        {"level": 1, "problem_id": 1, "name": "ok", "code": "class Model:\n    def f(self): ...\n"},
        {"level": 1, "problem_id": 2, "name": "nomodel", "code": "x = 1\n"},
        {"level": 1, "problem_id": 3, "name": "broken", "code": "def f(:\n"},
    ]
    index = build_index(rows, [1])
    assert [p.root is None for p in index.problems] == [False, True, True]
    assert [p.name for p in index.select([1])] == ["ok"]
