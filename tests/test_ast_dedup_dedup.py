"""Intra-set dedup: normalisation, dataflow graphs, clusters and representatives."""

from __future__ import annotations

import ast
import json
import random
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from opsynth.ast_dedup.dataflow import forward_graph, structural_hash
from opsynth.ast_dedup.decontam import decontaminate_tasks
from opsynth.ast_dedup.dedup import (
    EXACT,
    NEAR,
    STRUCTURAL,
    KeyCache,
    _keys_chunk,
    dedup,
    key_settings,
    make_keymaker,
)
from opsynth.ast_dedup.normalize import normal_form
from opsynth.ast_dedup.parallel import map_chunks
from opsynth.ast_dedup.screen import screen
from opsynth.config import DecontamConfig, DedupConfig
from opsynth.record import Task
from opsynth.refdata import OPS6K, shared_file

BASE = textwrap.dedent(
    '''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Model(nn.Module):
        """Linear, ReLU, scale."""
        def __init__(self, in_features, out_features, scale):
            super().__init__()
            self.linear = nn.Linear(in_features, out_features)
            self.scale = scale

        def forward(self, x):
            x = self.linear(x)
            x = F.relu(x)
            x = x * self.scale
            return x

    batch_size = 128
    in_features = 64
    out_features = 32

    def get_inputs():
        return [torch.randn(batch_size, in_features)]

    def get_init_inputs():
        return [in_features, out_features, 2.0]
    '''
)

# BASE with comments, formatting, docstring and every chosen name changed.
BASE_RENAMED = textwrap.dedent(
    """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class Model(nn.Module):
        def __init__(self, fin, fout, s):  # constructor
            super().__init__()
            self.fc = nn.Linear(fin,
                                fout)
            self.s = s

        def forward(self, inp):
            inp = self.fc(inp)
            inp = F.relu(inp)
            inp = inp * self.s
            return inp


    bs = 128
    fin = 64
    fout = 32


    def get_inputs():
        '''Inputs.'''
        return [torch.randn(bs, fin)]


    def get_init_inputs():
        return [fin, fout, 2.0]
    """
)


def task(code: str) -> Task:
    return Task(ops=["nn.Linear", "F.relu"], data_source="torch#2", code=code)


def keys_of(code: str):
    return normal_form(ast.parse(code))


# -- normalisation ---------------------------------------------------------------------------


def test_normal_form_ignores_comments_formatting_docstrings_and_chosen_names():
    assert keys_of(BASE).key == keys_of(BASE_RENAMED).key


@pytest.mark.parametrize(
    "edit",
    [
        ("F.relu", "F.gelu"),  # another operator
        ("batch_size = 128", "batch_size = 256"),  # another size
        ("x * self.scale", "x + self.scale"),  # another arithmetic operator
        ("super().__init__()", "super(Model, self).__init__()"),
    ],
)
def test_normal_form_keeps_real_differences(edit):
    assert keys_of(BASE).key != keys_of(BASE.replace(*edit)).key


def test_merging_two_names_is_a_difference():
    merged = BASE.replace("out_features", "in_features")
    assert keys_of(BASE).key != keys_of(merged).key


def test_shingles_change_locally():
    a, b = keys_of(BASE).shingles, keys_of(BASE.replace("batch_size = 128", "batch_size = 64"))
    shared = len(set(a.tolist()) & set(b.shingles.tolist()))
    jaccard = shared / len(set(a.tolist()) | set(b.shingles.tolist()))
    assert 0.8 < jaccard < 1.0


# -- dataflow graphs -------------------------------------------------------------------------


def graph_labels(code: str) -> list[str]:
    model = next(n for n in ast.parse(code).body if isinstance(n, ast.ClassDef))
    return [label for _, label in forward_graph(model).nodes(data="label")]


