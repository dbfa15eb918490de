"""Workload sizing: the knob rewrite, the rescale loop, and a real measurement in the sandbox."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from opsynth.config import ComposeConfig, FiltersConfig, SizingConfig
from opsynth.filters.pool import WorkerPool, job_stages, measure_overrides
from opsynth.filters.sizing import (
    Probe,
    Search,
    claimed,
    find_knob,
    set_knob,
    size_tasks,
    target_ms,
)
from opsynth.record import Task
from opsynth.synth.compose import compose

CACHE = Path(__file__).resolve().parent.parent / ".cache" / "test-compile"
CFG = SizingConfig()
WINDOW = (1.0, 100.0)

ELEMENTWISE = """\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.tanh(x) * 2.0 + x


batch_size = {batch}  # rows
features = 4096


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return []
"""


def task(batch: int = 8) -> Task:
    return Task(ops=["torch.tanh"], data_source="torch#1", code=ELEMENTWISE.format(batch=batch))


def linear_device(
    per_row_ms: float,
    overhead_ms: float = 0.01,
    fail_above: int | None = None,
    per_row_gib: float | None = None,
):
    """A model of a device: runtime = launch overhead + per-row cost; too large fails; with
    ``per_row_gib``, a GPU that also reports the memory peak (0.25 GiB of context-free base)."""
    calls: list[int] = []

    def measure(tasks: list[Task]) -> dict[str, Probe]:
        out = {}
        for t in tasks:
            knob = find_knob(t.code, CFG.constant_names)
            assert knob is not None
            calls.append(knob.value)
            if fail_above is not None and knob.value > fail_above:
                out[t.id] = Probe(None, "model", "resource_limit")
            else:
                gib = None if per_row_gib is None else 0.25 + per_row_gib * knob.value
                out[t.id] = Probe(overhead_ms + per_row_ms * knob.value, "model", device_gib=gib)
        return out

    return measure, calls


def test_knob_is_the_single_literal_and_only_it_changes() -> None:
    code = ELEMENTWISE.format(batch=8)
    knob = find_knob(code, ["batch_size"])
    assert knob is not None and (knob.name, knob.value) == ("batch_size", 8)
    resized = set_knob(code, knob, 1234)
    assert "batch_size = 1234  # rows" in resized
    assert resized.replace("1234", "8") == code


def test_catalogue_seed_and_composed_code_are_resizable_through_batch_size(
    catalogue_seeds,
) -> None:
    seed = next(t for t in catalogue_seeds if t.ops == ["F.gelu"])
    knob = find_knob(seed.code, ["batch_size"])
    assert knob is not None and knob.value == seed.meta["seed"]["input_shapes"][0][0]
    assert "batch_size = 7\n" in set_knob(seed.code, knob, 7)
    others = {t.ops[0]: 0.0 for t in catalogue_seeds if t.ops != ["F.gelu"]}
    cfg = ComposeConfig(profile="uniform", mix={"torch#1": 1.0}, op_weights=others)
    [composed] = compose(catalogue_seeds, cfg, n=1)
    knob = find_knob(composed.code, ["batch_size"])
    assert knob is not None and knob.value == composed.meta["batch_size"]
    assert "batch_size = 7 * scale" in set_knob(composed.code, knob, 7)


def test_no_knob_or_two_literals_leave_the_task_alone() -> None:
    assert find_knob("batch_size = 2 * 16\n", ["batch_size"]) is None
    assert find_knob("n = 16\n", ["batch_size"]) is None
    assert find_knob("def broken(:\n", ["batch_size"]) is None
    plain = Task(ops=["x"], data_source="torch#1", code="n = 16\n")
    measure, calls = linear_device(0.01)
    [out] = size_tasks([plain], measure, WINDOW, CFG)
    assert out.id == plain.id and calls == []
    assert out.meta["sizing"]["note"] == "no batch_size constant"


def test_a_too_fast_task_grows_into_the_band_around_the_log_middle() -> None:
    measure, calls = linear_device(per_row_ms=0.002)  # 8 rows: 0.026 ms
    [out] = size_tasks([task(8)], measure, WINDOW, CFG)
    record = out.meta["sizing"]
    assert target_ms(WINDOW) == pytest.approx(10.0)
    assert calls[0] == 8 and len(calls) <= CFG.max_steps + 1
    final_ms = record["steps"][-1]["ms"]
    assert 10.0 / CFG.band <= final_ms <= 10.0 * CFG.band
    assert record["chosen"] == calls[-1] and record["from_id"] == task(8).id
    assert f"batch_size = {calls[-1]}" in out.code and out.id != task(8).id
    assert record["device"] == "model" and record["target_ms"] == pytest.approx(10.0)


def test_a_task_in_the_band_is_measured_once_and_kept() -> None:
    measure, calls = linear_device(per_row_ms=1.0)  # 8 rows: ~8 ms
    original = task(8)
    [out] = size_tasks([original], measure, WINDOW, CFG)
    assert calls == [8] and out.id == original.id and "from_id" not in out.meta["sizing"]


def test_a_too_slow_task_shrinks_and_steps_are_clamped() -> None:
    measure, calls = linear_device(per_row_ms=5.0)  # 8 rows: 40 ms
    [out] = size_tasks([task(8)], measure, WINDOW, CFG)
    assert calls == [8, 2] and out.meta["sizing"]["chosen"] == 2  # 2 rows: 10 ms
    floor, floored = linear_device(per_row_ms=500.0)
    [smallest] = size_tasks([task(8)], floor, WINDOW, CFG)
    assert floored == [8, 1] and smallest.meta["sizing"]["chosen"] == 1  # never below 1
    grow, grown = linear_device(per_row_ms=1e-7)
    size_tasks([task(8)], grow, WINDOW, CFG)
    assert grown[1] == 8 * CFG.max_step_scale  # one step grows at most 64x


def test_a_variant_that_fails_is_never_chosen_over_one_that_ran() -> None:
    measure, calls = linear_device(per_row_ms=0.0001, fail_above=100)
    original = task(8)
    [out] = size_tasks([original], measure, WINDOW, CFG)
    steps = out.meta["sizing"]["steps"]
    assert steps[1]["ms"] is None and steps[1]["reason"] == "resource_limit"
    assert out.id == original.id and out.meta["sizing"]["chosen"] == 8


def test_size_never_exceeds_max_value() -> None:
    cfg = CFG.model_copy(update={"max_value": 100})
    measure, calls = linear_device(per_row_ms=1e-6)
    size_tasks([task(8)], measure, WINDOW, cfg)
    assert max(calls) == 100 and len(calls) == 2  # clamped, then no new value to try


def test_growth_stops_at_the_device_memory_cap() -> None:
    """Wanting 512 rows for 10 ms, but 512 rows would hold 8.25 GiB: with a 4 GiB cap the task
    grows only as far as its measured memory allows, and the record keeps every peak."""
    uncapped, _ = linear_device(per_row_ms=0.02, per_row_gib=1 / 64)
    no_cap = CFG.model_copy(update={"max_device_gib": 0.0})
    [free] = size_tasks([task(8)], uncapped, WINDOW, no_cap)
    assert free.meta["sizing"]["chosen"] == 512
    cfg = CFG.model_copy(update={"max_device_gib": 4.0})
    capped, calls = linear_device(per_row_ms=0.02, per_row_gib=1 / 64)
    [out] = size_tasks([task(8)], capped, WINDOW, cfg)
    record = out.meta["sizing"]
    assert record["chosen"] < 512 and calls[-1] == record["chosen"]
    assert all(st["device_gib"] <= 4.0 for st in record["steps"])
    assert record["max_device_gib"] == 4.0


def test_a_task_over_the_memory_cap_shrinks_even_inside_the_band() -> None:
    cfg = CFG.model_copy(update={"max_device_gib": 2.0})
    measure, calls = linear_device(per_row_ms=0.01, per_row_gib=1 / 128)  # 1024: 10 ms, 8.25 GiB
    [out] = size_tasks([task(1024)], measure, WINDOW, cfg)
    assert calls[0] == 1024 and len(calls) >= 2
    record = out.meta["sizing"]
    chosen = next(st for st in record["steps"] if st["value"] == record["chosen"])
    assert chosen["device_gib"] <= 2.0 and record["chosen"] < 1024
    # without memory readings (a CPU probe) the cap changes nothing
    cpu, cpu_calls = linear_device(per_row_ms=0.01)
    [kept] = size_tasks([task(1024)], cpu, WINDOW, cfg)
    assert cpu_calls == [1024] and kept.meta["sizing"]["chosen"] == 1024


def test_sizing_measures_in_the_sandboxed_pool() -> None:
    """A real probe on CPU: a task far below the window is grown until its measured eager time
    lies within the band around the window's log-middle."""
    window = (0.1, 1000.0)  # the CPU default; log-middle 10 ms
    # Two workers on a 2-core host get one intra-op thread each: a 2-thread forward on busy
    # cores waits for its preempted second thread and reads milliseconds for microseconds.
    cfg = FiltersConfig(workers=2, cache_dir=str(CACHE), window_ms_cpu=window)
    sizing = SizingConfig(max_steps=4)
    with WorkerPool(cfg, "cpu") as pool:

        def measure(tasks: list[Task]) -> dict[str, Probe]:
            out = {}
            overrides = measure_overrides(sizing.probe_warmup_runs, sizing.probe_timed_runs)
            for task_id, rows in pool.measure(tasks, overrides).items():
                last = rows[-1]
                assert [v.stage for v in rows] == ["eager", "runtime"], rows
                assert last.measures["timed_runs"] == sizing.probe_timed_runs == 3
                out[task_id] = Probe(last.measures["scaled_ms"], last.device)
            return out

        [out] = size_tasks([task(1)], measure, window, sizing)
    record = out.meta["sizing"]
    ms = [step["ms"] for step in record["steps"]]
    assert record["device"].startswith("cpu")
    assert ms[0] < 10.0 / 3  # one row of 4096 is far too fast
    best = min(ms, key=lambda m: abs(math.log(m / 10.0)))
    assert 10.0 / 3 <= best <= 10.0 * 3, record
    assert record["chosen"] > 1


