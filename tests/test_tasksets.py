"""KernelBench readers against the real reference files in ../shared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opsynth.filters.calibrate import speed_factor
from opsynth.refdata import KERNELBENCH, shared_file
from opsynth.tasksets import load_kernelbench, load_kernelbench_timings

TIMING = Path("timing") / "H100_Modal" / "baseline_time_torch.json"


def timing_file() -> Path:
    problems = shared_file(KERNELBENCH)
    if problems is None or not (problems.parent / TIMING).exists():
        pytest.skip("KernelBench reference data (kernelbench.jsonl, timing/) is not there")
    return problems.parent / TIMING


def test_timings_key_every_level2_problem_by_id() -> None:
    timings = load_kernelbench_timings(timing_file(), 2)
    problems = load_kernelbench(timing_file().parents[2] / KERNELBENCH.name, [2])
    ids = {t.meta["problem_id"] for t in problems}
    assert len(timings) == 100 and set(timings) == ids
    assert all(ms > 0 for ms in timings.values())


def test_a_device_twice_as_fast_gets_factor_two() -> None:
    reference = load_kernelbench_timings(timing_file(), 2)
    local = {k: v / 2 for k, v in reference.items()}
    assert speed_factor(local, reference) == pytest.approx(2.0)


def test_a_file_without_the_level_is_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "timing.json"
    bad.write_text('{"level1": {}}')
    with pytest.raises(ValueError, match="not a KernelBench timing file with level 2") as info:
        load_kernelbench_timings(bad, 2)
    assert "\n" not in str(info.value)


def test_one_loader_reads_every_task_file_kind_and_names_what_is_wrong(tmp_path: Path) -> None:
    from opsynth.filters.samples import GOOD
    from opsynth.record import Task
    from opsynth.store import write_tasks
    from opsynth.tasksets import TaskSetError, load_task_file

    (tmp_path / "one.py").write_text(GOOD)
    assert [t.code for t in load_task_file(tmp_path / "one.py")] == [GOOD]
    row = {"level": 2, "problem_id": 7, "name": "7_Conv_ReLU", "code": GOOD}
    (tmp_path / "kb.jsonl").write_text(json.dumps(row) + "\n" + json.dumps({**row, "level": 1}))
    assert [t.meta["level"] for t in load_task_file(tmp_path / "kb.jsonl", [2])] == [2]
    write_tasks([Task(ops=["a"], data_source="torch#1", code=GOOD)], tmp_path / "set.parquet")
    assert [t.ops for t in load_task_file(tmp_path / "set.parquet")] == [["a"]]
    (tmp_path / "fake.parquet").write_text("not parquet")
    (tmp_path / "notes.txt").write_text("")
    for name, problem in [
        ("missing.parquet", "no such file"),
        ("fake.parquet", "not a readable parquet"),
        ("notes.txt", "expected a .parquet"),
    ]:
        with pytest.raises(TaskSetError, match=problem) as raised:
            load_task_file(tmp_path / name)
        assert "\n" not in str(raised.value)
