"""Operator categories (``opsynth.taxonomy``) and reference profiles (``opsynth.profile``):
the classifier on names of every kind, the AST structure heuristic on small hand-written
tasks, profiles built from synthetic rows, the shipped Ops-6K profile, and loading errors."""

from __future__ import annotations

import json
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from opsynth.profile import (
    SHIPPED,
    Profile,
    build_profile,
    load_profile,
    main,
    ops_list,
    read_rows,
    task_structure,
)
from opsynth.refdata import OPS6K, shared_file
from opsynth.taxonomy import CATEGORIES, OTHER, category, normal_key, task_categories

EXPECTED = {
    "conv": ["nn.Conv2d", "nn.ConvTranspose3d", "F.conv1d", "nn.LazyConv2d", "torch.conv_tbc"],
    "matmul": [
        "nn.Linear",
        "torch.bmm",
        "torch.einsum",
        "torch.baddbmm",
        "nn.LSTM",
        "nn.GRU",
        "nn.MultiheadAttention",
        "F.scaled_dot_product_attention",
        "nn.EmbeddingBag",
        "@",
        "matmul",
    ],
    "norm": ["nn.BatchNorm2d", "F.group_norm", "nn.RMSNorm", "nn.LazyInstanceNorm3d"]
    + ["F.normalize", "torch.native_layer_norm"],
    "activation": ["nn.ReLU", "F.gelu", "torch.sigmoid", "torch.tanh", "nn.LogSoftmax"]
    + ["F.log_softmax", "torch.softmax", "nn.ReLU6", "nn.PReLU", "F.hardswish"],
    "reduction": ["torch.sum", "torch.max", "torch.norm", "torch.cumsum", "torch.logsumexp"]
    + ["torch.var_mean", "torch.all", "torch.equal", "torch.histc", "F.cosine_similarity"],
    "pooling": ["nn.MaxPool2d", "nn.AdaptiveAvgPool3d", "F.max_pool1d_with_indices"]
    + ["nn.LPPool1d"],
    "indexing": ["torch.gather", "torch.index_select", "torch.where", "torch.masked_fill"]
    + ["torch.isin", "torch.bucketize", "nn.Embedding", "torch.topk", "torch.argmax"]
    + ["torch.sort", "F.one_hot", "torch.nonzero"],
    "elementwise": ["torch.exp", "torch.log1p", "add", "+", "*", "/", "torch.clamp"]
    + ["torch.maximum", "torch.gt", "torch.logical_or", "torch.atan2", "nn.Dropout"],
    "layout": ["torch.reshape", "torch.permute", "torch.cat", "torch.stack", "torch.flip"]
    + ["F.pad", "nn.ReflectionPad2d", "F.interpolate", "nn.Upsample", "nn.PixelShuffle"]
    + ["nn.Unfold", "torch.triu", "torch.clone", "torch.split"],
    "loss": ["nn.MSELoss", "F.kl_div", "F.cross_entropy", "nn.CrossEntropyLoss"]
    + ["torch.binary_cross_entropy_with_logits", "nn.AdaptiveLogSoftmaxWithLoss"],
    OTHER: ["nn.Sequential", "nn.Parameter", "nn.functional", "torch.arange", "torch.stft"]
    + ["torch.is_complex", "HieraLayer_0", "ResNetBasicLayer_1", "torch.set_num_threads"],
}


@pytest.mark.parametrize("expected", list(EXPECTED))
def test_category_of_representative_names(expected):
    assert {name: category(name) for name in EXPECTED[expected]} == dict.fromkeys(
        EXPECTED[expected], expected
    )


def test_every_category_is_reachable_and_spellings_meet():
    assert set(EXPECTED) == {*CATEGORIES, OTHER}
    assert normal_key("ConvTranspose2d") == normal_key("conv_transpose2d") == "convtranspose"
    assert normal_key("LazyBatchNorm1d") == normal_key("native_batch_norm") == "batchnorm"
    for spellings in (
        ("nn.LogSoftmax", "F.log_softmax", "torch.log_softmax"),
        ("torch.relu_", "torch.relu", "nn.ReLU", "Tensor.relu"),
        ("torch.nn.functional.pad", "F.pad"),
    ):
        assert len({category(s) for s in spellings}) == 1, spellings


