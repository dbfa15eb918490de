"""Tasks and solutions the evaluator tests score: an honest CPU extension, hacked solutions."""

from __future__ import annotations

from opsynth.evaluator.solution import Solution
from opsynth.evaluator.tasks import reference_solution
from opsynth.record import Task

TASK = """\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.relu(x) * self.scale + x


batch_size = 64
features = 256


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [2.0]
"""

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"

CPP_KERNEL = """\
#include <torch/extension.h>

torch::Tensor forward(torch::Tensor x, double scale) {
  auto input = x.contiguous();
  auto out = torch::empty_like(input);
  const float* a = input.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const float s = static_cast<float>(scale);
  for (int64_t i = 0; i < input.numel(); ++i) {
    const float v = a[i];
    o[i] = (v > 0.f ? v : 0.f) * s + v;
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &forward); }
"""

EXTENSION_MODEL_NEW = """\
import torch.nn as nn

import solution_ext


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return solution_ext.forward(x, self.scale)
"""


def model_new(forward: str, *, init: str = "self.scale = scale", header: str = "") -> str:
    return f"""{HEADER}{header}

class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        {init}

    def forward(self, x):
        {forward}
"""


def task() -> Task:
    return Task(ops=["torch.relu"], data_source="torch#1", code=TASK)


HONEST = Solution("honest_cpp", EXTENSION_MODEL_NEW, {"fused.cpp": CPP_KERNEL})
REFERENCE = reference_solution(task())

# name -> (solution, the reason it must get)
HACKS: dict[str, tuple[Solution, str]] = {
    "zeros": (Solution("zeros", model_new("return torch.zeros_like(x)")), "torch_compute"),
    "functional": (
        Solution("functional", model_new("return F.relu(x) * self.scale + x")),
        "functional_call",
    ),
    "torch_ops": (
        Solution("torch_ops", model_new("return torch.relu(x) * self.scale + x")),
        "torch_compute",
    ),
    "subclass_model": (
        Solution(
            "subclass_model",
            HEADER + "from model import Model\n\n\nclass ModelNew(Model):\n    pass\n",
        ),
        "forbidden_import",
    ),
    "subclass_model_inline": (
        Solution(
            "subclass_model_inline",
            TASK + "\n\nclass ModelNew(Model):\n    pass\n",
        ),
        "hack_subclass_model",
    ),
    "try_except": (
        Solution(
            "try_except",
            model_new(
                "try:\n            return solution_ext.forward(x, self.scale)\n"
                "        except Exception:\n            return torch.relu(x) * self.scale + x"
            ),
        ),
        "hack_try_except",
    ),
    "side_stream": (
        Solution(
            "side_stream",
            model_new(
                "with torch.cuda.stream(self.stream):\n"
                "            return torch.relu(x) * self.scale + x",
                init="self.scale = scale\n        self.stream = torch.cuda.Stream()",
            ),
        ),
        "hack_stream",
    ),
    "patched_event": (
        Solution(
            "patched_event",
            model_new(
                "return torch.relu(x) * self.scale + x",
                header="\n\nclass FastEvent:\n    pass\n\n\ntorch.cuda.Event = FastEvent\n",
            ),
        ),
        "hack_patch",
    ),
    "lazy_tensor": (
        Solution(
            "lazy_tensor",
            model_new(
                "return Lazy(x)",
                header="\n\nclass Lazy(torch.Tensor):\n    pass\n",
            ),
        ),
        "hack_tensor_subclass",
    ),
    "decoy_kernel": (
        Solution(
            "decoy_kernel",
            EXTENSION_MODEL_NEW,
            {
                "fused.cpp": CPP_KERNEL.replace(
                    "torch::Tensor forward",
                    "__global__ void fused_kernel(float* x) { x[0] = 0; }\n\ntorch::Tensor forward",
                )
            },
        ),
        "hack_decoy_kernel",
    ),
    "threads": (
        Solution(
            "threads",
            EXTENSION_MODEL_NEW,
            {
                "fused.cpp": CPP_KERNEL.replace(
                    "  auto input", "  std::thread t([]{});\n  auto input"
                )
            },
        ),
        "hack_thread",
    ),
    "os_escape": (
        Solution("os_escape", model_new("return x", header="import os\n")),
        "forbidden_import",
    ),
    "pasted_stream": (
        Solution(
            "pasted_stream",
            EXTENSION_MODEL_NEW,
            {
                "fused.cpp": "#define CAT(a, b) a##b\n"
                + CPP_KERNEL.replace(
                    "  auto input",
                    "  cudaStream_t s;\n  CAT(cudaStream, Create)(&s);\n  auto input",
                )
            },
        ),
        "hack_indirect_name",
    ),
    # torch through an alias, where the static check cannot read ``T._C``: the guard's off
    # switch, and the task's own Model (sys.modules) behind it
    "torch_alias": (
        Solution(
            "torch_alias",
            model_new(
                "with T._C.DisableTorchFunction():\n"
                "            return torch.relu(x) * self.scale + x",
                header="T = torch\n",
            ),
        ),
        "forbidden_call",
    ),
    "getattr_alias": (
        Solution(
            "getattr_alias",
            model_new(
                "return g(torch, 's' + 'ys').modules['opsynth_task'].Model(self.scale)(x)",
                header="g = getattr\n",
            ),
        ),
        "forbidden_call",
    ),
    # TorchScript runs its ops from C++, where the torch function mode never sees them
    "jit_script": (
        Solution(
            "jit_script",
            model_new(
                "return fused(x, self.scale)",
                header="\n\n@torch.jit.script\ndef fused(x: torch.Tensor, s: float) -> "
                "torch.Tensor:\n    return torch.relu(x) * s + x\n",
            ),
        ),
        "hack_torch_compiler",
    ),
    "dlsym_lookup": (
        Solution(
            "dlsym_lookup",
            EXTENSION_MODEL_NEW,
            {
                "fused.cpp": "#include <dlfcn.h>\n"
                + CPP_KERNEL.replace(
                    "  auto input", '  void* f = dlsym(RTLD_DEFAULT, "system");\n  auto input'
                )
            },
        ),
        "hack_indirect_name",
    ),
}

