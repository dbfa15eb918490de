"""Execution checks through the sandboxed pool: each sample task gets exactly its reason."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from opsynth.config import FiltersConfig
from opsynth.evaluator.reasons import EVALUATION
from opsynth.filters import candidate_load, checks, failures, gpu_sections, reasons
from opsynth.filters.pool import WorkerPool, job_stages
from opsynth.filters.samples import GOOD, SAMPLES, Sample, task_source
from opsynth.filters.smoke import run_smoke
from opsynth.filters.verify import (
    EVERY_OUTPUT_DISTINCT,
    STABLE_INPUTS,
    VERIFY_EVERY_DEGENERATE_CHECK,
)
from opsynth.record import Task, Verdict

# Generous limits: the suite must pass on a loaded two-core machine, and the first
# torch.compile of a fresh cache takes tens of seconds there.
CACHE = Path(__file__).resolve().parent.parent / ".cache" / "test-compile"
BASE = {"task_timeout_s": 180.0, "grace_s": 20.0, "warmup_runs": 1, "timed_runs": 5}
SAMPLE_CFG = {"workers": 2, "window_ms_cpu": (0.0, 60000.0), **BASE}
SAMPLE_STAGES = job_stages(FiltersConfig(**SAMPLE_CFG))


def make_task(code: str, name: str = "sample") -> Task:
    return Task(ops=[name], data_source="torch#1", code=code)


@pytest.fixture(scope="module")
def cache_dir() -> str:
    """A compile cache kept between test sessions (like a real run's), so only the very first
    session pays for cold torch.compile builds."""
    CACHE.mkdir(parents=True, exist_ok=True)
    return str(CACHE)


@pytest.fixture(scope="module")
def sample_pool(cache_dir: str) -> Iterator[WorkerPool]:
    cfg = FiltersConfig(cache_dir=cache_dir, **SAMPLE_CFG)
    with WorkerPool(cfg, "cpu") as pool:
        yield pool


@pytest.fixture(scope="module")
def sample_run(sample_pool: WorkerPool) -> tuple[dict[str, list[Verdict]], dict[str, Any]]:
    tasks = {s.name: make_task(s.code, s.name) for s in SAMPLES}
    results = sample_pool.evaluate(list(tasks.values()))
    stats = dict(sample_pool.stats)
    return {name: results[task.id] for name, task in tasks.items()}, stats


# The samples the degenerate stage rejects, and two it passes (one later stage rejects).
LEFT_TO_VERIFY = [s for s in SAMPLES if s.stage == "degenerate"] + [
    s for s in SAMPLES if s.code == GOOD or s.reason == "compile_mismatch"
]
# A job without the candidate's own degenerate stage, as a candidate that patched it away
# would leave it: verify alone decides those facts.
NO_OWN_DEGENERATE = {"stages": [s for s in SAMPLE_STAGES if s != "degenerate"]}


def _verdicts(pool: WorkerPool, samples: list[Sample], overrides: dict[str, Any]) -> dict:
    tasks = {s.name: make_task(s.code, s.name) for s in samples}
    results = pool.wait(pool.submit(list(tasks.values()), None, overrides))
    return {name: results[task.id] for name, task in tasks.items()}


@pytest.fixture(scope="module")
def verify_alone_run(sample_pool: WorkerPool) -> dict[str, list[Verdict]]:
    return _verdicts(sample_pool, LEFT_TO_VERIFY, NO_OWN_DEGENERATE)


@pytest.mark.parametrize("sample", LEFT_TO_VERIFY, ids=lambda s: s.name)
def test_verify_alone_gives_each_degenerate_sample_its_reason(
    sample: Sample, verify_alone_run: dict[str, list[Verdict]]
) -> None:
    """Every degenerate sample still gets exactly its reason when the candidate's own stage
    says nothing, now from verify (``filters.judge_every_degenerate_fact``, on by default),
    including the two facts it once took from that stage: ``input_ignored`` and the mean as
    a ``trivial_answer``; a good task passes, and a compile mismatch stays compile's."""
    stage = sample.stage if sample.stage == "compile" else "verify"
    _assert_ends_with(verify_alone_run[sample.name], NO_OWN_DEGENERATE["stages"], stage, sample)


def test_before_the_setting_verify_took_two_degenerate_facts_from_the_candidate(
    sample_pool: WorkerPool,
) -> None:
    """What runs made before ``judge_every_degenerate_fact`` (pinned false by v1.0.0) did:
    verify checked neither fact itself, so without the candidate's own stage an ignored input
    passes, and a near-constant output is not called a trivial answer (its draws differ by
    about ``distinct_rtol``, so whether verify calls them indistinguishable is the draw's)."""
    legacy = [s for s in LEFT_TO_VERIFY if s.name in ("ignores_second_input", "near_constant")]
    overrides = {**NO_OWN_DEGENERATE, VERIFY_EVERY_DEGENERATE_CHECK: False}
    found = {
        name: (verdicts[-1].stage, verdicts[-1].reason)
        for name, verdicts in _verdicts(sample_pool, legacy, overrides).items()
    }
    assert found["ignores_second_input"] == ("verify", "ok")
    assert found["near_constant"] in {("verify", "ok"), ("verify", "indistinguishable")}


def test_before_the_setting_one_constant_output_passed(sample_pool: WorkerPool) -> None:
    """What runs made before ``every_output_distinct`` (pinned false by v1.0.0) did: a
    constant scalar beside a real output passes, since the outputs together move."""
    [sample] = [s for s in SAMPLES if s.name == "constant_scalar_beside_output"]
    overrides = {**NO_OWN_DEGENERATE, EVERY_OUTPUT_DISTINCT: False}
    [verdicts] = _verdicts(sample_pool, [sample], overrides).values()
    assert (verdicts[-1].stage, verdicts[-1].reason) == ("verify", "ok"), verdicts[-1].detail


def test_before_the_setting_an_ignored_input_of_drawn_shape_passed(
    sample_pool: WorkerPool,
) -> None:
    """What runs made before ``stable_inputs`` (pinned false by v1.0.0) did: an input whose
    shape changes between draws is never swapped for another draw's, so ignoring it passes,
    in the candidate's own stage and in ``verify``."""
    [sample] = [s for s in SAMPLES if s.name == "ignores_input_of_drawn_shape"]
    for overrides in ({STABLE_INPUTS: False}, {**NO_OWN_DEGENERATE, STABLE_INPUTS: False}):
        [verdicts] = _verdicts(sample_pool, [sample], overrides).values()
        assert (verdicts[-1].stage, verdicts[-1].reason) == ("verify", "ok"), verdicts[-1].detail


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: s.name)
def test_sample_gets_exactly_its_reason(
    sample: Sample, sample_run: tuple[dict[str, list[Verdict]], dict[str, Any]]
) -> None:
    _assert_ends_with(sample_run[0][sample.name], SAMPLE_STAGES, sample.stage, sample)


