"""Which GPU kernels a solution's forward launched that are PyTorch's own compute.

The Python-level guard (``evaluator.harness.Guard``) sees torch calls made from
``ModelNew.forward`` in Python; it cannot see ``at::``/``torch::`` calls made from the
solution's C++ extension, which launch the same ATen kernels. So the solution's process also
traces one forward with the profiler and reports the kernel names it saw (the ``kernels``
request); the judge classifies them here. Allowed: the solution's own kernels, cuBLAS, cuDNN,
CUTLASS and other library kernels, and ATen's data movement (copies for ``contiguous``, fills
for a zeroed buffer), which compute nothing. Everything ATen's namespaces or torch.compile's
generated Triton kernels name is compute that a kernel of the solution should be doing.

A kernel's *function* name decides, not its template arguments: a solution's own kernel
instantiated with ``c10::Half`` is still its own. Standard library only: this runs in the
worker.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# The qualified function name of a demangled kernel name: after the return type, before its
# template arguments or parameters.
ANONYMOUS = "(anonymous namespace)"
ATEN_NAMESPACES = ("at::", "at_cuda_detail::", "c10::", "torch::")
# ATen kernels that sit outside its namespaces (softmax's, in an anonymous namespace).
ATEN_UNQUALIFIED = re.compile(r"^(\{anon\}::)?(softmax_warp_|cunn_)")
# torch.compile's generated kernels (Inductor's Triton naming).
INDUCTOR = re.compile(r"^triton_(poi|red|per|tem)_")
# ATen kernels that only move or fill memory: what ``contiguous``/``copy_``/``zeros`` launch.
DATA_MOVEMENT = re.compile(r"copy_kernel|copy_device_to_device|CatArrayBatchedCopy|FillFunctor")
NAME_LIMIT, COUNT_LIMIT = 512, 256


def function_name(kernel: str) -> str:
    """``void at::native::foo<4, F>(int, F)`` -> ``at::native::foo``."""
    name = kernel.replace(ANONYMOUS, "{anon}").strip()
    name = re.split(r"[<(]", name, maxsplit=1)[0].strip()
    return name.split(" ")[-1]


def is_torch_compute(kernel: str) -> bool:
    function = function_name(kernel)
    aten = function.startswith(ATEN_NAMESPACES) or bool(ATEN_UNQUALIFIED.match(function))
    if aten:
        return not DATA_MOVEMENT.search(kernel)
    return bool(INDUCTOR.match(function))


def torch_compute(kernels: Iterable[str]) -> list[str]:
    """The kernels of ``kernels`` that are PyTorch's own compute, in order, once each."""
    return list(dict.fromkeys(k for k in kernels if is_torch_compute(k)))


def parse_kernels(reply: dict) -> list[str] | None:
    """The kernel names of a ``kernels`` reply: a list of at most ``COUNT_LIMIT`` strings of
    at most ``NAME_LIMIT`` characters; None when the reply is anything else."""
    raw = reply.get("kernels")
    if not isinstance(raw, list) or len(raw) > COUNT_LIMIT:
        return None
    if not all(isinstance(name, str) and len(name) <= NAME_LIMIT for name in raw):
        return None
    return list(raw)
