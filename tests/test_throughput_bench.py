"""The throughput benchmark's pure summaries (the benchmark itself runs by hand on a GPU)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from benchmarks.gpu_usage import parse_line, summarise
from benchmarks.proc_memory import descendants_rss
from benchmarks.throughput import (
    final_reasons,
    naive_run,
    naive_seconds_per_task,
    naive_subset,
    parse_args,
    relative_spread,
    reused_set,
    stage_times,
)
from opsynth.config import FiltersConfig
from opsynth.filters.samples import GOOD
from opsynth.record import Task, Verdict
from opsynth.store import write_tasks


def test_stage_times_and_final_reasons() -> None:
    rows = [
        Verdict("a", "static", True, "ok"),
        Verdict("a", "eager", True, "ok", elapsed_s=1.0, measures={"gpu_lock_wait_s": 0.25}),
        Verdict("a", "runtime", True, "ok", elapsed_s=0.5, measures={"gpu_exclusive_s": 0.75}),
        Verdict("a", "compile", False, "compile_error", elapsed_s=4.0),
        Verdict("b", "eager", True, "ok", elapsed_s=3.0),
    ]
    times = stage_times(rows)
    assert set(times) == {"eager", "runtime", "compile"}
    assert times["eager"] == {
        "rows": 2,
        "total_s": 4.0,
        "median_s": 2.0,
        "lock_wait_s": 0.25,
        "exclusive_s": 0.0,
    }
    assert times["runtime"]["exclusive_s"] == 0.75
    assert times["compile"]["lock_wait_s"] == 0.0
    assert final_reasons(rows) == {"a": "compile_error", "b": "ok"}


def test_relative_spread_is_a_median_over_shared_tasks() -> None:
    alone = {"a": 10.0, "b": 20.0, "c": 5.0}
    busy = {"a": 11.0, "b": 20.0, "c": 6.0, "d": 1.0}
    assert relative_spread(busy, alone) == 0.1
    assert relative_spread({}, alone) is None


def test_naive_subset_follows_the_pools_mix_of_final_reasons() -> None:
    """Eight in ten kept: a sample of five holds four kept and one rejected, whatever the seed
    (a plain random sample of five misses the rejected one about a third of the time)."""
    tasks = [Task(ops=["relu"], data_source="x", code=f"# {i}") for i in range(100)]
    final = {t.id: ("ok" if i % 5 else "too_fast") for i, t in enumerate(tasks)}
    for seed in range(20):
        picked = naive_subset(tasks, final, 5, seed)
        assert len({t.id for t in picked}) == 5
        assert sorted(final[t.id] for t in picked) == ["ok"] * 4 + ["too_fast"]
    assert naive_subset(tasks, final, 0, 0) == []
    assert len(naive_subset(tasks[:3], final, 5, 0)) == 3


def test_naive_cost_is_weighted_by_the_pools_final_reasons() -> None:
    final = {"a": "ok", "b": "ok", "c": "ok", "d": "too_fast", "e": "constant_output"}
    rows = [
        {"task_id": "a", "seconds": 12.0},
        {"task_id": "d", "seconds": 6.0},
    ]
    # ok: 3 x 12; too_fast: 1 x 6; constant_output (none ran): the mean of all that ran, 9
    assert naive_seconds_per_task(rows, final) == (36 + 6 + 9) / 5
    assert naive_seconds_per_task([], final) is None


def test_naive_harness_checks_a_task_as_its_data_source_allows(tmp_path: Path) -> None:
    """A task from transformers may import it; the same code from torch may not. The window
    is wide open: how fast a loaded CI core runs the task is not what this checks."""
    code = "from transformers.activations import ACT2FN\n" + GOOD
    cfg = FiltersConfig(
        warmup_runs=1, timed_runs=3, task_timeout_s=300.0, window_ms_cpu=(1e-6, 1e6)
    )
    tasks = [
        Task(ops=["nn.Linear"], data_source="transformers", code=code),
        Task(ops=["nn.Linear"], data_source="torch#1", code=code),
    ]
    rows = naive_run(tasks, cfg, "cpu", budget_s=600.0)["rows"]
    assert [r["reason"] for r in rows] == ["ok", "forbidden_import"]


def test_defaults_fit_the_gpu_host_budget() -> None:
    args = parse_args(["--out", "x"])
    assert args.naive_budget_s <= 180 and args.kb_limit == 0 and args.noise == 16


def test_an_earlier_runs_set_is_reused_in_its_order(tmp_path: Path) -> None:
    """``--tasks``: the sized set another run wrote comes back unchanged and in order, counted
    by where each row came from, so two runs differing in one setting filter the same set."""

    def task(name: str, source: str, meta: dict) -> Task:
        code = f"# {name}\nclass Model: pass\n"
        return Task(ops=["torch.relu"], data_source=source, code=code, meta=meta)

    tasks = [
        task("sized", "torch#2", {"sizing": {"chosen": 64}}),
        task("kb", "kernelbench_l2", {"level": 2}),
        task("ops6k", "torch#3", {}),
        task("kb2", "kernelbench_l2", {"level": 2}),
    ]
    write_tasks(tasks, tmp_path / "candidates.parquet")
    fixed, to_size, counts = reused_set(tmp_path / "candidates.parquet")
    assert [t.id for t in fixed] == [t.id for t in tasks] and to_size == []
    assert fixed[0].meta["sizing"] == {"chosen": 64}
    assert (counts["kernelbench_l2"], counts["ops6k"], counts["composed"]) == (2, 1, 1)
    args = parse_args(["--tasks", str(tmp_path / "candidates.parquet"), "--no-batch-timers"])
    assert args.tasks and not args.batch_timers


def test_memory_sampler_sees_a_child() -> None:
    import subprocess

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        assert any(size > 0 for size in descendants_rss(os.getpid()))
    finally:
        child.kill()
        child.wait()


def test_multi_gpu_comparison_separates_borderline_from_mismatch() -> None:
    from benchmarks.multi_gpu import compare, final_rows

    def rows(reasons: dict[str, tuple[str, float | None]], stage: str = "runtime") -> list[dict]:
        out = []
        for task, (reason, ms) in reasons.items():
            measures = {"eager_ms_median": ms} if ms is not None else {}
            out.append({"task_id": task, "stage": stage, "reason": reason, "measures": measures})
        return out

    one = final_rows(
        rows({"a": ("ok", 5.0), "b": ("ok", 1.02), "c": ("ok", 50.0), "d": ("ok", 9)})
        + rows({"e": ("oom", None), "f": ("oom", None)}, stage="eager")
    )
    two = final_rows(
        rows(
            {
                "a": ("ok", 5.1),
                "b": ("too_fast", 0.98),
                "c": ("too_fast", 0.5),
                "d": ("timeout", None),
            }
        )
        + rows({"e": ("resource_limit", None), "f": ("crashed", None)}, stage="eager")
    )
    result = compare(one, two, (1.0, 100.0), 0.1)
    assert result["identical"] == 1
    assert sorted(result["borderline"]) == ["b", "d"]  # near the 1 ms edge; a timeout
    assert result["memory_edge"] == ["e"]  # over the device's and the host's memory limits
    assert result["mismatch"] == ["c", "f"]  # 50 ms vs 0.5 ms; a crash is no memory limit


def test_filter_span_counts_sandboxed_stages_only() -> None:
    from benchmarks.multi_gpu import filter_span_s

    def row(stage: str, at: str) -> dict:
        return {"stage": stage, "created_at": f"2026-11-30T00:{at}+00:00"}

    rows = [row("static", "50:00"), row("decontam", "50:01"), row("eager", "51:10")]
    rows += [row("compile", "53:00"), row("runtime", "52:00")]
    assert filter_span_s(rows) == 110.0  # 51:10 -> 53:00; the prefilter's rows do not count
    assert filter_span_s(rows[:3]) is None


def test_steady_rate_leaves_out_ramp_up_and_tail() -> None:
    """Ten candidates: two stragglers at each end, six finishing a second apart in between.
    Each candidate counts at its last sandboxed verdict; the prefilter's rows never count."""
    from benchmarks.multi_gpu import steady_per_minute

    def row(task: str, stage: str, second: int) -> dict:
        minute, sec = divmod(second, 60)
        return {
            "task_id": task,
            "stage": stage,
            "created_at": f"2026-11-30T00:{minute:02}:{sec:02}",
        }

    finish = [0, 30, 40, 41, 42, 43, 44, 45, 100, 200]
    rows = [row(f"t{i}", "static", 0) for i in range(10)]
    rows += [row(f"t{i}", "eager", max(0, at - 5)) for i, at in enumerate(finish)]
    rows += [row(f"t{i}", "runtime", at) for i, at in enumerate(finish)]
    # quantiles 0.1 and 0.9 of 10 -> the 2nd (30 s) and the 9th (100 s) candidate: 7 in 70 s
    assert steady_per_minute(rows) == 6.0
    # 0.2 .. 0.8 -> 3rd (40 s) .. 8th (45 s): 5 candidates in 5 s
    assert steady_per_minute(rows, 0.2, 0.8) == 60.0
    assert steady_per_minute(rows[:12]) is None  # too few candidates for a rate