def _assert_ends_with(verdicts: list[Verdict], stages: Any, stage: str, sample: Sample) -> None:
    """The rows are every stage up to ``stage``, each passed but the last, which gives the
    sample's reason."""
    expected = list(stages[: stages.index(stage) + 1])
    assert [v.stage for v in verdicts] == expected, [
        (v.stage, v.reason, v.detail) for v in verdicts
    ]
    assert all(v.passed for v in verdicts[:-1])
    last = verdicts[-1]
    assert (last.reason, last.passed) == (sample.reason, sample.reason == "ok"), last.detail


def test_every_verdict_carries_device_and_torch_version(
    sample_run: tuple[dict[str, list[Verdict]], dict[str, Any]],
) -> None:
    verdicts, stats = sample_run
    assert stats["sandbox"] in ("bwrap", "rlimits")
    assert stats["torch_version"] == torch.__version__
    for rows in verdicts.values():
        for v in rows:
            assert v.device.startswith("cpu:") and v.device != "cpu:"
            assert v.torch_version == torch.__version__
            assert v.reason in reasons.ALL


def test_good_task_records_its_measures(
    sample_run: tuple[dict[str, list[Verdict]], dict[str, Any]],
) -> None:
    rows = {v.stage: v for v in sample_run[0]["good"]}
    assert rows["eager"].measures["outputs"] == [{"shape": [128, 256], "dtype": "float32"}]
    assert rows["randomness"].measures["reseed_max_abs_diff"] == 0.0
    assert rows["degenerate"].measures["min_pairwise_rel_diff"] > 0.1
    assert rows["degenerate"].measures["input_influence"]["0"] > 0.1
    assert "runtime" not in rows  # timed in verify (filters.timing_in_verify, the default)
    timed = rows["verify"].measures
    assert 0 < timed["eager_ms_min"] <= timed["eager_ms_median"] <= timed["judged_upper_ms"]
    assert timed["speed_factor"] == 1.0 and timed["timed_runs"] == BASE["timed_runs"]
    assert timed["compiled_ms_median"] > 0 and timed["speedup"] > 0
    compiled = rows["compile"].measures
    assert compiled["compile_s"] > 0 and "compiled_ms_median" not in compiled
    assert compiled["max_abs_diff"] <= 1e-2