def test_sized_tasks_take_their_originals_place_and_history() -> None:
    from opsynth.record import Verdict
    from opsynth.verdicts import adopt_sized

    a, b, c = task(8), task(16), task(32)
    grown = Task(ops=a.ops, data_source=a.data_source, code=task(64).code, meta={"sizing": {}})
    same_as_c = Task(ops=b.ops, data_source=b.data_source, code=c.code)
    compose_rows = [Verdict(t.id, "compose", True, "ok") for t in (a, b, c)]
    originals, candidates, verdicts = adopt_sized(
        [a, b], [grown, same_as_c], [a, b, c], compose_rows
    )
    assert [t.id for t in originals] == [grown.id, b.id]  # b's size is c's code: b stays
    assert [t.id for t in candidates] == [grown.id, b.id, c.id]
    assert [v.task_id for v in verdicts] == [grown.id, b.id, c.id]


def test_sizes_straddling_the_target_are_bisected() -> None:
    """Runtime jumps when the working set leaves the cache: 512 rows is too fast, 2048 too
    slow, and the linear step would bounce between them; the loop tries 1024."""

    def measure(tasks: list[Task]) -> dict[str, Probe]:
        out = {}
        for t in tasks:
            rows = find_knob(t.code, CFG.constant_names).value
            out[t.id] = Probe(rows * (0.005 if rows <= 512 else 0.02), "model")
        return out

    [out] = size_tasks([task(512)], measure, WINDOW, CFG)
    values = [step["value"] for step in out.meta["sizing"]["steps"]]
    assert values == [512, 2048, 1024]
    assert out.meta["sizing"]["chosen"] == 1024, out.meta["sizing"]