def test_usage_is_summarised_over_the_steady_window_only() -> None:
    """The samplers' readings are stamped; only those inside the steady window (here 30 s ..
    100 s past the minute) count, so the pools' idle start does not dilute the busy share."""
    from datetime import UTC, datetime

    from benchmarks.cpu_usage import CpuSampler
    from benchmarks.gpu_usage import GpuSampler, Sample
    from benchmarks.multi_gpu import steady_window, usage_within

    start = datetime(2026, 11, 30, 0, 0, 0, tzinfo=UTC).timestamp()

    def row(task: str, second: int) -> dict:
        minute, sec = divmod(second, 60)
        return {
            "task_id": task,
            "stage": "runtime",
            "created_at": f"2026-11-30T00:{minute:02}:{sec:02}+00:00",
        }

    finish = [0, 30, 40, 41, 42, 43, 44, 45, 100, 200]
    rows = [row(f"t{i}", at) for i, at in enumerate(finish)]
    count, low, high = steady_window(rows)
    assert (count, low.timestamp() - start, high.timestamp() - start) == (7, 30.0, 100.0)

    cpu, gpu = CpuSampler(), GpuSampler()
    for second, share in ((5, 0.0), (50, 0.8), (90, 0.6), (150, 0.0)):
        cpu.shares.append(share)
        cpu.stamps.append(start + second)
        gpu.samples.append(Sample(0, share * 100, 1000.0, 143771.0))
        gpu.stamps.append(start + second)
    usage = usage_within([rows], cpu, gpu)
    assert usage["cpu"]["samples"] == 2 and usage["cpu"]["busy_mean_pct"] == 70.0
    assert usage["gpu"]["0"]["utilization_mean_pct"] == 70.0
    assert usage_within([rows[:1]], cpu, gpu)["cpu"]["samples"] == 4  # no window: the whole run
    # side-by-side copies: from the earliest copy's window start to the latest one's end
    later = [row(f"t{i}", at + 50) for i, at in enumerate(finish)]
    assert usage_within([rows, later], cpu, gpu)["cpu"]["samples"] == 3