def test_forward_graph_follows_data_and_unifies_spellings():
    assert graph_labels(BASE) == ["input", "linear", "relu", "mul", "output"]
    spellings = ["F.relu(x)", "torch.relu(x)", "x.relu()", "self.act(x)"]
    hashes = set()
    for spelling in spellings:
        code = BASE.replace("F.relu(x)", spelling).replace(
            "self.scale = scale", "self.scale = scale\n        self.act = nn.ReLU()"
        )
        model = next(n for n in ast.parse(code).body if isinstance(n, ast.ClassDef))
        hashes.add(structural_hash(forward_graph(model)))
    assert len(hashes) == 1
    assert graph_labels(BASE.replace("x * self.scale", "torch.mul(x, self.scale)"))[3] == "mul"


def test_forward_graph_wiring_matters():
    residual = BASE.replace("x = F.relu(x)", "x = F.relu(x) + x")
    assert structural_hash(forward_graph(_model(residual))) != structural_hash(
        forward_graph(_model(BASE))
    )


def test_sequential_containers_list_their_layers():
    code = BASE.replace(
        "nn.Linear(in_features, out_features)",
        "nn.Sequential(nn.Linear(in_features, out_features), nn.Tanh())",
    )
    assert graph_labels(code)[1] == "sequential[linear,tanh]"


def test_a_module_dict_call_is_labelled_with_the_module_it_holds_under_that_key():
    """``self.layers["a"](x)`` calls the module stored under ``"a"``: one ModuleDict task
    of a linear layer and one of a tanh are different structures, not two anonymous calls."""
    held = {"linear": "nn.Linear(in_features, out_features)", "tanh": "nn.Tanh()"}
    graphs = []
    for key, built in held.items():
        code = BASE.replace(
            "self.linear = nn.Linear(in_features, out_features)",
            f'self.layers = nn.ModuleDict({{"{key}": {built}, "other": nn.ReLU()}})',
        ).replace("self.linear(x)", f'self.layers["{key}"](x)')
        assert graph_labels(code)[1] == key, code
        graphs.append(structural_hash(forward_graph(_model(code))))
    assert graphs[0] != graphs[1]
    # the same layer held in a dict or as an attribute is the same structure
    plain = structural_hash(forward_graph(_model(BASE)))
    assert graphs[0] == plain


def test_a_parameter_held_in_a_list_or_dict_is_a_parameter_of_the_graph():
    attribute = BASE.replace("self.scale = scale", "self.scale = nn.Parameter(torch.ones(1))")
    held = {
        "nn.ParameterList([nn.Parameter(torch.ones(1))])": "self.scale[0]",
        'nn.ParameterDict({"s": nn.Parameter(torch.ones(1))})': 'self.scale["s"]',
    }
    plain = structural_hash(forward_graph(_model(attribute)))
    assert "parameter" in graph_labels(attribute)
    for holder, read in held.items():
        code = BASE.replace("self.scale = scale", f"self.scale = {holder}").replace(
            "x * self.scale", f"x * {read}"
        )
        assert "parameter" in graph_labels(code), code
        assert structural_hash(forward_graph(_model(code))) == plain, code


def test_graph_is_built_without_running_the_code(tmp_path: Path):
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w').write('x')\n" + BASE
    assert forward_graph(_model(code)) is not None
    assert dedup([task(code)], DedupConfig(structural=True, workers=1)).counts["kept"] == 1
    assert not marker.exists()


def test_no_forward_means_no_structural_key():
    assert forward_graph(_model("class Model:\n    def __init__(self):\n        pass\n")) is None


def _model(code: str) -> ast.ClassDef:
    return next(n for n in ast.parse(code).body if isinstance(n, ast.ClassDef))


# -- dedup -----------------------------------------------------------------------------------


def test_exact_duplicates_keep_the_smallest_id():
    tasks = [task(BASE), task(BASE_RENAMED), task(BASE + "\n# trailing comment\n")]
    result = dedup(tasks, DedupConfig(workers=1))
    keep = min(t.id for t in tasks)
    assert [t.id for t in result.kept] == [keep]
    assert result.counts == {"input": 3, "kept": 1, f"dropped_{EXACT}": 2}
    clusters = {v.measures["exact_cluster"] for v in result.verdicts}
    assert len(clusters) == 1
    for v in result.verdicts:
        assert v.stage == "dedup"
        if not v.passed:
            assert v.reason == EXACT and v.measures["duplicate_of"] == keep