def test_the_memory_limit_follows_the_largest_measured_batch() -> None:
    """The first probe is mostly fixed memory (0.25 GiB base at 64 rows), so its linear estimate
    is far too pessimistic; each larger measurement refines the limit, and the task grows to
    the largest power of two, or three times one, that fits 4 GiB (3840 rows would; 3072 is
    that rung, 2048 the power of two below it)."""
    cfg = CFG.model_copy(update={"max_device_gib": 4.0})
    measure, calls = linear_device(per_row_ms=0.0002, per_row_gib=1 / 1024)
    [out] = size_tasks([task(64)], measure, WINDOW, cfg)
    record = out.meta["sizing"]
    assert calls[0] == 64 and record["chosen"] == 3072
    assert all(st["device_gib"] <= 4.0 for st in record["steps"])


def steps(*pairs: tuple[int, float | None]) -> list[dict]:
    return [{"value": value, "ms": ms, "reason": ""} for value, ms in pairs]


def test_one_search_chooses_as_the_sizer_does() -> None:
    """``filters.size_inline`` drives one ``Search`` in a candidate's process; the sizer
    drives many over task variants. Same measurements, same steps and choice."""
    for per_row in (0.00002, 0.002, 1.0, 40.0):
        measure, _ = linear_device(per_row_ms=per_row)
        [out] = size_tasks([task(8)], measure, WINDOW, CFG)
        search, value = Search(8, target_ms(WINDOW), CFG), 8
        while value is not None:
            variant = Task(ops=["t"], data_source="torch#1", code=ELEMENTWISE.format(batch=value))
            value = search.observe(measure([variant])[variant.id])
        assert search.steps == out.meta["sizing"]["steps"]
        assert search.chosen() == out.meta["sizing"]["chosen"]


