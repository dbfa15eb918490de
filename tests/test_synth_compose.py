"""The offline composer: executable, deterministic, mix-faithful, non-degenerate chains.

The 200-task sample is executed only in the sandboxed worker pool (eager, randomness and
degenerate stages, at batch 2); the few tests that load a task in-process load code the
composer solved for a fixed, known chain, to check its shapes and timing exactly.
"""

from __future__ import annotations

import ast
import builtins
import math
import random
import re
import statistics
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

import synth
from filters.pool import WorkerPool
from opsynth.config import OPS6K_MIX, ComposeConfig, FiltersConfig
from opsynth.record import Task
from synth.compose import COMPOSER, compose
from synth.render import render_task
from synth.sampling import TRANSFORMERS, Sampler, effective_mix, split_seeds
from synth.seeds import get_library, seed_tasks
from synth.shapes import solve_chain
from synth.spec import Degenerate

CFG = ComposeConfig()
SPECS = {s.name: s for s in get_library("torch").specs()}
SEEDS = seed_tasks(list(SPECS.values()))
SEED_NAMES = {t.id: t.ops[0] for t in SEEDS}
N = 200
# measured: 200 of 200 of the default (Table 3) sample pass eager in the sandbox; the floor
# leaves room for new seeds
EXEC_FLOOR = 0.95
SMALL_BATCH = 2
TIMED = 24
DRAWS = 5000
CACHE = Path(__file__).resolve().parent.parent / ".cache" / "test-compile"


