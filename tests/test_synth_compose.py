"""The offline composer over real catalogue seeds: deterministic, mix- and weight-faithful,
novel, and every task it writes runs on CPU, for each kind of operator the catalogue holds.

Composed code is executed here, test-side only (the composer itself never runs it): build
``Model(*get_init_inputs())``, call it on ``get_inputs()``, and check the output is finite and
has the structure the task's meta records.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import math
import random
import re
import warnings
from collections import Counter

import pytest
import torch

from opsynth import synth
from opsynth.config import OPS6K_MIX, ComposeConfig
from opsynth.record import Task
from opsynth.synth.compose import COMPOSER, composable, compose
from opsynth.synth.sampling import (
    TRANSFORMERS,
    Sampler,
    effective_mix,
    profile_weights,
    split_seeds,
)
from opsynth.taxonomy import category

CFG = ComposeConfig()
UNIFORM = ComposeConfig(profile="uniform")
N = 40
DRAWS = 5000
RESCALED = 12


# ------------------------------------------------------------------------ helpers


def names_of(seeds: list[Task]) -> list[str]:
    return [t.ops[0] for t in seeds]


def only(seeds: list[Task], *wanted: str, **settings) -> ComposeConfig:
    """A uniform-profile config that never draws any seed but ``wanted``."""
    missing = set(wanted) - set(names_of(seeds))
    assert not missing, f"not in the test catalogue: {missing}"
    zero = {name: 0.0 for name in names_of(seeds) if name not in wanted}
    return ComposeConfig(profile="uniform", op_weights=zero, **settings)


def flat(out) -> list:
    if isinstance(out, tuple | list):
        return [t for item in out for t in flat(item)]
    return [out]


def load(code: str) -> tuple[torch.nn.Module, dict[str, object]]:
    """Test-side execution of generated code (production code never executes it): the model
    and its inputs by ``forward``'s parameter names."""
    namespace: dict = {}
    exec(compile(code, "<task>", "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["Model"](*namespace["get_init_inputs"]())
    inputs = namespace["get_inputs"]()
    names = list(inspect.signature(model.forward).parameters)
    assert len(names) == len(inputs), (names, len(inputs))
    return model, dict(zip(names, inputs, strict=True))


def run_task(task: Task, code: str | None = None):
    """(output, inputs by name) of the task's forward on CPU, after checking that every input
    is described in its meta (at the task's own size) and every output tensor is finite."""
    model, inputs = load(code or task.code)
    recorded = task.meta["inputs"]
    assert set(inputs) <= set(recorded), (list(inputs), list(recorded))
    for name, t in inputs.items():
        assert str(t.dtype).removeprefix("torch.") == recorded[name]["dtype"], name
        if code is None:
            assert list(t.shape) == recorded[name]["shape"], name
    with torch.no_grad():
        out = model(*inputs.values())
    tensors = [t for t in flat(out) if isinstance(t, torch.Tensor)]
    assert tensors, (task.ops, type(out))
    for t in tensors:
        if t.dtype.is_floating_point:
            assert torch.isfinite(t).all(), task.ops
    return out, inputs


def composed(seeds, *wanted: str, n: int = 2, **settings) -> list[Task]:
    """n tasks drawn only from ``wanted``; a chain ends on a whole tuple output only when
    ``tuple_output_share`` says so, and is written with a container only when
    ``container_share`` does (0 by default, so each test sees the kind it names)."""
    settings.setdefault("tuple_output_share", 0.0)
    settings.setdefault("container_share", 0.0)
    tasks = compose(seeds, only(seeds, *wanted, **settings), n=n)
    assert len(tasks) == n and len({t.id for t in tasks}) == n
    for task in tasks:
        assert set(task.ops) <= set(wanted), task.ops
    return tasks


def transformers_seed(name: str) -> Task:
    return Task(
        ops=[name],
        data_source=TRANSFORMERS,
        code=f"# {name}\nhidden_states_shape = (2, 16, 32)\n",
        meta={"seed": {"library": TRANSFORMERS, "name": name}},
    )


def sampler(seeds: list[Task], cfg: ComposeConfig = CFG, seed: int = 0) -> Sampler:
    chainable, standalone = split_seeds(seeds)
    return Sampler(chainable, standalone, cfg, random.Random(seed))


def assert_mix(drawn: list[str], expected: dict[str, float]) -> None:
    counts = Counter(drawn)
    shares = {key: counts[key] / len(drawn) for key in expected}
    assert set(counts) <= set(expected)
    for key, p in expected.items():
        assert abs(shares[key] - p) <= 0.015, (key, shares[key], p)


# ------------------------------------------------------------------------ a default sample


@pytest.fixture(scope="module")
def sample(catalogue_seeds):
    return compose(catalogue_seeds, CFG, n=N, config_hash="cafe")


def test_rows_are_distinct_kernelbench_tasks_citing_their_seeds(catalogue_seeds, sample):
    seed_names = {t.id: t.ops[0] for t in catalogue_seeds}
    assert len(sample) == N and len({t.id for t in sample}) == N
    for task in sample:
        tree = ast.parse(task.code)
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
        assert {"Model", "get_inputs", "get_init_inputs"} <= defined
        held = [task.meta["container"]] if "container" in task.meta else []
        assert task.ops == [seed_names[i] for i in task.seed_ids] + held
        assert task.data_source == f"torch#{len(task.ops)}" and 1 <= len(task.ops) <= 5
        assert task.composer == COMPOSER and task.composer_version == synth.__version__
        assert task.config_hash == "cafe"
        assert all(op in ast.get_docstring(tree) for op in task.ops)
        assert [link["name"] for link in task.meta["links"]] + held == task.ops


def test_every_sampled_task_runs_on_cpu(sample):
    for task in sample:
        out, _ = run_task(task)
        if not task.meta["returns_tuple"]:
            assert isinstance(out, torch.Tensor), task.ops


def test_batch_size_resizes_exactly_the_batch_dims(sample):
    """``scale`` multiplies the batch: the dims meta marks as batch double, nothing else
    changes, and the task still runs (no operator parameter depends on the batch)."""
    for task in sample[:RESCALED]:
        code, count = re.subn(r"^scale = 1\b", "scale = 2", task.code, flags=re.M)
        assert count == 1
        _, inputs = run_task(task, code)
        batch = task.meta["batch_size"]
        for name, t in inputs.items():
            shape = task.meta["inputs"][name]["shape"]
            dims = task.meta["batch_dims"].get(name, [])
            assert all(shape[d] == batch for d in dims), (task.ops, name)
            want = [2 * batch if d in dims else size for d, size in enumerate(shape)]
            assert list(t.shape) == want, (task.ops, name)
        assert task.meta["batch_dims"][next(iter(inputs))], "the first input follows the batch"


def test_op_sequences_are_not_repeated_while_new_ones_exist(sample):
    multi = [tuple(t.ops) for t in sample if len(t.ops) > 1]
    assert len(set(multi)) == len(multi)


def test_same_seed_same_tasks_other_round_or_seed_other_tasks(catalogue_seeds, sample):
    again = compose(catalogue_seeds, CFG, n=N, config_hash="cafe")
    assert [t.code for t in again] == [t.code for t in sample]
    assert [t.id for t in again] == [t.id for t in sample]
    other_round = compose(catalogue_seeds, CFG, n=15, round_index=1)
    other_seed = compose(catalogue_seeds, CFG.model_copy(update={"seed": 1}), n=15)
    first = {t.id for t in sample}
    assert len(first & {t.id for t in other_round}) <= 1
    assert len(first & {t.id for t in other_seed}) <= 1


def test_the_tasks_do_not_depend_on_how_many_processes_compose_them(catalogue_seeds):
    """Chunks and redraw parts have their own RNGs, so a pool of two processes (which keeps
    its memoised solves across chunks and redraws) makes exactly the tasks one process does."""
    cfg = CFG.model_copy(update={"chunk_size": 5})
    alone = compose(catalogue_seeds, cfg.model_copy(update={"workers": 1}), n=15)
    pooled = compose(catalogue_seeds, cfg.model_copy(update={"workers": 2}), n=15)
    assert [t.id for t in pooled] == [t.id for t in alone]
    assert len({tuple(t.ops) for t in alone}) == 15


def test_a_convolution_never_takes_an_unbatched_input(catalogue_seeds):
    """A (C, H, W) input to Conv2d would make the task's batch dim its channels."""
    by_name = {t.ops[0]: composable(t) for t in catalogue_seeds}
    assert 3 not in by_name["nn.Conv2d"].ranks and 4 in by_name["nn.Conv2d"].ranks
    assert 2 not in by_name["nn.ConvTranspose1d"].ranks
    assert 3 in by_name["nn.MaxPool2d"].ranks  # pooling is per channel: any leading dim


def test_categories_behind_their_share_in_earlier_chains_are_drawn_more(catalogue_seeds):
    """A sampler that starts after activation-only chains (an earlier round, other chunks)
    pulls every other profiled category up and activations down."""
    fresh = sampler(catalogue_seeds)
    acts = {n for n in fresh.names if category(n) == "activation"}
    later = Sampler(*split_seeds(catalogue_seeds), CFG, random.Random(0), [(a,) for a in acts])
    assert later.category_got == {"activation": len(acts)}
    weight = dict(zip(later.names, later.weights, strict=True))
    before = dict(zip(fresh.names, fresh.weights, strict=True))
    assert weight["torch.relu"] < before["torch.relu"]
    assert weight["nn.Conv2d"] > before["nn.Conv2d"]


def test_produced_op_sequences_are_avoided(catalogue_seeds, sample):
    multi = [t.ops for t in sample if len(t.ops) > 1]
    later = compose(catalogue_seeds, CFG, n=20, round_index=1, produced=multi)
    assert not {tuple(ops) for ops in multi} & {tuple(t.ops) for t in later if len(t.ops) > 1}
    assert all(t.meta["novel_ops"] for t in later if len(t.ops) > 1)


def test_compose_never_runs_the_code_it_writes(catalogue_seeds, monkeypatch):
    """Validation runs catalogue operators directly; generated source is never compiled,
    executed or evaluated while composing."""
    seen: list[str] = []

    def spy(real):
        def wrapper(source, *args, **kwargs):
            if isinstance(source, str):
                seen.append(source)
            return real(source, *args, **kwargs)

        return wrapper

    for name in ("exec", "eval", "compile"):
        monkeypatch.setattr(builtins, name, spy(getattr(builtins, name)))
    tasks = compose(catalogue_seeds, UNIFORM, n=8, round_index=7)
    monkeypatch.undo()
    assert len(tasks) == 8
    assert not [s for s in seen if "get_inputs" in s or "class Model" in s]


# ------------------------------------------------------------------------ the mix and weights


def test_default_mix_is_table_3(catalogue_seeds):
    assert CFG.mix == OPS6K_MIX
    blocks = [transformers_seed("LlamaMLP"), transformers_seed("BertSelfAttention")]
    assert_mix(sampler([*catalogue_seeds, *blocks]).sources(DRAWS), OPS6K_MIX)


def test_mix_without_transformers_seeds_is_renormalised(catalogue_seeds, caplog):
    with caplog.at_level("INFO", logger="opsynth.synth.sampling"):
        renormalised = effective_mix(OPS6K_MIX, standalone=False)
    assert "no seeds for ['transformers']" in caplog.text
    assert TRANSFORMERS not in renormalised and math.isclose(sum(renormalised.values()), 1.0)
    assert renormalised["torch#2"] == pytest.approx(0.8377 / (1 - 0.0118))
    assert_mix(sampler(catalogue_seeds).sources(DRAWS), renormalised)


def test_other_mixes_and_bad_keys(catalogue_seeds):
    only_two = compose(catalogue_seeds, UNIFORM.model_copy(update={"mix": {"torch#2": 1.0}}), n=6)
    assert {t.data_source for t in only_two} == {"torch#2"}
    assert effective_mix({"torch#3": 1, "torch#1": 3}) == {"torch#1": 0.75, "torch#3": 0.25}
    for bad in ({"torch#0": 1.0}, {"torch#2": 0.0}, {"llama": 1.0}):
        with pytest.raises(ValueError) as err:
            effective_mix(bad)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="no positive weight"):
        effective_mix({TRANSFORMERS: 1.0}, standalone=False)


def test_op_weights_are_honoured(catalogue_seeds):
    rare = "torch.cumsum"
    others = len(catalogue_seeds) - 1
    heavy = UNIFORM.model_copy(update={"op_weights": {rare: float(others)}})
    drawn = sampler(catalogue_seeds, heavy).pick(4000)[1]
    assert abs(drawn.count(rare) / 4000 - 0.5) < 0.03, "as likely as all the others together"
    never = UNIFORM.model_copy(update={"op_weights": {rare: 0.0}})
    assert rare not in sampler(catalogue_seeds, never).pick(4000)[1]
    assert all(rare not in t.ops for t in compose(catalogue_seeds, never, n=12))


def test_the_ops6k_profile_weighs_operators_by_released_use(catalogue_seeds):
    names = names_of(catalogue_seeds)
    base = profile_weights(names, CFG)
    assert profile_weights(names, UNIFORM) == [1.0] * len(names)
    assert min(base) >= CFG.profile_floor and len(set(base)) > 1
    doubled = CFG.model_copy(update={"op_weights": {"nn.Conv2d": 2.0, "torch.exp": 0.0}})
    scaled = dict(zip(names, profile_weights(names, doubled), strict=True))
    weights = dict(zip(names, base, strict=True))
    assert scaled["nn.Conv2d"] == 2 * weights["nn.Conv2d"] and scaled["torch.exp"] == 0.0


# ------------------------------------------------------------------------ transformers, failures


def test_transformers_seeds_stay_standalone_then_chains_take_over(catalogue_seeds):
    blocks = [transformers_seed("LlamaMLP"), transformers_seed("GPT2Block")]
    cfg = UNIFORM.model_copy(update={"mix": {TRANSFORMERS: 1.0, "torch#2": 1e-9}})
    tasks = compose([*catalogue_seeds, *blocks], cfg, n=4)
    standalone = [t for t in tasks if t.data_source == TRANSFORMERS]
    by_seed = {b.id: b for b in blocks}
    assert sorted(t.seed_ids[0] for t in standalone) == sorted(by_seed), "each block once"
    for task in standalone:  # as it is, but for its batch: a knob the sizing stage scales
        seed = by_seed[task.seed_ids[0]]
        assert task.meta["standalone"] and task.ops == seed.ops
        assert task.code == seed.code.replace("= (2,", "= (batch_size,").replace(
            "hidden_states_shape", "batch_size = 2\nhidden_states_shape"
        )
    assert Counter(t.data_source for t in tasks)["torch#2"] == 2, "used up: chains instead"
    with pytest.raises(RuntimeError, match="every transformers seed is used"):
        compose([*catalogue_seeds, *blocks], cfg.model_copy(update={"mix": {TRANSFORMERS: 1}}), 3)


def test_nothing_composable_is_a_one_line_runtime_error(catalogue_seeds):
    """A forward window far beyond what the memory caps allow: every draw is refused."""
    cfg = UNIFORM.model_copy(
        update={
            "mix": {"torch#2": 1.0},
            "forward_window_ms": (1e5, 1e6),
            "target_forward_ms": 3e5,
            "max_attempts": 30,
        }
    )
    with pytest.raises(RuntimeError) as err:
        compose(catalogue_seeds, cfg, n=2)
    message = str(err.value)
    assert "no new valid 2-op chain in 30 draws" in message and "'runtime'" in message
    assert "\n" not in message
    with pytest.raises(ValueError):
        compose([], CFG, n=1)
    with pytest.raises(ValueError):
        compose(catalogue_seeds, CFG, n=-1)


# ------------------------------------------------------------------------ operator kinds


def test_single_ops_compose_when_tuple_seeds_weigh_nothing(catalogue_seeds):
    cfg = only(catalogue_seeds, "torch.add", mix={"torch#1": 1.0})
    assert cfg.tuple_output_share > 0
    tasks = compose(catalogue_seeds, cfg, n=2)
    assert [t.ops for t in tasks] == [["torch.add"]] * 2


def test_multi_input_add_takes_a_second_operand(catalogue_seeds):
    """add's other operand is a tensor input or a literal scalar, by the derived form drawn;
    among a few tasks some take it as a second input, broadcast against the first."""
    pairs = 0
    for task in composed(catalogue_seeds, "torch.add", mix={"torch#1": 1.0}, n=6):
        out, inputs = run_task(task)
        if len(inputs) == 2:
            x, other = inputs.values()
            assert out.shape == torch.broadcast_shapes(x.shape, other.shape), task.code
            pairs += 1
    assert pairs >= 2


def test_where_with_a_mask_input_at_the_default_rebind_limit(catalogue_seeds):
    cfg = only(catalogue_seeds, "torch.where", "torch.tanh", mix={"torch#2": 1.0})
    tasks = compose(catalogue_seeds, cfg.model_copy(update={"novelty_attempts": 100}), n=2)
    assert any("torch.where" in t.ops for t in tasks), [t.ops for t in tasks]


def test_where_with_a_bool_mask_input_when_its_forms_are_reachable(catalogue_seeds):
    """With every re-derived form in reach, where is chained with its mask as a task input
    (the only sequences are tanh->tanh and tanh->where: novelty forces the second), where no
    operand is taken from the chain (``compose.reuse_share``; its mask a comparison of one:
    test_synth_reuse). The one-argument form, nonzero's, whose size is data, is
    ``compose.sampled_shapes``' and is left out here."""
    cfg = only(catalogue_seeds, "torch.where", "torch.tanh", mix={"torch#2": 1.0})
    update = {"rebind_limit": 200, "novelty_attempts": 100, "max_attempts": 400}
    update |= {"sampled_shapes": False, "reuse_share": 0.0}
    tasks = compose(catalogue_seeds, cfg.model_copy(update=update), n=2)
    chained = [t for t in tasks if "torch.where" in t.ops]
    assert chained, [t.ops for t in tasks]
    for task in chained:
        out, inputs = run_task(task)
        masks = [t for t in inputs.values() if t.dtype == torch.bool]
        assert masks and masks[0].shape == out.shape, task.code


def test_embedding_as_first_op_takes_an_index_input(catalogue_seeds):
    for task in composed(catalogue_seeds, "nn.Embedding", mix={"torch#1": 1.0}):
        out, inputs = run_task(task)
        (x,) = inputs.values()
        assert x.dtype == torch.int64 and out.dtype == torch.float32
        assert list(out.shape[:-1]) == list(x.shape)


def test_gather_as_first_op_takes_an_index_input(catalogue_seeds):
    for task in composed(catalogue_seeds, "torch.gather", mix={"torch#1": 1.0}):
        out, inputs = run_task(task)
        x, index = inputs.values()
        assert index.dtype == torch.int64 and out.shape == index.shape


@pytest.mark.parametrize("op", ["torch.topk", "nn.LSTM"])
def test_a_tuple_output_is_continued_on_its_main_element(catalogue_seeds, op):
    tasks = composed(catalogue_seeds, op, mix={"torch#2": 1.0})
    for task in tasks:
        assert task.ops == [op, op] and not task.meta["returns_tuple"]
        assert task.meta["links"][0]["pick"] == [0], "values / the sequence output"
        out, _ = run_task(task)
        assert isinstance(out, torch.Tensor) and out.dtype == torch.float32


@pytest.mark.parametrize(("op", "parts"), [("torch.topk", 2), ("nn.LSTM", 3)])
def test_a_tuple_output_is_returned_whole(catalogue_seeds, op, parts):
    tasks = composed(catalogue_seeds, op, mix={"torch#1": 1.0}, tuple_output_share=1.0)
    for task in tasks:
        assert task.meta["returns_tuple"], task.ops
        out, _ = run_task(task)
        assert isinstance(out, tuple), f"{op} returned {type(out).__name__}:\n{task.code}"
        assert len(flat(out)) == parts


def test_a_task_whose_number_of_outputs_follows_the_batch_is_never_composed():
    """``unbind`` along the batch would give a task as many outputs as its batch, and sizing
    grows the batch into the thousands: only the non-batch dims are unbound."""
    from opsynth.synth.catalog.extract import seeds_in_process

    seeds = seeds_in_process(["torch.unbind", "torch.relu"])
    cfg = only(seeds, "torch.unbind", tuple_output_share=1.0, mix={"torch#1": 1.0})
    tasks = compose(seeds, cfg, n=4)
    for task in tasks:
        assert task.meta["returns_tuple"], task.code
        out, _ = run_task(task)
        code, count = re.subn(r"^scale = 1\b", "scale = 2", task.code, flags=re.M)
        assert count == 1
        doubled, _ = run_task(task, code)
        assert len(flat(doubled)) == len(flat(out)), task.code


def test_a_chained_loss_compares_the_running_tensor_with_a_target(catalogue_seeds):
    """A loss is composed unreduced (``reduction='none'``): a mean over a sized batch barely
    differs between inputs, and an unreduced loss can sit mid-chain. Every loss link compares
    the running tensor with a float target of its shape: a task input, or the chain's input
    kept for it (``compose.reuse_share``)."""
    tasks = composed(catalogue_seeds, "torch.tanh", "nn.MSELoss", mix={"torch#2": 1.0}, n=6)
    losses = [t for t in tasks if "nn.MSELoss" in t.ops]
    assert losses
    kinds = set()
    for task in losses:
        assert "reduction='none'" in task.code, task.code
        out, inputs = run_task(task)
        assert out.dim() > 0, task.code
        first = next(iter(inputs.values()))
        assert out.shape == first.shape, task.code
        targets = [t for name, t in inputs.items() if name != "x"]
        links = [link for link in task.meta["links"] if link["name"] == "nn.MSELoss"]
        kept = [link for link in links if link.get("reuses")]
        kinds |= {"kept"} if kept else set()
        kinds |= {"input"} if len(kept) < len(links) else set()
        assert len(targets) == len(links) - len(kept), task.code
        assert all(t.dtype == torch.float32 for t in targets), task.code
        assert not kept or "residual" in task.code, task.code
        assert re.search(r"self\.\w+\(\w+, ", task.code), task.code
    assert kinds == {"kept", "input"}, [t.code for t in losses]


def test_a_loss_alone_takes_its_input_and_target(catalogue_seeds):
    for task in composed(catalogue_seeds, "nn.MSELoss", mix={"torch#1": 1.0}):
        out, inputs = run_task(task)
        x, target = inputs.values()
        # a float target, or (a chain's first operator tried with integer inputs first,
        # compose.int_input_share) the integer one the catalogue validated the loss with
        assert x.dtype == torch.float32 and target.dtype in (torch.float32, torch.int64)
        assert target.shape == x.shape == out.shape


def test_dropout_is_composed_as_a_deterministic_identity(catalogue_seeds):
    tasks = composed(catalogue_seeds, "torch.tanh", "nn.Dropout", mix={"torch#2": 1.0}, n=3)
    dropped = [t for t in tasks if "nn.Dropout" in t.ops]
    assert dropped
    for task in dropped:
        assert "nn.Dropout(p=0.0)" in task.code, task.code
        model, inputs = load(task.code)
        model.train()  # dropout's random mode: still an identity at p=0
        (x,) = inputs.values()
        expected = x
        for _ in range(task.ops.count("torch.tanh")):
            expected = torch.tanh(expected)
        assert torch.equal(model(x), expected) and torch.equal(model(x), model(x))


def test_a_full_reduction_without_a_reduction_argument_may_end_in_a_scalar(catalogue_seeds):
    # a single-operator source: a task past the first is a redraw that may repeat one, so
    # not every one of the six asked for need come back
    cfg = only(
        catalogue_seeds,
        "torch.sum",
        mix={"torch#1": 1.0},
        tuple_output_share=0.0,
        full_reduction_share=1.0,
    )
    tasks = compose(catalogue_seeds, cfg, n=6)
    assert len(tasks) >= 4 and {tuple(t.ops) for t in tasks} == {("torch.sum",)}
    scalars = [t for t in tasks if run_task(t)[0].dim() == 0]
    assert scalars and all("reduction" not in t.code for t in scalars)


def test_a_reduction_to_a_scalar_is_tried_along_dim_1_beyond_its_share(catalogue_seeds):
    """A statistic of a whole sized tensor barely moves between input draws; beyond
    ``compose.full_reduction_share`` (here none) it reduces dim 1 and keeps the batch (a
    batch-only input has no dim 1: its reduction stays a scalar)."""
    cfg = only(
        catalogue_seeds,
        "torch.sum",
        mix={"torch#1": 1.0},
        tuple_output_share=0.0,
        full_reduction_share=0.0,
        rank_weights={2: 1.0, 3: 1.0},
    )
    tasks = compose(catalogue_seeds, cfg, n=4)
    assert tasks
    for task in tasks:
        out, inputs = run_task(task)
        first, result = next(iter(inputs.values())), flat(out)[0]
        assert result.dim() >= 1 and result.shape[0] == first.shape[0], task.code
        assert "torch.sum(x, dim=1)" in task.code, task.code


@pytest.mark.parametrize("op", ["F.pad", "F.interpolate"])
def test_padding_and_interpolation_change_the_spatial_size(catalogue_seeds, op):
    # on a batch of images (a rank-2 input has no spatial dims: F.pad pads its batch too)
    for task in composed(catalogue_seeds, op, mix={"torch#1": 1.0}, rank_weights={4: 1.0}):
        out, inputs = run_task(task)
        (x,) = inputs.values()
        assert out.shape[:2] == x.shape[:2] and out.shape[2:] != x.shape[2:], task.code


def test_attention_takes_query_key_and_value(catalogue_seeds):
    # without operands taken from the chain (self-attention: test_synth_reuse)
    tasks = composed(catalogue_seeds, "nn.MultiheadAttention", mix={"torch#1": 1.0}, reuse_share=0)
    for task in tasks:
        out, inputs = run_task(task)
        query, key, value = inputs.values()
        assert key.shape == value.shape and out.shape == query.shape, task.code


def test_rank_5_inputs(catalogue_seeds):
    tasks = composed(
        catalogue_seeds,
        "nn.LayerNorm",
        "F.gelu",
        "torch.relu",
        mix={"torch#2": 1.0},
        rank_weights={5: 1.0},
    )
    for task in tasks:
        out, inputs = run_task(task)
        (x,) = inputs.values()
        assert x.dim() == 5 and out.shape == x.shape


def test_rank_1_index_inputs(catalogue_seeds):
    # one task: a single-operator source has one op sequence, so a second task is only a
    # last-round redraw, which may repeat the first
    tasks = composed(
        catalogue_seeds, "nn.Embedding", n=1, mix={"torch#1": 1.0}, rank_weights={1: 1.0}
    )
    for task in tasks:
        out, inputs = run_task(task)
        (x,) = inputs.values()
        assert x.dim() == 1 and x.dtype == torch.int64 and out.dim() == 2


def test_rank_1_float_inputs(catalogue_seeds):
    tasks = composed(
        catalogue_seeds,
        "torch.tanh",
        "F.gelu",
        "torch.exp",
        mix={"torch#2": 1.0},
        rank_weights={1: 1.0},
    )
    for task in tasks:
        out, inputs = run_task(task)
        (x,) = inputs.values()
        assert x.dim() == 1 and out.shape == x.shape


@pytest.mark.parametrize("share", [0.0, 1.0])
def test_multi_input_share_decides_whether_an_operator_takes_a_second_batch_input(
    catalogue_seeds, share
):
    tasks = composed(
        catalogue_seeds,
        "torch.add",
        "torch.cat",
        "torch.tanh",
        "torch.relu",
        n=8,
        mix={"torch#2": 1.0},
        multi_input_share=share,
        int_input_share=0.0,
        reuse_share=0.0,
    )
    inputs = [len(run_task(task)[1]) for task in tasks]
    if share == 0.0:
        # torch.cat (whose list is batch-sized) is never taken (nor given a value of the
        # chain: reuse_share); torch.add's operand, when it has one, does not follow the batch
        # and is a parameter
        assert inputs == [1] * 8 and not any("torch.cat" in t.ops for t in tasks), inputs
    else:
        assert max(inputs) > 1, inputs


def test_a_first_operators_batch_free_operand_is_a_parameter(catalogue_seeds):
    tasks = composed(
        catalogue_seeds,
        "torch.bmm",
        "torch.add",
        "torch.tanh",
        n=8,
        mix={"torch#2": 1.0},
        multi_input_share=0.0,
        int_input_share=0.0,
    )
    held = [t for t in tasks if "nn.Parameter(" in t.code]
    assert held, [t.code for t in tasks]
    for task in held:
        model, inputs = load(task.code)
        assert len(inputs) == 1 and any(True for _ in model.parameters()), task.code


def test_a_tensor_built_from_a_literal_is_built_where_the_call_runs():
    """``torch.bucketize``'s boundaries are a literal the forward builds: on the device of the
    call's input, not on the CPU beside a model moved to the GPU."""
    from opsynth.synth.catalog.extract import seeds_in_process

    seeds = seeds_in_process(["torch.bucketize", "torch.searchsorted", "torch.tanh"])
    for op in ("torch.bucketize", "torch.searchsorted"):
        tasks = composed(seeds, op, "torch.tanh", n=4, mix={"torch#2": 1.0})
        with_op = [task for task in tasks if op in task.ops]
        assert with_op, [t.ops for t in tasks]
        for task in with_op:
            assert "torch.linspace(-2, 2, 9, device=x.device)" in task.code, task.code
            run_task(task)


@pytest.mark.parametrize("op", ["torch.argsort", "torch.sort"])
def test_a_sort_is_composed_stable_so_ties_have_one_order(op):
    """``compose.stable_sort``: every sort call passes ``stable=True`` (and its literals by
    keyword, as the flag requires beside ``dim``), and runs; ties then sort in input order.
    Off, the call is the catalogue's."""
    from opsynth.synth.catalog.extract import seeds_in_process

    seeds = seeds_in_process([op, "torch.relu"])
    stable = [t for t in seeds if t.ops == [op]]
    made = {}
    for setting, expected in ((True, 1), (False, 0)):
        cfg = only(seeds, op, "torch.relu", mix={"torch#2": 1.0}, stable_sort=setting)
        made[setting] = compose(seeds, cfg, n=8)
        tasks = [t for t in made[setting] if op in t.ops]
        assert tasks and stable
        for task in tasks:
            calls = [
                node
                for node in ast.walk(ast.parse(task.code))
                if isinstance(node, ast.Call) and ast.unparse(node.func) == op
            ]
            assert calls, task.code
            for call in calls:
                flags = [k.value.value for k in call.keywords if k.arg == "stable"]
                assert flags == [True] * expected, task.code
                assert len(call.args) == 1 or not expected, task.code  # literals by keyword
            run_task(task)
    # the setting changes the sort calls and nothing else: the same chains, shapes and sizes
    assert [t.ops for t in made[True]] == [t.ops for t in made[False]]
    for on, off in zip(made[True], made[False], strict=True):
        assert _without_calls_to(on.code, op) == _without_calls_to(off.code, op)
    # a tie broken by position: relu's zeros keep their input order
    x = torch.tensor([[0.0, -1.0, 2.0, -3.0, 0.0]])
    assert torch.argsort(torch.relu(x), dim=1, stable=True).tolist() == [[0, 1, 3, 4, 2]]


SOFTMAXES = ("F.softmax", "F.log_softmax", "nn.Softmax", "nn.LogSoftmax")


def test_a_softmax_is_composed_with_its_dim():
    """``compose.explicit_dim``: every softmax-family call (or module) names its dim, so torch
    never picks one from the rank, and the task runs without the implicit-dim warning. Off,
    the catalogue's form (without a dim) comes first, as before the setting."""
    from opsynth.synth.catalog.extract import seeds_in_process

    seeds = seeds_in_process([*SOFTMAXES, "torch.relu"])
    for setting in (True, False):
        cfg = only(seeds, *SOFTMAXES, "torch.relu", mix={"torch#2": 1.0}, explicit_dim=setting)
        tasks = [t for t in compose(seeds, cfg, n=12) if set(t.ops) & set(SOFTMAXES)]
        assert len(tasks) >= 4, [t.ops for t in compose(seeds, cfg, n=12)]
        calls = [
            node
            for task in tasks
            for node in ast.walk(ast.parse(task.code))
            if isinstance(node, ast.Call) and ast.unparse(node.func) in SOFTMAXES
        ]
        named = [any(k.arg == "dim" for k in call.keywords) or len(call.args) > 1 for call in calls]
        assert calls and all(named) == setting and any(named) == setting, [
            ast.unparse(c) for c in calls
        ]
        if setting:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # the implicit-dim deprecation would raise
                for task in tasks:
                    run_task(task)


def test_implicit_dim_names_the_softmax_family_only():
    from opsynth.synth.catalog.spec import CatalogSpec, InputSpec
    from opsynth.synth.implicit_dim import implicit_dim, names_dim

    x = InputSpec("input", (4, 8))
    bare = CatalogSpec("torch", "F.softmax", "function", "F.softmax", args=(x,))
    keyword = CatalogSpec(
        "torch",
        "F.softmax",
        "function",
        "F.softmax",
        args=(x, InputSpec("dim", tensor=False, value=1, keyword=True)),
    )
    module = CatalogSpec("torch", "nn.Softmax", "module", "nn.Softmax", init_kwargs=(("dim", 1),))
    assert implicit_dim(bare) and implicit_dim(module)
    assert not names_dim(bare) and names_dim(keyword) and names_dim(module)
    other = CatalogSpec("torch", "torch.sum", "function", "torch.sum", args=(x,))
    assert not implicit_dim(other)


def test_optional_arguments_are_drawn_as_the_profile_passes_them(catalogue_seeds):
    """``compose.optional_arguments``: a transposed convolution passes stride, padding and
    output_padding about as often as Ops-6K's do (every call there; here, unless torch
    refuses the drawn set at that shape), and the tasks run. Off, only required arguments."""
    wanted = ("nn.ConvTranspose1d", "torch.relu")
    zero = {name: 0.0 for name in names_of(catalogue_seeds) if name not in wanted}
    passing = {}
    for setting in (True, False):
        cfg = ComposeConfig(
            op_weights=zero,
            mix={"torch#2": 1.0},
            optional_arguments=setting,
            tuple_output_share=0.0,
        )
        tasks = [t for t in compose(catalogue_seeds, cfg, n=12) if wanted[0] in t.ops]
        assert len(tasks) >= 6, [t.ops for t in tasks]
        calls = [
            node
            for task in tasks
            for node in ast.walk(ast.parse(task.code))
            if isinstance(node, ast.Call) and ast.unparse(node.func) == wanted[0]
        ]
        passing[setting] = [{k.arg for k in call.keywords} for call in calls]
        if setting:
            for task in tasks:
                run_task(task)
    assert not any(passing[False]), passing[False]
    with_stride = [kw for kw in passing[True] if {"stride", "padding"} <= kw]
    assert len(with_stride) >= len(passing[True]) / 2, passing[True]


def _without_calls_to(code: str, op: str) -> list[str]:
    """The lines of ``code`` that do not call ``op``."""
    return [line for line in code.splitlines() if f"{op}(" not in line]


def test_stable_sort_rewrites_only_sorts_it_can_name():
    from opsynth.synth.catalog.spec import CatalogSpec, InputSpec
    from opsynth.synth.sorting import stable_sort

    x = InputSpec("x", (4, 8))
    dim = InputSpec("dim", tensor=False, value=1)
    off = InputSpec("stable", tensor=False, value=False, keyword=True)
    spec = CatalogSpec("torch", "torch.argsort", "function", "torch.argsort", args=(x, dim, off))
    args = stable_sort(spec).args
    assert [(a.name, a.value, a.keyword) for a in args[1:]] == [
        ("dim", 1, True),
        ("stable", True, True),
    ]
    odd = CatalogSpec(
        "torch",
        "torch.sort",
        "function",
        "torch.sort",
        args=(x, InputSpec("k", tensor=False, value=2)),
    )
    assert stable_sort(odd) == odd
    other = CatalogSpec("torch", "torch.cumsum", "function", "torch.cumsum", args=(x, dim))
    assert stable_sort(other) == other


def test_optional_draws_lists_distinct_keyword_sets_before_the_bare_call():
    """``compose.optional_draws``: an operator's call tries up to that many distinct drawn
    keyword sets, then the catalogue's arguments; one draw is what runs composed before."""
    from opsynth.synth.catalog.spec import CatalogSpec, InputSpec
    from opsynth.synth.optional_args import draw_optional
    from opsynth.synth.solve import _variations

    spec = CatalogSpec(
        "torch",
        "F.interpolate",
        "function",
        "F.interpolate",
        args=(
            InputSpec("input", (2, 3, 8)),
            InputSpec("scale_factor", tensor=False, value=2.0, keyword=True),
        ),
    )
    modes = [["nearest", 5], ["bilinear", 3], ["bicubic", 2], ["linear", 1]]
    table = {"F.interpolate": {"calls": 11, "keywords": {"mode": {"share": 1.0, "values": modes}}}}
    lists = {}
    for draws in (1, 3, 16):
        cfg = ComposeConfig(optional_draws=draws, variation_attempts=0)
        out = _variations(spec, random.Random(7), cfg, table)
        assert out[-1] == ()
        sets = out[:-1]
        assert 1 <= len(sets) <= draws and len(set(sets)) == len(sets), sets
        assert all(set(dict(s)) == {"mode"} for s in sets)
        lists[draws] = sets
    assert lists[1] == [draw_optional(spec, table, random.Random(7))]
    assert len(lists[16]) == 4  # sixteen draws from four values meet each of them here
    assert lists[3][0] == lists[1][0]  # the first draw is the one-draw run's
    cfg = ComposeConfig(optional_draws=3, variation_attempts=0)
    assert _variations(spec, random.Random(7), cfg, {}) == [()]
