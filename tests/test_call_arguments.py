"""The optional keyword arguments a set passes (``opsynth.call_arguments``) and how the
composer draws them (``synth.optional_args``)."""

from __future__ import annotations

import json
import random

import pytest

from opsynth.call_arguments import MIN_CALLS, argument_profile, checked_arguments
from opsynth.profile import Profile, build_profile
from opsynth.synth.catalog.spec import CatalogSpec, InputSpec
from opsynth.synth.optional_args import draw_optional

TASK = """
import torch
import torch.nn as nn
from torch.nn import functional as Fn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding):
        super().__init__()
        self.up = torch.nn.ConvTranspose2d(
            in_channels, out_channels, kernel_size, stride=stride, padding=padding,
            output_padding=self.pad, bias=False,
        )
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        x = Fn.interpolate(self.up(x), scale_factor=2.0, mode="bilinear", size=None)
        return torch.mean(self.act(x), dim=(-2, -1), keepdim=True)


stride = 2
padding = -1 * 1
padding = 1
kernel_size = 3
"""


def test_keywords_are_counted_with_module_constants_resolved():
    profile = argument_profile([TASK] * MIN_CALLS)
    up = profile["nn.ConvTranspose2d"]
    assert up["calls"] == MIN_CALLS
    keywords = up["keywords"]
    assert keywords["stride"] == {"share": 1.0, "values": [[2, MIN_CALLS]]}
    assert keywords["padding"]["values"] == [[1, MIN_CALLS]]  # the later binding wins
    assert keywords["bias"]["values"] == [[False, MIN_CALLS]]
    # passed, but with a value no literal or module constant gives
    assert keywords["output_padding"] == {"share": 1.0, "values": []}
    assert profile["F.interpolate"]["keywords"]["size"]["values"] == [[None, MIN_CALLS]]
    assert profile["F.interpolate"]["keywords"]["mode"]["values"] == [["bilinear", MIN_CALLS]]
    assert profile["torch.mean"]["keywords"]["dim"]["values"] == [[[-2, -1], MIN_CALLS]]
    assert "nn.ReLU" not in profile  # its only keyword makes it in-place: not kept
    # an operator called fewer than MIN_CALLS times, or in code that does not parse, is left out
    assert argument_profile([TASK] * (MIN_CALLS - 1) + ["def broken(:"]) == {}


def test_shares_count_the_calls_that_pass_a_keyword():
    plain = TASK.replace("keepdim=True", "").replace("dim=(-2, -1), ", "dim=1")
    profile = argument_profile([TASK] * 6 + [plain] * 4)
    keywords = profile["torch.mean"]["keywords"]
    assert keywords["keepdim"]["share"] == 0.6
    assert keywords["dim"] == {"share": 1.0, "values": [[[-2, -1], 6], [1, 4]]}


def test_a_profile_carries_its_arguments_and_refuses_malformed_ones():
    rows = [{"ops": json.dumps(["nn.ConvTranspose2d"]), "data_source": "torch#1", "code": TASK}]
    profile = build_profile(rows * MIN_CALLS, "tiny")
    assert profile["arguments"] == argument_profile([TASK] * MIN_CALLS)
    assert Profile.from_dict(json.loads(json.dumps(profile))).to_dict() == profile
    older = {k: v for k, v in profile.items() if k != "arguments"}
    assert Profile.from_dict(older).arguments == {}
    bad_share = {"op": {"calls": 5, "keywords": {"k": {"share": 2.0, "values": []}}}}
    bad_pairs = {"op": {"calls": 5, "keywords": {"k": {"share": 0.5, "values": [[1]]}}}}
    no_calls = {"op": {"keywords": {}}}  # the fidelity table weighs by calls
    for arguments in (bad_share, bad_pairs, no_calls, {"op": 3}, [1]):
        with pytest.raises(ValueError) as err:
            Profile.from_dict({**profile, "arguments": arguments}, "p.json")
        assert str(err.value).startswith("p.json: malformed profile, arguments")
        assert "\n" not in str(err.value)
    assert checked_arguments({}) == {}


def test_draws_add_only_keywords_the_spec_does_not_pass():
    table = {
        "nn.ConvTranspose1d": {
            "calls": 10,
            "keywords": {
                "stride": {"share": 1.0, "values": [[2, 9], [1, 1]]},
                "padding": {"share": 1.0, "values": [[[1], 3]]},
                "kernel_size": {"share": 1.0, "values": [[3, 5]]},  # passed already
                "dilation": {"share": 0.0, "values": [[2, 5]]},  # never
                "groups": {"share": 1.0, "values": []},  # no known value
                "p": {"share": 1.0, "values": [[0.5, 5]]},  # the solver's own
            },
        }
    }
    spec = CatalogSpec(
        "torch",
        "nn.ConvTranspose1d",
        "module",
        "nn.ConvTranspose1d",
        init=(("in_channels", 4), ("out_channels", 4), ("kernel_size", 3)),
        args=(InputSpec("input", (2, 4, 8)),),
    )
    rng = random.Random(0)
    draws = [draw_optional(spec, table, rng) for _ in range(200)]
    assert all([k for k, _ in d] == ["stride", "padding"] for d in draws)  # the table's order
    assert all(dict(d)["padding"] == (1,) for d in draws)  # a list value passes as a tuple
    strides = [dict(d)["stride"] for d in draws]
    assert 0.8 < strides.count(2) / len(strides) < 0.98  # drawn by count: 9 to 1
    other = CatalogSpec("torch", "torch.tanh", "function", "torch.tanh", args=(spec.args[0],))
    state = rng.getstate()
    assert draw_optional(other, table, rng) == () and rng.getstate() == state


def test_fidelity_compares_keyword_arguments_per_call():
    from opsynth.report.fidelity import fidelity_table

    def rows(code: str, n: int = MIN_CALLS) -> list[dict]:
        ops = json.dumps(["nn.ConvTranspose2d", "F.interpolate", "torch.mean"])
        return [{"ops": ops, "data_source": "torch#3", "code": code}] * n

    bare = (
        TASK.replace(", stride=stride, padding=padding,\n", ",")
        .replace("output_padding=self.pad, bias=False,", "")
        .replace(', mode="bilinear", size=None', "")
        .replace(", dim=(-2, -1), keepdim=True", "")
    )
    table = fidelity_table(rows(bare), rows(TASK))
    [row] = table.filter(table["section"] == "arguments").iter_rows(named=True)
    # the reference: ConvTranspose2d 4 keywords, interpolate 3, mean 2, weighted alike
    assert row["measure"] == "keyword arguments per call"
    assert row["reference"] == 3.0 and row["run"] == round(1 / 3, 3), row
    # a reference profile without counted keywords (written before them) has no such row
    older = Profile.from_dict({**build_profile(rows(TASK), "old"), "arguments": {}})
    table = fidelity_table(rows(bare), older)
    assert table.filter(table["section"] == "arguments").is_empty()
