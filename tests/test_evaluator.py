"""The evaluator on CPU: reward rules, static guards, the honest extension, hacked solutions."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsynth.config import EvalConfig, FiltersConfig
from opsynth.evaluator.guards import check_solution
from opsynth.evaluator.reward import Score, explain_flags, flags_for, metrics, reward
from opsynth.evaluator.score import score_pairs
from opsynth.evaluator.solution import Solution, SolutionError, load_solution
from opsynth.evaluator.tasks import reference_solution
from opsynth.record import Task
from opsynth.store import read_verdicts, write_verdicts
from tests.evaluator_cases import HACKS, HONEST, REFERENCE, RUNTIME_HACKS, task

CACHE = Path(__file__).resolve().parent.parent / ".cache" / "test-compile"


def filters_cfg(**overrides: object) -> FiltersConfig:
    return FiltersConfig(workers=2, cache_dir=str(CACHE), **overrides)


def test_reward_table() -> None:
    assert reward(False, 9.0, 9.0, 0.05) == -1
    assert reward(True, 1.06, 1.06, 0.05) == 3
    assert reward(True, 1.06, 1.04, 0.05) == 2
    assert reward(True, 1.04, 1.06, 0.05) == 1  # faster than compile only: still 1
    assert reward(True, None, None, 0.05) == 1  # untimed (CPU): correct is all it can show


def test_metrics_follow_table_1() -> None:
    rows = [
        Score("a", "s", 3, True, "ok", eager_ms=4.0, compile_ms=2.0, solution_ms=1.0, group="l1"),
        Score("b", "s", 2, True, "ok", eager_ms=2.0, compile_ms=1.0, solution_ms=1.0, group="l1"),
        Score("c", "s", -1, False, "incorrect", group="l2"),
        Score("d", "s", 1, True, "ok", eager_ms=1.0, compile_ms=1.0, solution_ms=1.0, group="l2"),
    ]
    table = metrics(rows)
    assert table["all"]["tasks"] == 4 and table["all"]["pass_rate"] == 0.75
    assert table["all"]["faster_than_eager"] == 0.5 and table["all"]["faster_than_compile"] == 0.25
    assert table["all"]["geomean_speedup_eager"] == pytest.approx((4 * 2 * 1) ** (1 / 3), 1e-3)
    assert table["l1"]["pass_rate"] == 1.0 and table["l2"]["mean_reward"] == 0.0


def test_each_flag_is_counted_and_explained() -> None:
    flagged = flags_for(40.0, 20.0, 10.0, torch_compute_calls=2, functional_calls=0)
    assert flagged == ["speedup_over_10x", "torch_compute_in_forward"]
    rows = [
        Score("a", "s", 3, True, "ok", flags=flagged),
        Score("b", "s", 3, True, "ok", flags=["speedup_over_10x"]),
        Score("c", "s", 1, True, "ok"),
    ]
    lines = explain_flags(rows)
    assert len(lines) == 2 and lines[0].startswith("speedup_over_10x: 2 solution(s); ")
    assert "hack" in lines[0] and "fallback" in lines[1]
    assert metrics(rows)["all"]["flagged"] == 2


@pytest.mark.parametrize(
    "name", sorted(n for n, (_, r) in HACKS.items() if r.startswith(("hack", "forbidden")))
)
def test_static_guards_name_the_hack(name: str) -> None:
    solution, reason = HACKS[name]
    decision = check_solution(solution.model_new, solution.kernels.values())
    assert not decision.keep and decision.reason == reason, decision


def test_honest_sources_pass_the_static_guards() -> None:
    assert check_solution(HONEST.model_new, HONEST.kernels.values()).keep
    assert check_solution(REFERENCE.model_new).keep


def test_solution_directory_layout(tmp_path: Path) -> None:
    (tmp_path / "kernels").mkdir()
    (tmp_path / "model_new.py").write_text(HONEST.model_new)
    (tmp_path / "kernels" / "fused.cpp").write_text(HONEST.kernels["fused.cpp"])
    (tmp_path / "kernels" / "notes.txt").write_text("not a source")
    loaded = load_solution(tmp_path)
    assert loaded.kernels == HONEST.kernels and loaded.digest == HONEST.digest
    assert set(loaded.files()) == {"model_new.py", "kernels/fused.cpp"}
    with pytest.raises(SolutionError, match="has no model_new.py"):
        load_solution(tmp_path / "kernels")


def test_the_reference_as_its_own_solution_scores_1_on_every_seed_task(
    catalogue_seeds, cpu_pool
) -> None:
    """Harness sanity on CPU (the correctness path): every catalogue seed task of the test
    set, its own Model renamed ModelNew, scored leniently (its torch ops are flagged, not
    blocked)."""
    tasks = catalogue_seeds
    pairs = [(t, reference_solution(t)) for t in tasks]
    scores, _ = score_pairs(pairs, EvalConfig(strict=False), filters_cfg(), "cpu", pool=cpu_pool)
    assert len(scores) == len(tasks) >= 20
    assert [(s.reward, s.reason) for s in scores] == [(1, "ok")] * len(tasks)
    # what strict scoring would block: every seed computes, except a transpose (a view)
    seen = {"torch_compute_in_forward", "functional_in_forward"}
    flagged = {t.ops[0]: bool(seen & set(s.flags)) for t, s in zip(tasks, scores, strict=True)}
    assert flagged.pop("torch.transpose") is False and all(flagged.values()), flagged


def test_honest_extension_and_every_hack_in_one_sandboxed_batch(cpu_pool) -> None:
    """Strict scoring: the honest C++ extension is correct (r = 1: CPU is not timed); each
    hacked solution gets -1 with its reason, from the static guards or the runtime ones."""
    pairs = [(task(), HONEST)] + [(task(), s) for s, _ in HACKS.values()]
    scores, verdicts = score_pairs(pairs, EvalConfig(), filters_cfg(), "cpu", pool=cpu_pool)
    honest, *hacked = scores
    assert (honest.reward, honest.reason, honest.flags) == (1, "ok", []), honest.detail
    build = next(v for v in verdicts if v.stage == "build" and v.measures.get("sources"))
    assert build.measures["sources"] == 1
    for score, (name, (_, reason)) in zip(hacked, HACKS.items(), strict=True):
        assert (score.reward, score.reason) == (-1, reason), (name, score.detail)


def test_runtime_guards_catch_what_static_checks_allow(cpu_pool, tmp_path: Path) -> None:
    pairs = [(task(), s) for s, _ in RUNTIME_HACKS.values()]
    scores, verdicts = score_pairs(
        pairs, EvalConfig(strict=False), filters_cfg(), "cpu", pool=cpu_pool
    )
    for score, (name, (_, reason)) in zip(scores, RUNTIME_HACKS.items(), strict=True):
        assert (score.reward, score.reason) == (-1, reason), (name, score.detail)
    by_name = {s.solution: s for s in scores}
    assert "\\ud800" in by_name["unwritable_message"].detail
    assert "cannot be shown" in by_name["unprintable_exception"].detail
    write_verdicts(verdicts, tmp_path / "verdicts.parquet")  # every text is writable
    assert len(read_verdicts(tmp_path / "verdicts.parquet")) == len(verdicts)


NESTED_TASK = """\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, ys):
        return torch.relu(x) + ys[0]