def test_cpu_busy_share_of_a_core_set(tmp_path: Path) -> None:
    """A run pinned to some cores is judged by those cores' lines of /proc/stat alone."""
    import subprocess

    from benchmarks import cpu_usage

    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  600 0 0 1400 0 0 0 0 0 0\n"
        "cpu0 500 0 0 500 0 0 0 0 0 0\n"
        "cpu1 100 0 0 900 0 0 0 0 0 0\n"
        "intr 1 2 3\n"
    )
    assert cpu_usage.read_times(str(stat)) == (600, 2000)
    assert cpu_usage.read_times(str(stat), frozenset({1})) == (100, 1000)
    assert cpu_usage.read_times(str(stat), frozenset({0, 1})) == (600, 2000)
    assert cpu_usage.read_times(str(stat), frozenset({7})) is None

    core = max(os.sched_getaffinity(0))
    spin = subprocess.Popen(
        [sys.executable, "-c", "while True: pass"],
        preexec_fn=lambda: os.sched_setaffinity(0, {core}),
    )
    try:
        time.sleep(0.3)
        with cpu_usage.CpuSampler(every_s=0.2, cpus=[core]) as sampler:
            time.sleep(1.0)
    finally:
        spin.kill()
        spin.wait()
    assert sampler.overall is not None and sampler.overall >= 0.5  # the spinning core


