"""``seeds.added_overrides``: the released set's operators the first argument tables missed
become runnable seeds, called the way the released set calls them; off, an extraction derives
what one made before the tables did, which is what v1.0.0's committed catalogue holds.

Each setting is extracted once, through the worker subprocess a real extraction uses, for
these operators only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from opsynth.config import SeedsConfig, load_config
from opsynth.store import read_tasks
from opsynth.synth.catalog.extract import extract
from opsynth.synth.catalog.overrides import ADDED_OVERRIDES, OVERRIDES, UNSCREENED
from opsynth.synth.catalog.serialize import spec_from_json
from opsynth.synth.catalog.torch_library import entry_of, rebind, table_of

RELEASE = Path(__file__).resolve().parents[1] / "data" / "releases" / "v1.0.0"
MISSED = [
    "nn.Embedding",
    "torch.index_select",
    "torch.index_copy",
    "torch.bitwise_xor",
    "torch.diagonal_scatter",
    "nn.SyncBatchNorm",
    "torch.view_as_real",
]
# Rejected without the added tables whatever the torch version (meta accepts the derived
# float or whole-shape arguments of some, so where they fail varies: probe or CPU forward).
STILL_REJECTED = {
    "nn.SyncBatchNorm": {"unsupported_distributed"},
    "torch.bitwise_xor": {"forward_error"},
    "torch.index_select": {"forward_error"},
    "torch.diagonal_scatter": {"forward_error", "probe_failed"},
}


def _extracted(added: bool) -> tuple[dict, dict]:
    cfg = SeedsConfig(
        libraries=["torch"], operators=MISSED, added_overrides=added, cache_dir="none"
    )
    extraction = extract(["torch"], cfg)
    reasons = {v.measures["name"]: v.reason for v in extraction.verdicts}
    return {t.ops[0]: t for t in extraction.tasks}, reasons


@pytest.fixture(scope="module")
def added() -> tuple[dict, dict]:
    return _extracted(True)


@pytest.fixture(scope="module")
def before() -> tuple[dict, dict]:
    return _extracted(False)


def run(code: str) -> tuple[list, object]:
    namespace: dict = {}
    exec(compile(code, "<seed>", "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["Model"](*namespace["get_init_inputs"]())
    inputs = namespace["get_inputs"]()
    with torch.no_grad():
        return inputs, model(*inputs)


def test_the_missed_operators_are_seeds_with_the_added_tables(added):
    seeds, reasons = added
    assert {name: reasons[name] for name in MISSED} == {
        **{name: "ok" for name in MISSED},
        "torch.view_as_real": "unsupported_complex",
    }
    for name, task in seeds.items():
        assert task.meta["seed"]["spec"]["args"], name
        inputs, out = run(task.code)
        assert torch.isfinite(out.float()).all(), name


def test_integer_arguments_are_integers_in_range(added):
    seeds, _ = added
    (indices,), out = run(seeds["nn.Embedding"].code)
    assert indices.dtype == torch.int64 and indices.dim() == 2 and int(indices.max()) < 10
    assert list(out.shape) == [*indices.shape, 16]

    (x, index), out = run(seeds["torch.index_select"].code)
    assert index.dtype == torch.int64 and index.dim() == 1
    assert int(index.max()) < x.shape[1] and out.shape[1] == len(index)

    inputs, out = run(seeds["torch.bitwise_xor"].code)
    assert all(t.dtype == torch.int64 for t in inputs) and out.dtype == torch.int64

    code = seeds["torch.index_copy"].code
    assert "torch.arange(0, 12, 2)" in code  # distinct indices: one right answer
    (x, source), out = run(code)
    assert torch.equal(out[:, 0:12:2], source) and torch.equal(out[:, 1:12:2], x[:, 1:12:2])


def test_the_seeds_record_the_ranks_they_run_at(added):
    seeds, _ = added
    ranks = {name: sorted(int(r) for r in t.meta["seed"]["ranks"]) for name, t in seeds.items()}
    assert ranks["nn.Embedding"] == [1, 2, 3, 4, 5]
    assert ranks["torch.diagonal_scatter"] == [3]  # meta passes every rank; the table says
    assert ranks["nn.SyncBatchNorm"] == [2, 3, 4, 5]


def test_sync_batch_norm_without_a_process_group_is_batch_norm(added):
    seeds, _ = added
    (x,), out = run(seeds["nn.SyncBatchNorm"].code)
    assert not torch.distributed.is_initialized()
    expected = torch.nn.BatchNorm2d(x.shape[1])(x)
    assert torch.allclose(out, expected, atol=1e-5)


def test_without_the_added_tables_the_operators_are_derived_as_before(added, before):
    seeds, reasons = before
    for name, expected in STILL_REJECTED.items():
        assert reasons[name] in expected, (name, reasons[name])
    assert reasons["torch.view_as_real"] == "unsupported_complex"
    # a torch whose meta kernel refuses the float indices derives a call of its own
    for name in ("nn.Embedding", "torch.index_copy"):
        if name in seeds:
            assert seeds[name].meta["seed"]["spec"] != added[0][name].meta["seed"]["spec"]


def test_a_seed_is_rebound_with_the_tables_it_was_derived_with(added, before):
    for name, task in added[0].items():
        spec = spec_from_json(task.meta["seed"]["spec"])
        table = table_of(spec, entry_of(spec))
        assert (table is OVERRIDES) == (name not in ADDED_OVERRIDES), name
    for task in before[0].values():
        spec = spec_from_json(task.meta["seed"]["spec"])
        assert table_of(spec, entry_of(spec)) is OVERRIDES, task.ops
    # an index follows the dim it selects from
    spec = spec_from_json(added[0]["torch.index_select"].meta["seed"]["spec"])
    rebound = rebind(spec, (32, 3, 16, 16), 4)[0]
    index = next(a for a in rebound.args if a.name == "index")
    assert index.dtype == "int64" and index.high == 3


def test_the_v1_release_extracts_and_resumes_as_before():
    """v1.0.0 pins the setting off: its config hash and catalogue key are those it was made
    with, and none of its committed seeds is an operator the added tables change."""
    cfg = load_config(RELEASE / "config.toml")
    assert cfg.seeds.added_overrides is False
    assert "added_overrides" not in cfg.seeds.work_dump()
    manifest = RELEASE / "run" / "run.json"
    if manifest.is_file():
        assert cfg.config_hash() == json.loads(manifest.read_text())["config_hash"]
    on = cfg.seeds.model_copy(update={"added_overrides": True})
    assert on.work_dump()["added_overrides"] is True
    committed = RELEASE / "run" / "catalogue" / "seeds.parquet"
    if committed.is_file():
        names = {t.ops[0] for t in read_tasks(committed)}
        assert not names & (set(ADDED_OVERRIDES) | UNSCREENED)