def test_unseen_names_fall_back_to_keywords():
    assert category("torch.special.expit") == "elementwise"
    assert category("torch.linalg.vector_norm") == "reduction"
    assert category("torch.linalg.matmul") == "matmul"
    assert category("F.adaptive_max_pool5d_with_indices") == "pooling"
    assert category("nn.FancyNewLoss") == "loss"
    assert category("torch.fft.rfft") == OTHER
    assert category("einops.rearrange") == "layout"
    assert category("torch.something_unheard_of") == OTHER


def test_task_categories():
    assert task_categories(["nn.Conv2d", "torch.relu", "nn.ReLU"]) == {"conv", "activation"}
    assert task_categories(["HieraLayer_0"]) == {OTHER}
    assert task_categories([]) == frozenset()


# -- structure ------------------------------------------------------------------------------

MULTI_TUPLE = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x, y):
        return x + y, x - y

batch_size = 8
dim = 16

def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(dim)]
"""

TOPK_INT = """
import torch
from torch import topk

class Model(torch.nn.Module):
    def forward(self, x, index):
        values = topk(x, 3, dim=1)
        return values

shape = (2, 3, 4, 5, 6)

def get_inputs():
    mask = torch.rand(2, 3) > 0.5
    return [torch.randn(*shape), torch.randint(0, 10, (7,))]
"""

LSTM_MODULE = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(8, 8)

    def forward(self, x):
        return self.rnn(x)

def get_inputs():
    return [torch.randn(4, 2, 8).view(8, 8)]
"""

INDEXED = """
import torch

class Model(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            x = x * 2
        return torch.max(x, dim=1)[0] + torch.max(x)

n = 10

def get_inputs():
    if n > 5:  # a branch test, not a bool tensor
        pass
    return [torch.randn(n).unsqueeze(0), torch.zeros(size=(n, n, n))]
"""

NOT_PYTHON = "class Model(:\n    pass\n"


def test_structure_multi_input_and_tuple_literal():
    facts = task_structure(MULTI_TUPLE)
    assert facts == {
        "parsed": True,
        "forward_inputs": 2,
        "tuple_output": True,
        "int_input": False,
        "input_ranks": [1, 2],
    }


def test_structure_tuple_op_int_input_and_rank_5():
    facts = task_structure(TOPK_INT)
    assert facts["tuple_output"]  # a returned name bound to topk(...), through `from torch`
    assert facts["int_input"]
    assert facts["input_ranks"] == [1, 2, 5]  # rand(2, 3) > 0.5, randn(*shape), randint size


def test_structure_module_tuple_and_method_chain():
    facts = task_structure(LSTM_MODULE)
    assert facts["forward_inputs"] == 1 and facts["tuple_output"]
    assert facts["input_ranks"] == [2]  # .view(8, 8) sets the rank


def test_structure_indexed_results_and_branch_tests():
    facts = task_structure(INDEXED)
    assert not facts["tuple_output"]  # indexed max, and max without a dim
    assert not facts["int_input"]  # the only comparison in get_inputs is a branch test
    assert facts["input_ranks"] == [2, 3]  # unsqueeze adds one; size= keyword


def test_structure_of_unparseable_code():
    facts = task_structure(NOT_PYTHON)
    assert facts["parsed"] is False and facts["input_ranks"] == []


# -- profiles -------------------------------------------------------------------------------


def _rows() -> list[dict]:
    return [
        {
            "ops": json.dumps(["nn.Conv2d", "torch.relu"]),
            "data_source": "torch#2",
            "code": LSTM_MODULE,
        },
        {
            "ops": json.dumps(["nn.Conv2d", "torch.relu"]),
            "data_source": "torch#2",
            "code": MULTI_TUPLE,
        },
        {"ops": json.dumps(["torch.topk"]), "data_source": "torch#1", "code": TOPK_INT},
        {"ops": "HieraLayer_0", "data_source": "transformers", "code": INDEXED},
    ]