def load(code: str, batch: int | None = None) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    """Test-side execution of generated code (production code never executes it). ``batch``
    overrides ``batch_size`` before ``get_inputs`` reads it; no operator depends on it."""
    namespace: dict = {}
    exec(compile(code, "<task>", "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["Model"](*namespace["get_init_inputs"]())
    if batch is not None:
        namespace["batch_size"] = batch
    return model, namespace["get_inputs"]()


def forward_ms(task) -> float:
    """Median eager forward at the task's own size."""
    model, inputs = load(task.code)
    with torch.no_grad():
        out = model(*inputs)
        assert list(out.shape) == task.meta["output_shape"]
        times = []
        for _ in range(3):
            start = time.perf_counter()
            model(*inputs)
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


@pytest.fixture(scope="module")
def sample():
    return compose(SEEDS, CFG, n=N, config_hash="cafe")


def at_small_batch(task: Task) -> Task:
    """The task with ``batch_size`` pinned small; no operator parameter depends on it."""
    code, count = re.subn(
        r"^batch_size = .*$", f"batch_size = {SMALL_BATCH}", task.code, flags=re.M
    )
    assert count == 1
    return Task(ops=task.ops, data_source=task.data_source, code=code)


@pytest.fixture(scope="module")
def sandboxed(sample):
    """Verdict rows of the sample from the sandboxed pool. The runtime window is empty, so
    every task stops at the runtime stage and never reaches the slow compile stage."""
    cfg = FiltersConfig(
        workers=2,
        cache_dir=str(CACHE),
        task_timeout_s=60.0,
        warmup_runs=0,
        timed_runs=1,
        window_ms_cpu=(0.0, 1e-9),
    )
    small = [at_small_batch(t) for t in sample]
    with WorkerPool(cfg, "cpu") as pool:
        results = pool.evaluate(small)
    return [results[t.id] for t in small]


def passed(rows, stage: str) -> bool:
    return any(v.stage == stage and v.passed for v in rows)


def test_sample_executes_in_eager_in_the_sandbox(sample, sandboxed):
    eager = [passed(rows, "eager") for rows in sandboxed]
    failures = [
        (t.ops, rows[-1].detail)
        for t, rows, ok in zip(sample, sandboxed, eager, strict=True)
        if not ok
    ]
    rate = sum(eager) / N
    print(f"\neager pass rate in the sandbox: {sum(eager)}/{N} = {rate:.1%}")
    assert rate >= EXEC_FLOOR, failures[:5]


def test_outputs_are_deterministic_and_depend_on_inputs(sandboxed):
    ran = [rows for rows in sandboxed if passed(rows, "eager")]
    assert sum(passed(r, "randomness") for r in ran) / len(ran) >= 0.99
    # measured 195 of 200: the rest are tiny outputs (a softmax over 128+ values) that zeros
    # pass within the evaluator's absolute atol; the composer's spread rule is relative
    sound = [r for r in ran if passed(r, "degenerate")]
    assert len(sound) / len(ran) >= 0.95, [r[-1].reason for r in ran if r not in sound][:5]


def test_full_size_forward_times_land_near_the_window(sample):
    times = sorted(forward_ms(t) for t in sample[:TIMED])
    low, high = CFG.forward_window_ms
    inside = sum(low / 3 <= t <= high * 3 for t in times) / len(times)
    q = statistics.quantiles(times, n=10)
    print(
        f"\nforward ms on CPU ({TIMED} tasks): min {times[0]:.2f} p10 {q[0]:.2f} p50 {q[4]:.2f} "
        f"p90 {q[8]:.2f} max {times[-1]:.2f}; within window/3..window*3: {inside:.0%}"
    )
    # the machine may be shared, which slows eager torch several-fold: only loose bounds
    assert 0.1 <= q[4] <= 200
    assert inside >= 0.6


def test_estimated_forward_is_inside_the_window(sample):
    low, high = CFG.forward_window_ms
    assert all(low <= t.meta["est_forward_ms_cpu"] <= high for t in sample)


def test_rows_match_their_seeds(sample):
    assert len(sample) == N and len({t.id for t in sample}) == N
    for task in sample:
        tree = ast.parse(task.code)
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
        assert {"Model", "get_inputs", "get_init_inputs"} <= defined
        assert task.ops == [SEED_NAMES[i] for i in task.seed_ids]
        assert task.data_source == f"torch#{len(task.ops)}"
        assert 1 <= len(task.ops) <= 5
        assert task.composer == COMPOSER and task.composer_version == synth.__version__
        assert task.config_hash == "cafe"
        assert ast.get_docstring(tree) and all(op in ast.get_docstring(tree) for op in task.ops)


def test_op_sequences_are_not_repeated_while_new_ones_exist(sample):
    multi = [tuple(t.ops) for t in sample if len(t.ops) > 1]
    assert len(set(multi)) == len(multi)


def test_shapes_follow_the_rules(sample):
    for task in sample:
        shapes = task.meta["shapes"]
        batch = task.meta["batch_size"]
        assert all(s[0] == batch for s in shapes), "the batch dim is never touched"
        assert all(len(s) >= 2 for s in shapes[:-1]), "no op runs on a reduced-to-1-D tensor"
        for op, shape_in in zip(task.ops, shapes, strict=False):
            if op in {"nn.Conv2d", "nn.BatchNorm2d", "nn.MaxPool2d", "nn.AvgPool2d"}:
                assert len(shape_in) == 4, (task.ops, shapes)


def test_same_seed_same_tasks_other_round_other_tasks(sample):
    again = compose(SEEDS, CFG, n=N, config_hash="cafe")
    assert [t.code for t in again] == [t.code for t in sample]
    assert [t.id for t in again] == [t.id for t in sample]
    other_round = compose(SEEDS, CFG, n=50, round_index=1)
    other_seed = compose(SEEDS, CFG.model_copy(update={"seed": 1}), n=50)
    first = {t.id for t in sample}
    assert len(first & {t.id for t in other_round}) <= 2
    assert len(first & {t.id for t in other_seed}) <= 2


def transformers_seed(name: str) -> Task:
    return Task(
        ops=[name],
        data_source=TRANSFORMERS,
        code=f"# {name}\n",
        meta={"seed": {"library": TRANSFORMERS, "name": name}},
    )


def sampler(seeds: list[Task], cfg: ComposeConfig = CFG, seed: int = 0, **kwargs) -> Sampler:
    chainable, standalone = split_seeds(seeds)
    return Sampler(chainable, standalone, cfg, random.Random(seed), **kwargs)


def assert_mix(drawn: list[str], expected: dict[str, float]) -> None:
    counts = Counter(drawn)
    shares = {key: counts[key] / len(drawn) for key in expected}
    print(f"\nmix over {len(drawn)} draws: " + ", ".join(f"{k} {v:.2%}" for k, v in shares.items()))
    assert set(counts) <= set(expected)
    for key, p in expected.items():
        assert abs(shares[key] - p) <= 0.015, (key, shares[key], p)


def test_default_mix_is_table_3():
    assert CFG.mix == OPS6K_MIX
    with_blocks = [*SEEDS, transformers_seed("LlamaMLP"), transformers_seed("BertSelfAttention")]
    assert_mix(sampler(with_blocks).sources(DRAWS), OPS6K_MIX)


def test_mix_without_transformers_seeds_is_renormalised(caplog):
    with caplog.at_level("INFO", logger="synth.sampling"):
        renormalised = effective_mix(OPS6K_MIX, standalone=False)
    assert "no seeds for ['transformers']" in caplog.text
    assert TRANSFORMERS not in renormalised and math.isclose(sum(renormalised.values()), 1.0)
    assert renormalised["torch#2"] == pytest.approx(0.8377 / (1 - 0.0118))
    assert_mix(sampler(SEEDS).sources(DRAWS), renormalised)


def test_compose_follows_the_sampler(sample):
    """The sample's data sources are the first N sources of the composer's own sampler."""
    rng = random.Random(f"opsynth.compose:{CFG.seed}:0")
    assert [t.data_source for t in sample] == Sampler(SEEDS, [], CFG, rng).sources(N)


def test_transformers_seeds_stay_standalone():
    blocks = [transformers_seed("LlamaMLP"), transformers_seed("GPT2Block")]
    cfg = CFG.model_copy(update={"mix": {TRANSFORMERS: 0.5, "torch#2": 0.5}})
    tasks = compose([*SEEDS, *blocks], cfg, n=12)
    standalone = [t for t in tasks if t.data_source == TRANSFORMERS]
    assert {t.id for t in standalone} == {b.id for b in blocks}, "each block once, as it is"
    assert {t.code for t in standalone} == {b.code for b in blocks}
    assert all(t.meta["standalone"] and t.seed_ids == [t.id] for t in standalone)
    assert Counter(t.data_source for t in tasks)["torch#2"] == 10, "used up: chains instead"


def test_op_weights_are_honoured():
    rare = "torch.cumsum"
    others = len(SEEDS) - 1
    heavy = CFG.model_copy(update={"op_weights": {rare: float(others)}})
    drawn = sampler(SEEDS, heavy).pick(4000)[1]
    assert abs(drawn.count(rare) / 4000 - 0.5) < 0.03, "as likely as all the others together"
    never = CFG.model_copy(update={"op_weights": {rare: 0.0}})
    assert all(rare not in t.ops for t in compose(SEEDS, never, n=60))


def test_produced_op_sequences_are_avoided(sample):
    multi = [t.ops for t in sample if len(t.ops) > 1]
    later = compose(SEEDS, CFG, n=100, round_index=1, produced=multi)
    assert not {tuple(ops) for ops in multi} & {tuple(t.ops) for t in later if len(t.ops) > 1}
    assert all(t.meta["novel_ops"] for t in later if len(t.ops) > 1)


def test_other_mixes_and_bad_keys():
    only_two = compose(SEEDS, CFG.model_copy(update={"mix": {"torch#2": 1.0}}), n=10)
    assert {t.data_source for t in only_two} == {"torch#2"}
    assert effective_mix({"torch#3": 1, "torch#1": 3}) == {"torch#1": 0.75, "torch#3": 0.25}
    for bad in ({"torch#0": 1.0}, {"torch#2": 0.0}, {"llama": 1.0}):
        with pytest.raises(ValueError) as err:
            effective_mix(bad)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="no positive weight"):
        effective_mix({TRANSFORMERS: 1.0}, standalone=False)


def test_compose_never_executes_code(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the composer must not execute or compile code")

    monkeypatch.setattr(builtins, "exec", refuse)
    monkeypatch.setattr(builtins, "eval", refuse)
    monkeypatch.setattr(builtins, "compile", refuse)
    assert len(compose(SEEDS, CFG, n=20, round_index=7)) == 20


def chain(names: list[str], seed: int = 0, start_rank: int | None = None):
    specs = [SPECS[n] for n in names]
    rng = random.Random(seed)
    return solve_chain(specs, rng, CFG, start_rank=start_rank, enforce_window=False)


def test_adapter_is_inserted_and_recorded_when_ranks_do_not_meet():
    solved = chain(["nn.LayerNorm", "nn.Conv2d"], start_rank=3)
    assert solved.steps[1].adapter is not None and solved.steps[1].shape_in[1] == 1
    task = render_task(solved, seed_ids=[], composer=COMPOSER)
    assert task.meta["adapters"] == [
        {"before": 1, "name": "unsqueeze_channel", "code": "x = x.unsqueeze(1)"}
    ]
    model, inputs = load(task.code, batch=SMALL_BATCH)
    with torch.no_grad():
        assert list(model(*inputs).shape)[1:] == task.meta["output_shape"][1:]
    assert chain(["nn.LayerNorm", "nn.Conv2d"]).steps[1].adapter is None


@pytest.mark.parametrize(
    "names",
    [
        ["torch.relu", "torch.relu"],
        ["torch.sigmoid", "torch.abs"],
        ["torch.tanh", "torch.clamp", "torch.relu", "torch.abs"],
        ["torch.exp", "torch.exp"],
        ["nn.BatchNorm2d", "nn.BatchNorm2d"],
    ],
)
def test_degenerate_chains_are_refused(names):
    for seed in range(5):
        with pytest.raises(Degenerate):
            solved = chain(names, seed)
            # clamp may pick bounds that still clip tanh; the chain must then keep every op live
            assert [s.spec.name for s in solved.steps] != names


def test_fixed_sums_are_never_summed():
    for seed in range(20):
        for first, second in [("torch.softmax", "torch.sum"), ("nn.LayerNorm", "torch.mean")]:
            try:
                solved = chain([first, second], seed)
            except Degenerate:
                continue
            a, b = solved.steps
            fixed = a.choice.dim if a.choice.dim is not None else len(a.shape_in) - 1
            assert b.choice.dim != fixed


def test_transpose_is_never_undone():
    with pytest.raises(Degenerate):
        chain(["torch.transpose", "torch.relu", "torch.transpose"], start_rank=3)
    for seed in range(10):
        a, b = chain(["torch.transpose", "torch.transpose"], seed, start_rank=4).steps
        assert a.choice.dims != b.choice.dims


def test_bias_before_batch_norm_is_dropped():
    solved = chain(["nn.Conv2d", "nn.BatchNorm2d"])
    assert solved.steps[0].choice.kwargs.get("bias") is False
    task = render_task(solved, seed_ids=[], composer=COMPOSER)
    assert "bias=False" in task.code
    assert "bias" not in chain(["nn.Conv2d", "torch.relu"]).steps[0].choice.kwargs