def test_size_only_writes_the_sized_set_in_filtering_order(
    tmp_path: Path, catalogue_seeds: list
) -> None:
    """``--size-only`` sizes the composed candidates on a warm pool and writes the whole set,
    seeded-shuffled as a full run would filter it, without filtering: the set a multi-GPU run
    then takes. The session's small catalogue stands in for an extracted one (``--catalogue``)."""
    from benchmarks.throughput import candidate_set, filtering_order, main
    from opsynth.store import read_tasks, write_tasks

    shared = Path(__file__).resolve().parents[2] / "shared"
    out = tmp_path / "out"
    catalogue = tmp_path / "catalogue"
    catalogue.mkdir()
    write_tasks(catalogue_seeds, catalogue / "seeds.parquet")
    argv = [
        "--catalogue",
        str(catalogue),
        "--kernelbench",
        str(shared / "kernelbench" / "kernelbench.jsonl"),
        "--kb-limit",
        "2",
        "--ops6k",
        str(shared / "ops6k" / "cuda_agent_ops_6k.parquet"),
        "--ops6k-n",
        "2",
        "--composed",
        "3",
        "--device",
        "cpu",
        "--workers",
        "2",
        "--size-only",
        "--out",
        str(out),
    ]
    result = main(argv)
    written = read_tasks(out / "candidates.parquet")
    assert result["candidates"] == len(written) == 7
    assert not (out / "pool-verdicts.parquet").exists()  # nothing was filtered
    sized = [t for t in written if "sizing" in t.meta]
    assert len(sized) == 3 and all(t.data_source.startswith("torch") for t in sized)
    # undo the seeded shuffle (it depends on the length alone): the fixed tasks come first, in
    # the order the candidate set lists them, then the sized ones
    moved = filtering_order(list(range(len(written))), seed=0)
    unshuffled = [written[moved.index(i)] for i in range(len(written))]
    fixed, _, _ = candidate_set(parse_args(argv[:-2] + ["--composed", "0"]))
    assert [t.id for t in unshuffled[:4]] == [t.id for t in fixed]
    assert all("sizing" in t.meta for t in unshuffled[4:])


def test_multi_gpu_phases_line_up_marks_pools_and_verdicts() -> None:
    from datetime import UTC, datetime

    from benchmarks.multi_gpu import phases

    start = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC).timestamp()

    def row(stage: str, second: int) -> dict:
        return {"stage": stage, "created_at": f"2026-11-30T12:00:{second:02}+00:00"}

    marks = {"started_at": start, "flow_started_at": start + 12.34, "screened_at": start + 58.0}
    pools = [
        {"started_at": start + 3.0, "start_s": 20.04, "last_result_at": start + 50.04},
        {"started_at": start + 3.5, "start_s": 25.0, "last_result_at": start + 55.0},
        {"started_at": None, "start_s": None},  # a pool that never started counts nowhere
    ]
    rows = [row("static", 14), row("decontam", 15), row("eager", 30), row("compile", 55)]
    assert phases(marks, pools, rows) == {
        "flow_running_s": 12.3,
        "prefilter_done_s": 15.0,
        "pools_ready_s": [23.0, 28.5],
        "pools_done_s": [50.0, 55.0],
        "first_verdict_s": 30.0,
        "last_verdict_s": 55.0,
        "flow_done_s": 58.0,
    }
    assert phases(marks, [], rows[:2])["first_verdict_s"] is None