def test_near_duplicates_and_switch():
    # One changed size: a near-duplicate. A changed operator also changes its method's and
    # class's shingles, which keeps it below the default threshold.
    variants = [BASE.replace("batch_size = 128", f"batch_size = {n}") for n in (16, 32, 64, 96)]
    tasks = [task(v) for v in variants]
    other_op = dedup([tasks[0], task(variants[0].replace("F.relu", "F.gelu"))], DedupConfig())
    assert other_op.counts["kept"] == 2
    on = dedup(tasks, DedupConfig(workers=1))
    assert on.counts["kept"] == 1
    assert on.counts[f"dropped_{NEAR}"] == 3
    assert len({v.measures["near_cluster"] for v in on.verdicts}) == 1
    for v in on.verdicts:
        assert v.measures["near_jaccard"] >= 0.85
    off = dedup(tasks, DedupConfig(near=False, structural=False, workers=1))
    assert off.counts["kept"] == 4
    assert "near_cluster" not in off.verdicts[0].measures


def test_structural_duplicates_are_dropped_by_default():
    other = (
        BASE.replace("in_features = 64", "in_features = 512")
        .replace("out_features = 32", "out_features = 1024")
        .replace("batch_size = 128", "batch_size = 7")
        .replace("F.relu(x)", "torch.relu(x)")
        .replace("return [in_features, out_features, 2.0]", "return [in_features, 9, 0.5]")
        .replace("self.linear", "self.proj")
    )
    tasks = [task(BASE), task(other)]
    assert dedup(tasks, DedupConfig(structural=False, workers=1)).counts["kept"] == 2
    assert dedup(tasks, DedupConfig(workers=1)).counts["kept"] == 1
    on = dedup(tasks, DedupConfig(structural=True, near=False, workers=1))
    assert on.counts == {"input": 2, "kept": 1, f"dropped_{STRUCTURAL}": 1}
    assert len({v.measures["structural_cluster"] for v in on.verdicts}) == 1


def test_result_does_not_depend_on_input_order():
    codes = [BASE, BASE_RENAMED, BASE.replace("F.relu", "F.gelu")]
    codes += [BASE.replace("batch_size = 128", f"batch_size = {n}") for n in (1, 2, 3)]
    tasks = [task(c) for c in codes]
    cfg = DedupConfig(structural=True, workers=1)
    first = dedup(tasks, cfg)
    shuffled = tasks[:]
    random.Random(3).shuffle(shuffled)
    second = dedup(shuffled, cfg)
    assert {t.id for t in first.kept} == {t.id for t in second.kept}
    assert [v.task_id for v in second.verdicts] == [t.id for t in shuffled]


def test_a_growing_set_reuses_its_keys_and_gets_the_same_verdicts(monkeypatch):
    import opsynth.ast_dedup.dedup as dedup_module

    codes = [BASE, BASE_RENAMED, BASE.replace("F.relu", "F.gelu")]
    codes += [BASE.replace("batch_size = 128", f"batch_size = {n}") for n in (1, 2, 3)]
    tasks = [task(c) for c in codes]
    cfg = DedupConfig(structural=True, workers=1)
    cache = KeyCache()
    dedup(tasks[:3], cfg, cache)
    parsed: list[str] = []
    real_parse = dedup_module.parse_task_code

    def counting_parse(code: str):
        parsed.append(code)
        return real_parse(code)

    monkeypatch.setattr(dedup_module, "parse_task_code", counting_parse)
    grown = dedup(tasks, cfg, cache)
    assert sorted(parsed) == sorted(codes[3:])  # only the new tasks were analysed
    fresh = dedup(tasks, cfg)
    assert [(v.task_id, v.reason, v.measures) for v in grown.verdicts] == [
        (v.task_id, v.reason, v.measures) for v in fresh.verdicts
    ]
    # keys made under other settings are not served: another setting analyses everything
    parsed.clear()
    dedup(tasks, DedupConfig(structural=False, workers=1), cache)
    assert sorted(parsed) == sorted(codes)