def test_a_claim_is_applied_here_and_recorded_as_the_processs() -> None:
    original = task(8)
    claim = {"chosen": 64, "steps": steps((8, 0.9), (64, 9.5)), "seconds": 1.0}
    out = claimed(original, claim, "cuda:H200", WINDOW, CFG)
    assert out.code == set_knob(original.code, find_knob(original.code, ["batch_size"]), 64)
    record = out.meta["sizing"]
    assert record["chosen"] == 64 and record["from_id"] == original.id
    assert record["measured"] == "in_filter_process" and record["device"] == "cuda:H200"
    assert record["steps"] == claim["steps"] and "seconds" not in record
    # only the fields a step has reach the record
    padded = {**claim, "steps": [{**step, "note": "x" * 1000} for step in claim["steps"]]}
    again = claimed(original, padded, "cuda:H200", WINDOW, CFG).meta["sizing"]
    assert again["steps"] == claim["steps"]
    kept = claimed(original, {"chosen": 8, "steps": steps((8, 9.0))}, "cpu", WINDOW, CFG)
    assert kept.id == original.id and "from_id" not in kept.meta["sizing"]


@pytest.mark.parametrize(
    "claim",
    [
        None,
        {},
        {"chosen": 3, "steps": steps((8, 0.1), (64, 9.0))},  # never measured
        {"chosen": 40, "steps": steps((8, 0.1), (40, 9.0))},  # not a power of two (or 3x one)
        {"chosen": 64, "steps": steps((16, 0.1), (64, 9.0))},  # did not start as composed
        {"chosen": 1 << 30, "steps": steps((8, 0.1), (1 << 30, 9.0))},  # over max_value
        {"chosen": True, "steps": steps((8, 0.1))},
        {"chosen": 64, "steps": steps(*[(8, 0.1)] + [(64, 9.0)] * 9)},  # more than max_steps
        {"chosen": 64, "steps": [{"value": 8, "ms": "fast"}, {"value": 64, "ms": 9.0}]},
        {"chosen": 64, "steps": "8,64"},
        {"chosen": 8, "steps": [{"value": 8, "ms": float("inf"), "reason": ""}]},
        {"chosen": 8, "steps": [{"value": 8, "ms": 1.0, "reason": "<script>"}]},
    ],
)
def test_a_claim_the_search_could_not_make_is_refused(claim: object) -> None:
    with pytest.raises(ValueError, match="sizing"):
        claimed(task(8), claim, "cpu", WINDOW, CFG)