def test_multi_gpu_runs_name_gpus_an_optional_core_share_and_copies() -> None:
    import argparse

    from benchmarks.multi_gpu import RunSpec, copy_slices, parse_args, parse_run, run_label

    assert parse_run("2") == RunSpec(2, 0, 1) and parse_run("1/16") == RunSpec(1, 16, 1)
    assert parse_run("2x1/16") == RunSpec(1, 16, 2) and parse_run("3x2") == RunSpec(2, 0, 3)
    for bad in ("0", "two", "1/-4", "1/x", "0x1", "yx1/16"):
        with pytest.raises(argparse.ArgumentTypeError, match="GPU"):
            parse_run(bad)
    args = parse_args(["--candidates", "c.parquet", "--gpus", "1/16", "2", "1", "2x1/16"])
    assert args.gpus == [(1, 16, 1), (2, 0, 1), (1, 0, 1), (1, 16, 2)]
    labels = [run_label(spec.gpus, spec.cores) for spec in args.gpus]
    assert labels == ["gpus-1-cores-16", "gpus-2", "gpus-1", "gpus-1-cores-16"]
    assert run_label(1, 16, copy=1) == "gpus-1-cores-16-copy-1"
    # side-by-side copies get disjoint cores and GPUs; without a core count they split the host
    cores = list(range(32))
    assert copy_slices(RunSpec(1, 16, 2), cores) == [(cores[:16], [0]), (cores[16:], [1])]
    assert copy_slices(RunSpec(2, 0, 2), cores) == [(cores[:16], [0, 1]), (cores[16:], [2, 3])]
    assert copy_slices(RunSpec(2, 0, 1), cores) == [(cores, [0, 1])]
    with pytest.raises(ValueError, match="needs 48 cores, this process may use 32"):
        copy_slices(RunSpec(1, 16, 3), cores)
    # each copy starts at its own point of the set, so heavy candidates do not coincide
    from benchmarks.multi_gpu import rotated

    assert [rotated(list(range(6)), i, 3) for i in range(3)] == [
        [0, 1, 2, 3, 4, 5],
        [2, 3, 4, 5, 0, 1],
        [4, 5, 0, 1, 2, 3],
    ]


def test_side_by_side_copies_add_up_against_a_single_run() -> None:
    """Two copies of a one-GPU run side by side (each on the whole candidate set) against one
    alone: rates add up, times are the slower copy's, every copy's verdicts are compared."""
    import argparse
    from datetime import UTC, datetime

    from benchmarks.cpu_usage import CpuSampler
    from benchmarks.gpu_usage import GpuSampler
    from benchmarks.multi_gpu import RunSpec, combine, summarise, table

    start = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC).timestamp()

    def copy(finish: list[int], reasons: list[str], wall: float, offset: float = 0.0) -> dict:
        rows = [
            {
                "task_id": f"t{i}",
                "stage": "runtime",
                "reason": reason,
                "created_at": f"2026-11-30T12:{at // 60:02}:{at % 60:02}+00:00",
                "measures": {"eager_ms_median": 10.0},
            }
            for i, (at, reason) in enumerate(zip(finish, reasons, strict=True))
        ]
        marks = {"started_at": start + offset, "flow_started_at": start + 5, "screened_at": start}
        pool = {"started_at": start + 1, "start_s": 9.0, "last_result_at": start + max(finish)}
        return {"tasks": len(rows), "cores": 16, "wall_s": wall, "marks": marks,
                "pools": [pool], "rows": rows}  # fmt: skip

    ok = ["ok"] * 10
    alone = copy([10 * (i + 1) for i in range(10)], ok, 120.0)  # 10 s per candidate
    fast = copy([20 + 5 * i for i in range(10)], ok, 80.0)  # 5 s per candidate
    slow = copy([20 + 10 * i for i in range(10)], ok[:9] + ["crashed"], 130.0, offset=1.0)
    idle = (CpuSampler(), GpuSampler())
    runs = [
        combine(RunSpec(1, 16), [alone], *idle),
        combine(RunSpec(1, 16, 2), [fast, slow], *idle),
    ]
    assert runs[1]["steady_per_minute"] == 12.0 + 6.0 and runs[1]["wall_s"] == 130.0
    assert runs[1]["filter_span_s"] == 90.0 and runs[1]["per_minute"] == round(20 / 130 * 60, 1)
    assert runs[1]["phases"]["pools_done_s"] == [65.0, 110.0]  # from the earlier copy's start
    args = argparse.Namespace(
        shard_size=16, shards_per_worker=2, workers_per_gpu=16, candidates_per_process=8,
        device="cuda", borderline=0.1,
    )  # fmt: skip
    both = summarise(args, runs)["runs"][1]
    assert both["steady_speedup"] == 3.0  # 18/min against 6/min alone
    assert both["speedup"] == round(120 * 2 / 130, 2)  # twice the candidates in 130 s
    assert both["filter_span_speedup"] == 2.0  # twice the candidates over 90 s against 90 s
    assert both["kept"] == [10, 9]
    assert both["verdicts_vs_first"]["tasks"] == 20 and both["verdicts_vs_first"]["mismatch"] == [
        "t9"
    ]
    assert "| 2 x 1 side by side | 32 |" in table(summarise(args, runs))