def test_bad_code_is_keyed_by_its_text_and_never_crashes():
    tasks = [task("def f(:\n"), task("def f(:\n# other\n"), task("x = 1\n"), task(BASE)]
    tasks.append(Task(ops=["x"], data_source="torch#2", code="def f(:\n"))
    result = dedup(tasks, DedupConfig(structural=True, workers=1))
    reasons = [v.reason for v in result.verdicts]
    assert reasons[1:4] == ["ok", "ok", "ok"]  # other text, no Model class, a normal task
    assert sorted([reasons[0], reasons[4]]) == [EXACT, "ok"]  # same text, different ops
    parse = [v.measures["parse"] for v in result.verdicts]
    assert parse == ["unparseable", "unparseable", "no_model_class", "ok", "unparseable"]


def test_deeply_nested_code_gets_keys():
    deep = "class Model:\n    def forward(self, x):\n        return " + " + ".join(["x"] * 900)
    result = dedup([task(deep), task(deep + "  # same\n")], DedupConfig(structural=True))
    assert result.counts == {"input": 2, "kept": 1, f"dropped_{EXACT}": 1}
    assert result.verdicts[0].measures["structural_cluster"] is not None


def test_empty_input():
    result = dedup([], DedupConfig())
    assert result.verdicts == [] and result.kept == []


def test_worker_processes_return_the_same_results_in_order():
    codes = [BASE.replace("batch_size = 128", f"batch_size = {n}") for n in range(40)]
    codes += ["def f(:\n", "x = 1\n"]
    settings = key_settings(DedupConfig(structural=True))
    args = (make_keymaker, (settings,), _keys_chunk, codes)
    inline = map_chunks(*args, workers=1)
    pooled = map_chunks(*args, workers=2, chunk_size=8, min_parallel=0)
    assert [(k.exact, k.structural, k.parse) for k in pooled] == [
        (k.exact, k.structural, k.parse) for k in inline
    ]
    assert all((a.minhash == b.minhash).all() for a, b in zip(inline[:40], pooled, strict=False))


def test_screen_equals_decontam_then_dedup():
    tasks = [
        task(BASE),
        task(BASE_RENAMED),
        task("def f(:\n"),
        task(BASE.replace("F.relu", "F.gelu")),
    ]
    cfg = DecontamConfig(threshold=0.99, workers=1)
    decon, dd = screen(tasks, cfg, DedupConfig(workers=1))
    alone = decontaminate_tasks(tasks, cfg)
    assert [v.measures for v in decon.verdicts] == [v.measures for v in alone.verdicts]
    assert decon.counts == {"input": 4, "kept": 3, "dropped_unparseable": 1}
    direct = dedup(decon.kept, DedupConfig(workers=1))
    assert [v.reason for v in dd.verdicts] == [v.reason for v in direct.verdicts]
    assert [v.measures for v in dd.verdicts] == [v.measures for v in direct.verdicts]


# -- released Ops-6K ---------------------------------------------------------------------


def test_ops6k_exact_duplicates():
    path = shared_file(OPS6K)
    if path is None:
        pytest.skip("Ops-6K parquet not found")
    rows = pq.read_table(path).to_pylist()
    codes = [r["code"] for r in rows]
    assert len(codes) - len(set(codes)) == 352  # identical code strings in the release
    tasks = [
        Task(
            ops=json.loads(r["ops"]) if r["ops"].startswith("[") else [r["ops"]],
            data_source=r["data_source"],
            code=r["code"],
        )
        for r in rows
    ]
    result = dedup(tasks, DedupConfig(near=False, structural=False, workers=1))
    normalised_dups = result.counts[f"dropped_{EXACT}"]
    print(
        f"Ops-6K: 352 identical strings, {normalised_dups} normalised exact duplicates; "
        f"dedup counts {dict(result.counts)}",
        file=sys.stderr,
    )
    assert normalised_dups >= 352
    assert len({v.measures["exact_cluster"] for v in result.verdicts}) == len(result.kept)
