"""The static pre-check: accepts real tasks, rejects each forbidden form with its reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opsynth.filters.samples import GOOD
from opsynth.filters.static_check import StaticCheck, check_source
from opsynth.record import Task

KERNELBENCH = Path("/work/shared/kernelbench/kernelbench.jsonl")
OPS6K = Path("/work/shared/ops6k/cuda_agent_ops_6k.parquet")

TAIL = """

def get_inputs():
    return [torch.randn(4, 4)]


def get_init_inputs():
    return []
"""


def module(forward: str, header: str = "") -> str:
    return (
        f"import torch\nimport torch.nn as nn\n{header}\n\n"
        "class Model(nn.Module):\n"
        "    def forward(self, x):\n"
        f"        {forward}\n" + TAIL
    )


def test_good_sample_passes() -> None:
    task = Task(ops=["nn.Linear"], data_source="torch#1", code=GOOD)
    decision = StaticCheck().filter(task)
    assert decision.keep, decision
    assert StaticCheck.name == "static"


@pytest.mark.skipif(not KERNELBENCH.exists(), reason="KernelBench reference data absent")
def test_accepts_every_kernelbench_level1_and_level2_problem() -> None:
    rows = [json.loads(line) for line in KERNELBENCH.read_text().splitlines()]
    torch_only = [r for r in rows if r["level"] in (1, 2)]
    assert len(torch_only) > 100
    rejected = [(r["name"], check_source(r["code"])) for r in torch_only]
    rejected = [(name, d.detail) for name, d in rejected if not d.keep]
    assert rejected == []


@pytest.mark.skipif(not OPS6K.exists(), reason="Ops-6K reference data absent")
def test_accepts_released_ops6k_torch_rows() -> None:
    import pyarrow.parquet as pq

    rows = pq.read_table(OPS6K).slice(0, 300).to_pylist()
    rejected = [
        r["ops"]
        for r in rows
        if r["data_source"].startswith("torch") and not check_source(r["code"]).keep
    ]
    assert rejected == []


def test_syntax_error() -> None:
    decision = check_source("def broken(:\n    pass")
    assert (decision.keep, decision.reason) == (False, "syntax_error")


@pytest.mark.parametrize("symbol", ["Model", "get_inputs", "get_init_inputs"])
def test_missing_symbol(symbol: str) -> None:
    source = GOOD.replace(f"class {symbol}", "class Other").replace(f"def {symbol}(", "def other_(")
    decision = check_source(source)
    assert (decision.keep, decision.reason) == (False, "missing_symbol")
    assert symbol in decision.detail


@pytest.mark.parametrize(
    "header",
    [
        "import os",
        "import sys",
        "import subprocess",
        "import socket",
        "import ctypes",
        "import threading",
        "import multiprocessing",
        "import importlib",
        "import pickle",
        "import shutil",
        "import inspect",
        "import os.path",
        "from os import path",
        "from . import sibling",
        "import numpy as np",
        "import transformers",
        "import torch.utils.cpp_extension",
        "from torch.utils.cpp_extension import load_inline",
        "from torch.utils import cpp_extension",
        "import torch.multiprocessing as mp",
        "import torch.distributed as dist",
        "from torch import hub",
        "from torch.serialization import load",
        "from torch._C import DisableTorchFunction",
        "import torch.library",
        # a module another module re-exports, imported by name
        "from torch import sys",
        "from typing import sys",
        "from torch import os as o",
    ],
)
def test_forbidden_import(header: str) -> None:
    decision = check_source(module("return x", header))
    assert (decision.keep, decision.reason) == (False, "forbidden_import"), decision


def test_import_inside_function_is_checked() -> None:
    decision = check_source(module("import os\n        return x"))
    assert decision.reason == "forbidden_import"


def test_transformers_only_for_transformers_tasks() -> None:
    source = module("return x", "from transformers.activations import ACT2FN")
    torch_task = Task(ops=["x"], data_source="torch#2", code=source)
    hf_task = Task(ops=["x"], data_source="transformers", code=source)
    assert StaticCheck().filter(torch_task).reason == "forbidden_import"
    assert StaticCheck().filter(hf_task).keep


@pytest.mark.parametrize(
    ("forward", "header"),
    [
        ("return open('/etc/passwd').read()", ""),
        ("f = open\n        return x", ""),
        ("return eval('x')", ""),
        ("exec('y = 1')\n        return x", ""),
        ("return compile('1', 'f', 'eval')", ""),
        ("return __import__('os')", ""),
        ("return globals()['torch']", ""),
        ("return locals()", ""),
        ("breakpoint()\n        return x", ""),
        ("input()\n        return x", ""),
        ("exit(0)", ""),
        ("return __builtins__", ""),
        ("return getattr(x, '__class__')", ""),
        ("setattr(x, '__dict__', {})\n        return x", ""),
        ("return x.__class__.__bases__[0].__subclasses__()", ""),
        ("return ().__class__.__base__", ""),
        ("return self.forward.__globals__", ""),
        ("return self.forward.__func__", ""),
        ("return print.__self__", ""),
        ("return '{0.__globals__}'.format(self.forward)", ""),
        ("return torch.load('weights.pt')", ""),
        ("torch.save(x, '/tmp/x.pt')\n        return x", ""),
        ("return t.load('weights.pt')", "import torch as t"),
        ("return load('weights.pt')", "from torch import load"),
        ("return getattr(torch, 'load')('w.pt')", ""),
        ("torch.ops.load_library('/tmp/evil.so')\n        return x", ""),
        ("return torch.hub.load('repo', 'model')", ""),
        ("return torch.utils.cpp_extension.load_inline('m', '')", ""),
        ("return torch.from_file('/etc/passwd')", ""),
        ("return self.forward.__code__", ""),
        ("return self.gen.gi_frame.f_back.f_globals", ""),
        # modules other modules re-export: the import the allow-list refused, by attribute
        ("return torch.os.system('id')", ""),
        ("return torch.sys.modules", ""),
        ("return F.builtins.open('/etc/passwd')", "import torch.nn.functional as F"),
        ("return math.sys", "import math"),
        ("return getattr(torch, 'os')", ""),
        # names built at run time, namespaces as dicts
        ("return getattr(torch, 'o' + 's').system('id')", ""),
        ("return getattr(torch, ''.join(['lo', 'ad']))('w.pt')", ""),
        ("setattr(torch, self.name, None)\n        return x", ""),
        ("return vars(torch)['load']('w.pt')", ""),
        ("return torch.__dict__['load']('w.pt')", ""),
        # torch's native core, pickle loading, operator registration, dispatch overrides
        ("return torch.serialization.load('w.pt')", ""),
        ("with torch._C.DisableTorchFunction():\n            return x", ""),
        ("return torch.library.Library('aten', 'IMPL')", ""),
        ("return torch.overrides.TorchFunctionMode", ""),
        # a module or getattr as a value: through the alias, names the check cannot read
        ("with T._C.DisableTorchFunction():\n            return x", "T = torch"),
        ("return N.functional.relu(x)", "N = torch.nn"),
        ("return self.m._C", "class Holder:\n    m = [torch][0]"),
        ("return (lambda: torch)()._C", ""),
        ("return helper()", "def helper(m=torch):\n    return m._C"),
        ("return g(torch, 's' + 'ys')", "g = getattr"),
        ("return functools.reduce(getattr, ['s' + 'ys'], torch)", "import functools"),
        ("return getattr(torch, 'nn')", ""),
        # a binding that shadows a forbidden builtin would hide it from the check
        ("return x", "def helper(open=open):\n    return open"),
        ("return x", "compile = None"),
        ("return x", "import torch as eval"),
        # a generator of its own: the same output under every RNG state the checks set
        ("torch.manual_seed(0)\n        return F.dropout(x, 0.5)", ""),
        ("torch.manual_seed(int(x.sum()))\n        return torch.randn_like(x)", ""),
        ("torch.cuda.manual_seed_all(1)\n        return x", ""),
        ("torch.random.set_rng_state(self.state)\n        return x", ""),
        ("with torch.random.fork_rng():\n            return x", ""),
        ("return torch.randn(x.shape, generator=torch.Generator().manual_seed(1))", ""),
        ("return torch.rand(3, generator=torch.default_generator)", ""),
        ("return torch.rand(3, generator=torch.cuda.default_generators[0])", ""),
        ("return torch.rand(3, generator=Generator())", "from torch import Generator"),
        ("seed(0)\n        return x", "from torch.random import seed"),
        ("getattr(torch, 'manual_seed')(0)\n        return x", ""),
        ("t.seed()\n        return x", "import torch as t"),
        # methods that swallow errors or run at the interpreter's choosing
        ("return x", "class Quiet:\n    def __exit__(self, *exc):\n        return True"),
        ("return x", "class Later:\n    def __del__(self):\n        pass"),
    ],
)
def test_forbidden_call(forward: str, header: str) -> None:
    decision = check_source(module(forward, header))
    assert (decision.keep, decision.reason) == (False, "forbidden_call"), decision


@pytest.mark.parametrize(
    "forward",
    [
        "return self.eval() or x",
        "return torch.compile is not None and x",
        "super().__init__()\n        return x",
        "return x if self.__class__.__name__ else x",
        "return getattr(self, 'scale', 1.0) * x",
        "return getattr(torch, 'relu')(x)",
        "return x if hasattr(self, self.__class__.__name__) else x",
        "input = x * 2\n        return input",
        "return torch.nn.functional.dropout(x, training=False)",
        # names that resolve to no module: a dtype, a class, a function, a constant
        "return x.to(torch.float32) * math.pi",
        "return x if isinstance(self, torch.nn.Module) else F.relu(x)",
        "return torch.stack([F.relu(x), F.gelu(x)]).sum(0)",
        "f = F.relu\n        return f(x)",
        "return x.to(getattr(torch, 'float16'))",
    ],
)
def test_ordinary_code_is_not_rejected(forward: str) -> None:
    decision = check_source(module(forward, "import math\nimport torch.nn.functional as F"))
    assert decision.keep, decision


def test_parameter_named_input_is_fine() -> None:
    source = GOOD.replace("def forward(self, x):", "def forward(self, input):").replace(
        "self.linear(x)) * 2.0 + x", "self.linear(input)) * 2.0 + input"
    )
    assert check_source(source).keep
