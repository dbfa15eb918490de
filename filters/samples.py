"""Small known tasks: one that passes every stage, and one per execution reason code.

They document what each reason means in code, drive the test-suite, and serve as a smoke
check of the filters on a new host (``python -m opsynth.filters.smoke --device cuda``).
All are small enough to run on a CPU in milliseconds, except where the point is otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

GOOD = """\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return torch.relu(self.linear(x)) * 2.0 + x


def get_inputs():
    return [torch.randn(128, 256)]


def get_init_inputs():
    return [256]
"""


def task_source(
    forward: str,
    *,
    init: str = "pass",
    inputs: str = "[torch.randn(64, 64)]",
    signature: str = "x",
    header: str = "",
) -> str:
    """A KernelBench-format module with the given ``__init__`` body, forward body and inputs."""
    return f"""\
import torch
import torch.nn as nn
import torch.nn.functional as F
{header}

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        {init}

    def forward(self, {signature}):
        {forward}


def get_inputs():
    return {inputs}


def get_init_inputs():
    return []
"""


def _compile_branch(compiled: str, eager: str) -> str:
    """A forward body that returns ``compiled`` under torch.compile and ``eager`` otherwise."""
    return (
        f"if torch.compiler.is_compiling():\n            return {compiled}\n        return {eager}"
    )


@dataclass(frozen=True)
class Sample:
    name: str
    code: str
    stage: str
    reason: str


SAMPLES: tuple[Sample, ...] = (
    Sample("good", GOOD, "verify", "ok"),
    Sample(
        "import_raises",
        task_source("return x", header='raise RuntimeError("broken module")'),
        "eager",
        "import_error",
    ),
    Sample(
        "init_raises",
        task_source("return x", init="self.linear = nn.Linear(-1, 4)"),
        "eager",
        "init_error",
    ),
    Sample("forward_raises", task_source("return x @ torch.randn(3, 5)"), "eager", "forward_error"),
    Sample("returns_float", task_source("return float(x.sum())"), "eager", "bad_output"),
    Sample("returns_empty", task_source("return x[:0]"), "eager", "bad_output"),
    Sample(
        "returns_257_tensors",
        task_source("return torch.unbind(x, dim=1)", inputs="[torch.randn(2, 257)]"),
        "eager",
        "too_many_outputs",
    ),
    Sample("returns_nan", task_source("return torch.log(x - 100.0)"), "eager", "nonfinite_output"),
    Sample("mutates_input", task_source("x.mul_(2.0)\n        return x"), "eager", "input_mutated"),
    Sample(
        "allocates_terabyte",
        task_source("return x + torch.empty(1 << 38, device=x.device).sum()"),
        "eager",
        "oom",
    ),
    Sample(
        "dropout_train",
        task_source("return self.drop(x) * 2.0", init="self.drop = nn.Dropout(0.5)"),
        "randomness",
        "random",
    ),
    Sample(
        "randn_in_forward", task_source("return x + torch.randn_like(x)"), "randomness", "random"
    ),
    Sample(
        "stateful_counter",
        task_source(
            "self.calls += 1\n        return x * self.calls",
            init='self.register_buffer("calls", torch.zeros(()))',
        ),
        "randomness",
        "nondeterministic",
    ),
    Sample("times_zero", task_source("return x * 0"), "degenerate", "constant_output"),
    Sample("ones_like", task_source("return torch.ones_like(x)"), "degenerate", "constant_output"),
    Sample(
        "softmax_row_sums",
        task_source("return torch.softmax(x, dim=-1).sum(dim=-1)"),
        "degenerate",
        "constant_output",
    ),
    Sample(
        "tiny_centered", task_source("return (x - x.mean()) * 1e-4"), "degenerate", "trivial_answer"
    ),
    Sample("near_constant", task_source("return x * 1e-3 + 5.0"), "degenerate", "trivial_answer"),
    Sample(
        "mean_of_many",
        task_source("return x.mean(dim=-1)", inputs="[torch.randn(16, 1 << 20)]"),
        "degenerate",
        "trivial_answer",
    ),
    Sample(
        "returns_weight",
        task_source(
            "return self.weight * 1.0", init="self.weight = nn.Parameter(torch.randn(64, 64))"
        ),
        "degenerate",
        "indistinguishable",
    ),
    Sample(
        # a one-element constant beside a real output: the outputs together move, it does not
        "constant_scalar_beside_output",
        task_source("return torch.tanh(x) * 2.0, x.new_full((1,), 3.5)"),
        "degenerate",
        "indistinguishable",
    ),
    Sample(
        "ignores_second_input",
        task_source(
            "return x * 2.0", signature="x, y", inputs="[torch.randn(64, 64), torch.randn(64, 64)]"
        ),
        "degenerate",
        "input_ignored",
    ),
    Sample(
        # an ignored input whose length is drawn anew each time: no other draw's tensor of
        # its shape to swap in, so input_ignored could not vary it
        "ignores_input_of_drawn_shape",
        task_source(
            "return x * 2.0",
            signature="x, y",
            inputs="[torch.randn(64, 64), torch.randn(int(torch.randint(1, 1 << 16, ())))]",
        ),
        "degenerate",
        "unstable_inputs",
    ),
    Sample(
        "compile_only_branch",
        task_source(_compile_branch("x * 2.0 + 1.0", "x * 2.0")),
        "compile",
        "compile_mismatch",
    ),
    Sample(
        "compile_only_shape_error",
        task_source(_compile_branch("x @ torch.ones(3, 5)", "x * 2.0")),
        "compile",
        "compile_error",
    ),
)

# Only meaningful on a GPU: on CPU every tensor is on the evaluation device.
GPU_SAMPLES: tuple[Sample, ...] = (
    Sample("output_on_cpu", task_source("return x.cpu() * 2.0"), "eager", "wrong_device"),
    Sample(
        "unregistered_cpu_tensor",
        task_source("return x + self.w.to(x.device)", init="self.w = torch.randn(64)"),
        "eager",
        "wrong_device",
    ),
    Sample(
        "device_side_assert",
        task_source("return x[torch.tensor([1 << 30], device=x.device)] * 2.0"),
        "eager",
        "cuda_error",
    ),
)

BY_NAME = {sample.name: sample for sample in SAMPLES + GPU_SAMPLES}