def test_rejections_explain_themselves(
    sample_run: tuple[dict[str, list[Verdict]], dict[str, Any]],
) -> None:
    verdicts = sample_run[0]
    assert "candidate.py:" in verdicts["forward_raises"][-1].detail
    assert verdicts["ignores_second_input"][-1].measures["input"] == 1
    assert verdicts["dropout_train"][-1].measures["reseed_max_abs_diff"] > 0.1
    assert verdicts["times_zero"][-1].measures["spread"] == 0.0


@pytest.mark.parametrize("in_verify", [True, False], ids=["verify_times", "candidate_times"])
def test_runtime_window_and_speed_factor(cache_dir: str, in_verify: bool) -> None:
    """The window and the speed factor, applied where the run times: in verify (the default),
    or in the candidate's runtime stage (runs made before ``filters.timing_in_verify``)."""
    cfg = FiltersConfig(
        workers=1,
        cache_dir=cache_dir,
        window_ms_cpu=(5.0, 50.0),
        device_speed_factor=2.0,
        timing_in_verify=in_verify,
        **BASE,
    )
    tiny = make_task(task_source("return x * 2.0"), "tiny")
    # Sleeping makes "slow" independent of how fast the test machine is.
    slow = make_task(
        task_source("time.sleep(0.08)\n        return x * 2.0", header="import time"), "slow"
    )
    with WorkerPool(cfg, "cpu") as pool:
        results = pool.evaluate([tiny, slow])
    fast_row, slow_row = results[tiny.id][-1], results[slow.id][-1]
    stage = "verify" if in_verify else "runtime"
    assert (fast_row.stage, fast_row.reason) == (stage, "too_fast"), fast_row.detail
    assert (slow_row.stage, slow_row.reason) == (stage, "too_slow"), slow_row.detail
    for row in (fast_row, slow_row):
        m = row.measures
        assert m["speed_factor"] == 2.0 and m["window_ms"] == [5.0, 50.0]
        assert m["scaled_ms"] == pytest.approx(2.0 * m["eager_ms_median"], rel=1e-3)