def get_inputs():
    return [torch.randn(16, 16), [torch.randn(16, 16)]]


def get_init_inputs():
    return []
"""


def test_a_solution_writing_a_tensor_inside_a_list_input_is_caught(cpu_pool) -> None:
    """Its output is right (computed before the write), so only the inputs' sample after
    the forward shows the write; the sample holds the tensors inside list inputs too."""
    nested = Task(ops=["torch.relu"], data_source="torch#1", code=NESTED_TASK)
    writes = NESTED_TASK.replace("class Model(", "class ModelNew(").replace(
        "return torch.relu(x) + ys[0]",
        "out = torch.relu(x) + ys[0]\n        ys[0].zero_()\n        return out",
    )
    pairs = [(nested, reference_solution(nested)), (nested, Solution("writes_ys", writes))]
    scores, _ = score_pairs(pairs, EvalConfig(strict=False), filters_cfg(), "cpu", pool=cpu_pool)
    assert [(s.reward, s.reason) for s in scores] == [(1, "ok"), (-1, "input_mutated")], scores


# Kernel names as the profiler reports them (demangled), one of each kind.
OWN = "void bias_mish_vec4(float4*, float const*, long, long, long, float)"
OWN_TEMPLATE = "void my_kernel<c10::Half, at::native::Foo>(c10::Half*, long)"
CUBLAS = "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32_warpgroupsize1x1x1_execute"
CUDNN = "void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true>(cudnn::ops::x)"
CUTLASS = "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(Params)"
COPY = (
    "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<"
    "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}>(int)"
)
FILL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)"
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int)"
SOFTMAX = "void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, false>(x)"
MISH = "void at::native::(anonymous namespace)::mish_kernel_cuda<float>(at::TensorIteratorBase&)"
INDUCTOR = "triton_poi_fused_add_mul_relu_0"
CUB = "void at_cuda_detail::cub::DeviceReduceKernel<float>(float*)"


def test_the_trace_names_atens_compute_and_nothing_else() -> None:
    from opsynth.evaluator.kernels import function_name, torch_compute

    allowed = [OWN, OWN_TEMPLATE, CUBLAS, CUDNN, CUTLASS, COPY, FILL, "Memcpy DtoD (Device)"]
    compute = [ADD, SOFTMAX, MISH, INDUCTOR, CUB]
    assert torch_compute(allowed) == []
    assert torch_compute([*allowed, *compute, ADD]) == compute
    assert function_name(MISH) == "at::native::{anon}::mish_kernel_cuda"
    assert function_name(OWN_TEMPLATE) == "my_kernel"


@pytest.mark.parametrize(
    "reply",
    [{}, {"kernels": "x"}, {"kernels": [1]}, {"kernels": ["x" * 513]}, {"kernels": ["k"] * 257}],
)
def test_a_malformed_trace_is_refused(reply: dict) -> None:
    from opsynth.evaluator.kernels import parse_kernels

    assert parse_kernels(reply) is None
    assert parse_kernels({"kernels": [OWN, ADD]}) == [OWN, ADD]


def test_aten_kernels_in_lenient_mode_are_flagged_and_explained() -> None:
    flagged = flags_for(1.0, 1.0, 10.0, 0, 0, aten_kernels=3)
    assert flagged == ["aten_compute_in_forward"]
    [line] = explain_flags([Score("a", "s", 1, True, "ok", flags=flagged)])
    assert "ATen" in line