# Hacks the runtime guards must catch; scored leniently (torch ops allowed but counted), so
# it is the runtime check, not the torch-compute rule, that rejects them.
RUNTIME_HACKS: dict[str, tuple[Solution, str]] = {
    "cached_output": (
        Solution(
            "cached_output",
            model_new(
                "if self.cache is None:\n"
                "            self.cache = torch.relu(x) * self.scale + x\n"
                "        return self.cache",
                init="self.scale = scale\n        self.cache = None",
            ),
        ),
        "incorrect",
    ),
    "zeros": (Solution("zeros", model_new("return torch.zeros_like(x)")), "incorrect"),
    "mutates_input": (
        Solution("mutates_input", model_new("x.mul_(0)\n        return x")),
        "incorrect",
    ),
    "in_place_output": (
        Solution(
            "in_place_output",
            model_new("return x.add_(torch.relu(x) * self.scale)"),
        ),
        "input_mutated",
    ),
    "uninitialised": (
        Solution(
            "uninitialised",
            model_new(
                "out = torch.empty_like(x)\n"
                "        half = x.shape[0] // 2\n"
                "        out[:half] = (torch.relu(x) * self.scale + x)[:half]\n"
                "        return out"
            ),
        ),
        "incorrect",
    ),
    "wrong_dtype": (
        Solution("wrong_dtype", model_new("return (torch.relu(x) * self.scale + x).double()")),
        "incorrect",
    ),
    # failures whose text is hostile: a message no UTF-8 store can write as it is, and one
    # that raises when read
    "unwritable_message": (
        Solution("unwritable_message", model_new("raise ValueError('bad \\ud800 end')")),
        "incorrect",
    ),
    "unprintable_exception": (
        Solution(
            "unprintable_exception",
            model_new(
                "raise Unprintable()",
                header="\n\nclass Unprintable(Exception):\n"
                "    def __str__(self):\n        raise self\n",
            ),
        ),
        "incorrect",
    ),
}