def test_reason_codes_are_documented_once() -> None:
    groups = [
        reasons.STATIC,
        reasons.EAGER,
        reasons.RANDOMNESS,
        reasons.DEGENERATE,
        reasons.RUNTIME,
        reasons.COMPILE,
        reasons.INFRA,
    ]
    codes = [code for group in groups for code in group]
    assert len(codes) == len(set(codes))
    assert set(codes) | {reasons.OK} == set(reasons.ALL)
    assert not set(EVALUATION) & set(reasons.ALL), "the evaluator's own codes are its own"
    assert all(text and "\n" not in text for text in EVALUATION.values())
    assert all(text and "\n" not in text for text in reasons.ALL.values())
    assert {s.reason for s in SAMPLES} <= set(reasons.ALL)
    assert GOOD in {s.code for s in SAMPLES}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_every_sample_gets_its_reason_on_cuda(cache_dir: str) -> None:
    """Includes the GPU-only samples: outputs or module tensors left on the CPU, and a
    device-side assert (the worker that hit it is replaced, later samples still pass)."""
    for sample, rows in run_smoke(FiltersConfig(cache_dir=cache_dir, **BASE), "cuda"):
        last = rows[-1]
        assert (last.stage, last.reason) == (sample.stage, sample.reason), (
            sample.name,
            last.detail,
        )
        assert last.device.startswith("cuda:")


COMPILED_SOURCE = """
import torch

class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2 + x.sum(dim=-1, keepdim=True)

def get_inputs():
    return [torch.randn(256, 4096)]

def get_init_inputs():
    return []
"""


def _blocked_on(inode: int) -> bool:
    """Whether some process waits for a lock on ``inode`` (the ``->`` lines of /proc/locks)."""
    with open("/proc/locks") as fh:
        return any("->" in line and f":{inode} " in line for line in fh)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_graphs_wait_for_a_queued_timer(tmp_path: Path) -> None:
    """Inductor benchmarks its kernels' configs on the first compiled run: GPU work, so the
    compiled graph waits while a timer waits for the GPU, and runs once the timer is done."""
    path = tmp_path / "candidate.py"
    path.write_text(COMPILED_SOURCE)
    lock_dir = tmp_path / "locks"
    lock_dir.mkdir()
    c = checks.Candidate(str(path), checks.Settings(device="cuda", lock_dir=str(lock_dir)))
    c.module = candidate_load.load_module(str(path))
    c.model = c.module.Model().cuda()
    c.inputs = [torch.randn(256, 4096, device="cuda")]
    compiled = gpu_sections.compile_locked(c.model, c.gpu_shared)

    gate = os.open(
        lock_dir / f"gpu-{gpu_sections._gpu_ident(c.device)}.gate", os.O_RDWR | os.O_CREAT
    )
    fcntl.flock(gate, fcntl.LOCK_SH)  # what a timer holds while it waits and times
    result: dict[str, Any] = {}
    run = threading.Thread(target=lambda: result.update(out=compiled(*c.inputs)))
    run.start()
    inode, deadline = os.fstat(gate).st_ino, time.monotonic() + 300
    while run.is_alive() and not _blocked_on(inode) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert run.is_alive(), "the compiled graph ran while a timer waited for the GPU"
    assert _blocked_on(inode)
    fcntl.flock(gate, fcntl.LOCK_UN)
    os.close(gate)
    run.join(300)
    with torch.no_grad():
        assert torch.allclose(result["out"], c.model(*c.inputs), atol=1e-4, rtol=1e-4)


def test_an_input_draw_out_of_device_memory_is_not_drawn_again_on_the_cpu() -> None:
    """A ``get_inputs()`` that cannot run with the GPU as default device is drawn again on the
    CPU; one that ran out of device memory is not: a CPU draw holds other values, so verdicts
    on values would depend on how full the shared GPU was. The OOM reaches the stage, whose
    ``oom`` is retried alone. Needs no GPU: nothing is allocated before the error."""
    calls: list[str] = []

    def needs_cpu_generator() -> list[Any]:
        calls.append("draw")
        if len(calls) == 1:
            raise RuntimeError("Expected a 'cuda' device type for generator")
        return [torch.ones(2)]

    cuda = torch.device("cuda")
    assert candidate_load.draw_inputs(needs_cpu_generator, cuda, 7)[0].tolist() == [1.0, 1.0]
    assert calls == ["draw", "draw"]  # under the GPU first, then again as written

    def full_device() -> list[Any]:
        calls.append("full")
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB")

    with pytest.raises(torch.OutOfMemoryError):
        candidate_load.draw_inputs(full_device, cuda, 7)
    assert calls[2:] == ["full"]  # drawn once: no CPU draw after the OOM
    assert failures.classify(torch.OutOfMemoryError("CUDA out of memory"), "x") == "oom"