POISONING = ELEMENTWISE.replace(
    "return torch.tanh(x) * 2.0 + x",
    'if x.shape[0] > 8:\n            raise RuntimeError("CUDA error: an illegal memory access")\n'
    "        return torch.tanh(x) * 2.0 + x",
)


def inline_settings_for(cfg: SizingConfig, window: tuple[float, float] = WINDOW) -> dict:
    from opsynth.filters.sizing import inline_settings

    return {
        "device": "cpu",
        "threads": 1,
        "window_ms": list(window),
        "sizing": inline_settings(cfg, window),
    }


def test_inline_sizing_rewrites_the_candidate_to_its_choice(tmp_path: Path) -> None:
    from opsynth.filters.checks import probe
    from opsynth.filters.size_inline import size_here

    path = tmp_path / "candidate.py"
    path.write_text(ELEMENTWISE.format(batch=1))
    claim = size_here(str(path), inline_settings_for(CFG), probe)
    assert claim is not None and claim["steps"][0]["value"] == 1
    assert claim["chosen"] in [step["value"] for step in claim["steps"]]
    assert f"batch_size = {claim['chosen']}  # rows" in path.read_text()
    assert claimed(task(1), claim, "cpu", WINDOW, CFG).code == path.read_text()


def test_a_probe_that_poisons_the_context_ends_inline_sizing(tmp_path: Path) -> None:
    """A CUDA error leaves the process unable to run the stages: the claim says so, with the
    size measured before it, and the orchestrator filters that size in a fresh process. The
    window's target is seconds, so the 8-row probe is never within its band, however slow a
    loaded host reads it, and the search always asks for the size that fails."""
    from opsynth.filters.checks import probe
    from opsynth.filters.size_inline import size_here

    path = tmp_path / "candidate.py"
    path.write_text(POISONING.format(batch=8))
    claim = size_here(str(path), inline_settings_for(CFG, (1e3, 1e5)), probe)
    assert claim is not None and claim["poisoned"] is True
    assert [step["reason"] for step in claim["steps"]][-1] == "cuda_error"
    assert claim["chosen"] == 8 and "batch_size = 8  # rows" in path.read_text()


def test_probes_may_time_in_the_shared_section(tmp_path: Path) -> None:
    """``sizing.probe_exclusive`` off: every probe, inline or separate, times its runs in the
    GPU's shared section; on (the default), their settings are what they were before the
    setting existed, so the jobs' keys and the config's hash are too."""
    import contextlib

    import torch

    from opsynth.config import RunConfig
    from opsynth.filters import checks
    from opsynth.filters.size_inline import size_here
    from opsynth.flows.stages import probe_overrides

    shared = SizingConfig(probe_exclusive=False)
    assert "exclusive" not in inline_settings_for(CFG)["sizing"]
    assert "timed_exclusive" not in probe_overrides(RunConfig())
    assert (
        probe_overrides(RunConfig().with_section("sizing", probe_exclusive=False))[
            "timed_exclusive"
        ]
        is False
    )
    assert "probe_exclusive" not in RunConfig().sizing.work_dump()
    assert RunConfig(sizing=shared).sizing.work_dump()["probe_exclusive"] is False

    seen: list[dict] = []

    def probe(path: str, settings: dict) -> tuple:
        seen.append(settings)
        return checks.Probe(5.0, "cpu"), None

    path = tmp_path / "candidate.py"
    for cfg in (CFG, CFG.model_copy(update={"probe_exclusive": False})):
        path.write_text(ELEMENTWISE.format(batch=8))
        size_here(str(path), inline_settings_for(cfg), probe)
    assert [checks.Settings.from_dict(s).timed_exclusive for s in (seen[0], seen[-1])] == [
        True,
        False,
    ]

    class Recorded(checks.Candidate):
        """Notes whether each GPU section it takes is exclusive."""

        taken: list[bool] = []

        def gpu_lock(self, *, exclusive: bool = True):
            self.taken.append(exclusive)
            return contextlib.nullcontext()

    for exclusive in (True, False):
        Recorded.taken = []
        settings = checks.Settings(warmup_runs=1, timed_runs=2, timed_exclusive=exclusive)
        c = Recorded(str(path), settings)
        c.inputs = [torch.ones(4)]
        assert len(checks.time_runs(c, lambda x: x + 1, None)) == 2
        assert Recorded.taken == [False, exclusive]  # warm-up shared; timed runs as set