def test_gpu_samples_are_summarised_per_gpu() -> None:
    lines = ["0, 80, 130000, 143771", "1, 20, 1000, 143771", "0, 40, 2000, 143771", "junk"]
    samples = [s for s in map(parse_line, lines) if s is not None]
    assert len(samples) == 3
    summary = summarise(samples)
    assert summary["0"]["utilization_mean_pct"] == 60.0
    assert summary["0"]["memory_peak_gib"] == 127.0
    assert summary["0"]["memory_nearly_full_share"] == 0.5
    assert summary["1"]["samples"] == 1 and summary["1"]["memory_nearly_full_share"] == 0.0


def test_host_cpu_busy_share_from_proc_stat() -> None:
    """Busy = everything but idle and iowait; the share is over the interval between two
    readings, so a core spinning in a child shows up in a live sample."""
    import subprocess

    from benchmarks import cpu_usage

    before = cpu_usage.cpu_times("cpu  100 0 50 800 50 0 0 0 0 0")
    after = cpu_usage.cpu_times("cpu  400 0 150 900 50 0 0 0 0 0")
    assert before == (150, 1000) and after == (550, 1500)
    assert cpu_usage.busy_share(before, after) == 0.8
    assert (
        cpu_usage.cpu_times("cpu0 1 2 3 4") is None and cpu_usage.busy_share(after, after) is None
    )
    summary = cpu_usage.summarise([0.95, 0.5, 0.99, 0.2])
    assert summary == {
        "samples": 4,
        "busy_mean_pct": 66.0,
        "busy_median_pct": 72.5,
        "saturated_share": 0.5,
    }
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with cpu_usage.CpuSampler(every_s=0.2) as sampler:
            time.sleep(1.0)
    finally:
        spin.kill()
        spin.wait()
    found = sampler.summary()
    assert found is not None and found["samples"] >= 3
    assert found["busy_overall_pct"] >= 100 / (os.cpu_count() or 1) * 0.5  # one core's worth


def test_context_waits_read_the_same_from_verdicts_and_parquet_rows() -> None:
    """``multi_gpu.py`` reads verdicts back from parquet (measures as JSON text); the
    throughput benchmark has them in memory: both give the same context summary. A reused
    process's later candidate created no context: it counts for waits only."""
    import json

    from benchmarks.throughput import device_init

    measures = [
        {"device_init_s": 4.0, "device_wait_s": 0.0},
        {"device_init_s": 6.0, "device_wait_s": 1.5},
        {"device_init_s": 9.0, "device_wait_s": 3.0},
        {"device_init_s": 0.0, "device_wait_s": 0.0, "context_reused": True},
    ]
    verdicts = [Verdict(f"t{i}", "eager", True, "ok", measures=m) for i, m in enumerate(measures)]
    verdicts.append(Verdict("t0", "runtime", True, "ok", measures={"device_wait_s": 99.0}))
    rows = [{**v.__dict__, "measures": json.dumps(v.measures)} for v in verdicts]
    expected = {
        "contexts_created": 3,
        "creation_median_s": 6.0,
        "wait_median_s": 0.75,
        "wait_total_s": 4.5,
    }
    assert device_init(verdicts) == expected
    assert device_init(rows) == expected
    assert device_init(verdicts[-1:]) is None
    on_cpu = {"device_init_s": 0.0, "device_wait_s": 0.0, "device_warm_s": 0.0}
    assert device_init([Verdict("c", "eager", True, "ok", measures=on_cpu)]) is None
