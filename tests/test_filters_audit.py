"""Audit core: loading Ops-6K-shaped parquet and auditing a small mixed task set."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from opsynth.config import FiltersConfig
from opsynth.filters.audit import audit_tasks
from opsynth.filters.pool import job_stages
from opsynth.filters.samples import GOOD, task_source
from opsynth.tasksets import load_task_set

OPS6K = Path("/work/shared/ops6k/cuda_agent_ops_6k.parquet")
CACHE = Path(__file__).resolve().parent.parent / ".cache" / "test-compile"


def write_parquet(path: Path, rows: list[dict[str, str]]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_load_task_set_reads_ops6k_shape(tmp_path: Path) -> None:
    path = write_parquet(
        tmp_path / "set.parquet",
        [
            {
                "ops": json.dumps(["nn.Linear", "torch.relu"]),
                "data_source": "torch#2",
                "code": GOOD,
            },
            {"ops": "BertSelfOutput_0", "data_source": "transformers", "code": GOOD + "\n"},
        ],
    )
    tasks = load_task_set(path)
    assert [t.ops for t in tasks] == [["nn.Linear", "torch.relu"], ["BertSelfOutput_0"]]
    assert [t.data_source for t in tasks] == ["torch#2", "transformers"]
    assert tasks[0].meta == {"source": "set.parquet", "row": 0}
    assert len({t.id for t in tasks}) == 2


def test_load_task_set_names_missing_columns(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "bad.parquet", [{"ops": "[]", "code": GOOD}])
    with pytest.raises(ValueError, match="data_source"):
        load_task_set(path)


@pytest.mark.skipif(not OPS6K.exists(), reason="Ops-6K reference data absent")
def test_load_released_ops6k() -> None:
    tasks = load_task_set(OPS6K)
    assert len(tasks) == 6000
    assert all(t.ops and t.code and t.data_source for t in tasks)


def test_audit_keeps_good_and_counts_each_drop(tmp_path: Path) -> None:
    path = write_parquet(
        tmp_path / "mixed.parquet",
        [
            {"ops": '["nn.Linear"]', "data_source": "torch#1", "code": GOOD},
            {"ops": '["os"]', "data_source": "torch#1", "code": "import os\n" + GOOD},
            {"ops": '["mul"]', "data_source": "torch#1", "code": task_source("return x * 0")},
            {"ops": '["mul"]', "data_source": "torch#1", "code": task_source("return x * 0")},
        ],
    )
    tasks = load_task_set(path)
    cfg = FiltersConfig(
        workers=1, cache_dir=str(CACHE), task_timeout_s=180.0, window_ms_cpu=(0.0, 60000.0)
    )
    seen: list[tuple[int, int]] = []
    result = audit_tasks(tasks, cfg, "cpu", progress=lambda d, n: seen.append((d, n)))
    assert result.counts["input"] == 4
    assert result.counts["kept"] == 1
    assert result.counts["dropped_forbidden_import"] == 1
    assert result.counts["dropped_constant_output"] == 2
    assert [t.ops for t in result.kept] == [["nn.Linear"]]
    assert len(result.dropped) == 3
    assert seen[-1] == (2, 2)  # the duplicate is evaluated once
    kept_stages = [v.stage for v in result.verdicts if v.task_id == tasks[0].id]
    assert kept_stages == ["static", *job_stages(cfg)]
    static_rows = [v for v in result.verdicts if v.stage == "static"]
    assert len(static_rows) == 4 and all(v.device.startswith("cpu:") for v in static_rows)