@pytest.mark.gpu
def test_on_the_gpu_a_candidate_is_sized_and_filtered_in_one_process() -> None:
    """Inline sizing on a real GPU: the elementwise task grows, each step with its memory
    peak, and the chosen size passes every filter in the same process; a task whose larger
    size trips a device-side assert claims the size it measured, marked poisoned."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from opsynth.filters.sizing import inline_settings

    cfg = FiltersConfig(workers=2, cache_dir=str(CACHE))
    window = cfg.window_ms("cuda")
    poisoning = Task(
        ops=["poison"],
        data_source="torch#1",
        code=ELEMENTWISE.format(batch=8).replace(
            "return torch.tanh(x) * 2.0 + x",
            "if x.shape[0] > 8:\n            x = x[torch.tensor([1 << 40], device=x.device)]\n"
            "        return torch.tanh(x) * 2.0 + x",
        ),
    )
    overrides = {"sizing": inline_settings(CFG, window), "task_timeout_s": 300.0}
    with WorkerPool(cfg, "cuda") as pool:
        results = pool.wait(pool.submit([task(8), poisoning], None, overrides))
    rows = results[task(8).id]
    assert [v.stage for v in rows] == list(job_stages(cfg))
    assert [v.reason for v in rows] == ["ok"] * len(rows), rows[-1].detail
    claim = rows[0].measures["sizing"]
    assert claim["chosen"] > 8 and all("device_gib" in step for step in claim["steps"])
    sized = claimed(task(8), claim, rows[0].device, window, CFG)
    assert f"batch_size = {claim['chosen']}  # rows" in sized.code
    timed = rows[-1].measures  # verify times it (filters.timing_in_verify)
    assert window[0] <= timed["scaled_ms"] <= window[1]
    bad = results[poisoning.id]
    assert bad[0].reason == "cuda_error", bad[0].detail
    assert bad[0].measures["sizing"]["poisoned"] is True
    assert bad[0].measures["sizing"]["chosen"] == 8


def test_under_the_memory_cap_a_task_takes_the_one_and_a_half_rung() -> None:
    """A cheap memory-bound task whose power of two under the cap runs just below the target
    grows to 1.5 times it when that still fits: 3 GiB per 1024 rows under an 8 GiB cap allows
    2730 rows, so 2048 is the power of two and 3072 would not fit; under 10 GiB, 3072 does."""
    for cap, chosen in ((8.0, 2048), (10.0, 3072)):
        cfg = CFG.model_copy(update={"max_device_gib": cap})
        measure, _ = linear_device(per_row_ms=0.0001, per_row_gib=3 / 1024)
        [out] = size_tasks([task(64)], measure, WINDOW, cfg)
        assert out.meta["sizing"]["chosen"] == chosen, out.meta["sizing"]
    # and a candidate's own process may claim that rung
    rung = claimed(task(8), {"chosen": 48, "steps": steps((8, 0.1), (48, 9.0))}, "cpu", WINDOW, CFG)
    assert rung.meta["sizing"]["chosen"] == 48


def test_a_size_the_search_could_not_grow_into_the_window_is_too_fast_unfiltered() -> None:
    """``sizing.too_fast_share``: a task whose probe at its chosen size read below that share
    of the window's lower edge is ``too_fast`` at stage ``sizing``, from its record; one the
    search grew into the window, one whose chosen probe has no reading, and one without a
    size constant pass, and the rule is off at 0."""
    from opsynth.filters.sized_too_fast import SizedTooFast, sized_checks

    capped = CFG.model_copy(update={"max_value": 64})
    measure, _ = linear_device(per_row_ms=0.001)  # 64 rows: 0.074 ms < 0.8 ms
    [short] = size_tasks([task(8)], measure, WINDOW, capped)
    [grown] = size_tasks([task(8)], measure, WINDOW, CFG)
    [check] = sized_checks(CFG.too_fast_share, WINDOW)
    assert check.below_ms == pytest.approx(0.8)
    dropped = check.filter(short)
    assert (dropped.keep, dropped.reason) == (False, "too_fast")
    assert "chosen size (64)" in dropped.detail and "0.074 ms < 0.8 ms" in dropped.detail
    assert check.filter(grown).keep, grown.meta["sizing"]
    assert sized_checks(0.0, WINDOW) == []
    # right at the share: not below it
    edge = {"chosen": 8, "steps": steps((4, 0.1), (8, 0.8))}
    assert (
        SizedTooFast(0.8)
        .filter(Task(ops=["t"], data_source="x", code="", meta={"sizing": edge}))
        .keep
    )
    # the chosen size failed to run, or the task has no size constant
    failed = {"chosen": 4, "steps": steps((4, None))}
    for record in (failed, {"chosen": None, "steps": [], "note": "no batch_size constant"}):
        assert check.filter(Task(ops=["t"], data_source="x", code="", meta={"sizing": record})).keep
    assert check.filter(task(8)).keep  # never sized
    # the claim's own fields, however malformed, reject nothing they do not show
    for claim in ({"chosen": 8, "steps": "x"}, {"chosen": 8, "steps": [3, {"value": 8}]}):
        assert check.filter(Task(ops=["t"], data_source="x", code="", meta={"sizing": claim})).keep


def test_the_too_fast_share_reaches_inline_jobs_only_when_on() -> None:
    """On, an inline job's sizing spec names the bound its process stops at; at 0, the spec,
    and so the job's key, and the config's work dump are what they were before the setting."""
    from opsynth.config import RunConfig

    assert inline_settings_for(CFG)["sizing"]["too_fast_below_ms"] == pytest.approx(0.8)
    off = CFG.model_copy(update={"too_fast_share": 0.0})
    assert "too_fast_below_ms" not in inline_settings_for(off)["sizing"]
    assert "too_fast_share" not in RunConfig(sizing=off).sizing.work_dump()
    assert RunConfig().sizing.work_dump()["too_fast_share"] == 0.8


def test_an_inline_candidate_too_fast_at_its_chosen_size_stops_before_its_stages(
    tmp_path: Path,
) -> None:
    """Its process sizes it, applies the same rule and reports one failing row, carrying the
    claim, instead of running its stages; with the rule off it runs them."""
    from opsynth.filters.checks import run_candidate

    capped = CFG.model_copy(update={"max_value": 16})
    path = tmp_path / "candidate.py"
    for share, expected in ((0.8, ["too_fast"]), (0.0, None)):
        path.write_text(ELEMENTWISE.format(batch=8))
        cfg = capped.model_copy(update={"too_fast_share": share})
        settings = inline_settings_for(cfg, (1e3, 1e5))  # a 1 s edge: both sizes read far below
        settings["stages"] = ["eager", "randomness"]
        events: list[dict] = []
        run_candidate(str(path), settings, events.append)
        rows = [e["verdict"] for e in events if e["event"] == "verdict"]
        claim = rows[0]["measures"]["sizing"]
        # 8 and 16 rows both take microseconds: which reads nearer the target is noise
        assert [s["value"] for s in claim["steps"]] == [8, 16] and claim["chosen"] in (8, 16)
        if expected:
            assert [r["reason"] for r in rows] == expected
            assert f"sizing probe at the chosen size ({claim['chosen']})" in rows[0]["detail"]
        else:
            assert [r["stage"] for r in rows] == ["eager", "randomness"]
            assert all(r["passed"] for r in rows), rows