def test_compiled_graphs_run_inside_the_given_section_once_each(tmp_path: Path) -> None:
    """``compile_locked``: each compiled graph's run (two per call here: a graph break) enters
    the shared section once; a run inside a section already held enters none (it would wait
    on itself); without a section it is plain ``torch.compile``. On the CPU with a recording
    section: the section's locking is ``filters.gpulock``'s, tested on its own."""
    from opsynth.filters import gpulock

    entered: list[int] = []

    @contextlib.contextmanager
    def section() -> Any:
        entered.append(1)
        yield

    class Broken(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x.sin()
            torch._dynamo.graph_break()
            return y.cos()

    torch._dynamo.reset()
    x = torch.randn(8)
    compiled = gpu_sections.compile_locked(Broken(), section)
    assert torch.allclose(compiled(x), x.sin().cos())
    assert len(entered) == 2
    with gpulock.gpu_section(str(tmp_path), "cpu-test", exclusive=True):
        compiled(x)
    assert len(entered) == 2  # the held section covered both graphs
    assert torch.allclose(gpu_sections.compile_locked(Broken(), None)(x), x.sin().cos())


def test_a_cpu_candidate_gives_nothing_back_and_touches_no_gpu(tmp_path: Path) -> None:
    c = checks.Candidate(str(tmp_path / "candidate.py"), checks.Settings(device="cpu"))
    assert checks.release_cached(c) == 0.0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_after_a_stage_the_allocators_unused_cache_goes_back_to_the_device(
    tmp_path: Path,
) -> None:
    """What a stage freed but the allocator still reserves is released (under the GPU's shared
    lock), so neighbours can use it; what tensors still hold stays, and a small remainder is
    not worth a pass through the lock."""
    lock_dir = tmp_path / "locks"
    lock_dir.mkdir()
    c = checks.Candidate(
        str(tmp_path / "candidate.py"), checks.Settings(device="cuda", lock_dir=str(lock_dir))
    )
    torch.cuda.empty_cache()  # what earlier tests in this process left cached is not the stage's
    kept = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    freed = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    del freed
    reserved = torch.cuda.memory_reserved()
    released = checks.release_cached(c)
    assert 1.9 <= released <= 2.1, released
    assert reserved - torch.cuda.memory_reserved() >= 2 << 30
    assert torch.cuda.memory_allocated() >= kept.numel()
    small = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    del small
    assert checks.release_cached(c) == 0.0
    del kept
    torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_candidate_gives_back_what_degenerate_held_before_it_compiles(cache_dir: str) -> None:
    """Its 512 MiB input, drawn twice more by ``degenerate`` with an output each: what those
    held is given back once the stage has passed, and the row says how much."""
    code = task_source("return torch.relu(x) + x", inputs="[torch.randn(128, 1024, 1024)]")
    task = make_task(code, "held")
    cfg = FiltersConfig(workers=1, cache_dir=cache_dir, **BASE)
    with WorkerPool(cfg, "cuda") as pool:
        overrides = {"stages": ["eager", "randomness", "degenerate"]}
        rows = pool.wait(pool.submit([task], None, overrides))[task.id]
    assert [(r.stage, r.passed) for r in rows] == [
        ("eager", True),
        ("randomness", True),
        ("degenerate", True),
    ], rows[-1].detail
    assert rows[-1].measures["device_released_gib"] >= 1.0, rows[-1].measures
    assert "device_released_gib" not in rows[0].measures  # eager keeps its blocks for the next
