"""Loading a candidate's module and drawing its inputs, under fixed seeds. The filters' checks
and the evaluator's harness both use these.

Standard library and torch only: this runs in the sandboxed candidate process.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from typing import Any

import torch

from opsynth.filters.failures import classify

CANDIDATE_MODULE = "candidate"


def load_module(path: str, name: str = CANDIDATE_MODULE) -> Any:
    """Import the candidate from its file so tracebacks, inspect and dynamo see real source."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def draw_inputs(get_inputs: Any, device: torch.device, seed: int) -> Any:
    """``get_inputs()`` with ``device`` as the default device: tasks sized for a GPU take
    inputs of up to a few GB, which the CPU's generator needs ~10 s per draw to fill, and the
    GPU's fills in milliseconds. The values differ from a CPU draw of the same seed but not in
    distribution, and nothing compares draws across devices. A ``get_inputs()`` that cannot run
    that way (a CPU generator object, say) is drawn again on the CPU, as written. A draw that
    runs out of device memory is not drawn again: its CPU draw would hold other values, and a
    verdict on values (``indistinguishable``, say) would then depend on how full the shared
    device was at that moment; the ``oom`` it raises is retried alone (``retry_alone``)."""
    if device.type != "cuda":
        return get_inputs()
    try:
        with torch.device(device):
            return get_inputs()
    except Exception as exc:
        if classify(exc, "") == "oom":
            raise
        seed_all(seed)
        return get_inputs()


def input_tensors(inputs: Any, nested: bool) -> list[torch.Tensor]:
    """The input tensors the checks vary, compare and sample: the top-level ones, or with
    ``nested`` also those inside list and tuple inputs (``[x, [y, z]]``), depth first, so a
    tensor handed over in a list is not out of the checks' sight."""
    found: list[torch.Tensor] = []
    for value in inputs:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif nested and isinstance(value, list | tuple):
            found.extend(input_tensors(value, nested))
    return found


def with_input_tensor(inputs: Any, k: int, tensor: torch.Tensor, nested: bool) -> Any:
    """``inputs`` with the ``k``-th of ``input_tensors(inputs, nested)`` replaced by
    ``tensor``, containers rebuilt as they were; IndexError when there is no such tensor."""
    left = [k]

    def rebuilt(values: Any) -> Any:
        out = []
        for value in values:
            if isinstance(value, torch.Tensor):
                out.append(tensor if left[0] == 0 else value)
                left[0] -= 1
            elif nested and isinstance(value, list | tuple):
                out.append(type(value)(rebuilt(value)))
            else:
                out.append(value)
        return out

    replaced = rebuilt(inputs)
    if left[0] >= 0:
        raise IndexError(f"no input tensor {k}")
    return replaced


def seed_all(seed: int, host_only: bool = False) -> None:
    random.seed(seed)
    if host_only:
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)


def to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, list | tuple):
        return type(value)(to_device(v, device) for v in value)
    return value