def test_build_profile_on_synthetic_rows():
    profile = build_profile(_rows(), "tiny")
    assert profile["name"] == "tiny" and profile["tasks"] == 4
    assert profile["data_source"] == {"torch#1": 0.25, "torch#2": 0.5, "transformers": 0.25}
    assert profile["ops"] == {"nn.Conv2d": 2, "torch.relu": 2, "torch.topk": 1}
    assert profile["occurrences"]["torch.relu"] == 2
    assert profile["sequences"] == 3
    assert profile["transformers_classes"] == ["HieraLayer"]
    cats = profile["categories"]
    assert cats["conv"] == 0.5 and cats["indexing"] == 0.25 and cats[OTHER] == 0.25
    assert set(cats) == {*CATEGORIES, OTHER}
    structure = profile["structure"]
    assert structure["multi_input"] == 0.5 and structure["tuple_output"] == 0.75
    assert structure["int_input"] == 0.25
    assert structure["ranks"]["5"] == 0.25 and structure["ranks"]["2"] == 1.0
    loaded = Profile.from_dict(json.loads(json.dumps(profile)))
    assert loaded.to_dict() == profile


def test_ops_list_reads_every_spelling():
    assert ops_list('["a", "b"]') == ["a", "b"]
    assert ops_list(["a"]) == ["a"]
    assert ops_list("HieraLayer_0") == ["HieraLayer_0"]


def test_load_profile_names_and_errors(tmp_path):
    assert load_profile("uniform") is None
    shipped = load_profile("ops6k")
    assert shipped is not None and shipped.tasks == 6000
    assert set(shipped.categories) == {*CATEGORIES, OTHER}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(build_profile(_rows(), "tiny")))
    assert load_profile(str(path)).name == "tiny"
    bad = {
        "missing.json": None,
        "notjson.json": "{not json",
        "list.json": "[1, 2]",
        "keys.json": json.dumps({"name": "x"}),
        "format.json": json.dumps({**build_profile(_rows()), "format": 99}),
        "types.json": json.dumps({**build_profile(_rows()), "ops": [1, 2]}),
        "empty.json": json.dumps(build_profile([])),
    }
    for name, text in bad.items():
        if text is not None:
            (tmp_path / name).write_text(text)
        with pytest.raises(ValueError) as err:
            load_profile(str(tmp_path / name))
        assert "\n" not in str(err.value) and name in str(err.value), str(err.value)
    with pytest.raises(ValueError, match="ops6k"):
        load_profile("no-such-profile")


def test_profile_command_writes_a_profile(tmp_path, capsys):
    rows = _rows()
    table = pa.table({k: [r[k] for r in rows] for k in ("ops", "data_source", "code")})
    pq.write_table(table, tmp_path / "set.parquet")
    assert main(["--input", str(tmp_path / "set.parquet"), "--out", str(tmp_path / "x.json")]) == 0
    written = json.loads((tmp_path / "x.json").read_text())
    assert written == build_profile(rows, "x")
    assert read_rows(tmp_path / "set.parquet") == rows
    pq.write_table(pa.table({"code": ["x"]}), tmp_path / "bad.parquet")
    assert main(["--input", str(tmp_path / "bad.parquet"), "--out", str(tmp_path / "y.json")]) == 2
    assert "lacks column(s) ops, data_source" in capsys.readouterr().err


# -- the released set -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def released() -> list[dict]:
    path = shared_file(OPS6K)
    if path is None:
        pytest.skip("the released Ops-6K parquet is not in $OPSYNTH_SHARED or ../shared")
    return read_rows(path)


def test_released_operators_are_classified(released):
    uses = Counter(
        op for r in released if r["data_source"] != "transformers" for op in ops_list(r["ops"])
    )
    other = {op: n for op, n in uses.items() if category(op) == OTHER}
    assert sum(other.values()) / sum(uses.values()) <= 0.05, sorted(other.items())
    # what stays unclassified is no computation: containers, factories, queries, spectral
    allowed = ("nn.", "torch.arange", "torch.linspace", "torch.normal", "torch.scalar_tensor")
    assert all(op.startswith(allowed) or op in ("torch.stft", "torch.is_complex") for op in other)


def test_shipped_profile_is_the_released_sets(released):
    assert load_profile("ops6k").to_dict() == build_profile(released, "ops6k")
    assert SHIPPED["ops6k"].name == "ops6k.json"
