"""A two-number CPU cost model read off the chain itself, so batch sizes are fitted without
timing anything (timings would make composing depend on the machine's load).

Eager torch on a small CPU is dominated by streaming elements through memory (every aten op
writes its output) and by multiply-adds in matmuls and convolutions. Running the chain once on
the ``meta`` device under a dispatch mode lists every aten op it really calls, with shapes,
whatever operator the catalogue supplied: the elements each op reads and writes and the
multiply-adds of
the dense ones are summed and priced with ``compose.cpu_ms_per_melem`` and
``compose.cpu_ms_per_gmac``. Both grow in proportion to the batch, which makes fitting the
batch a division.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from opsynth.config import ComposeConfig

_aten = torch.ops.aten


@dataclass(frozen=True)
class Cost:
    """What one forward does at the batch it was measured at."""

    melems: float  # millions of elements read and written by all ops
    gmacs: float  # billions of multiply-adds
    largest_melems: float  # the largest tensor an op creates, millions of elements

    def ms(self, cfg: ComposeConfig) -> float:
        return self.melems * cfg.cpu_ms_per_melem + self.gmacs * cfg.cpu_ms_per_gmac


def _numel(t: object) -> int:
    return t.numel() if isinstance(t, torch.Tensor) else 0


def _macs(func, args, out) -> int:
    packet = func._overloadpacket
    if packet in (_aten.mm, _aten.bmm, _aten.addmm, _aten.baddbmm):
        a = args[1] if packet in (_aten.addmm, _aten.baddbmm) else args[0]
        return _numel(out) * int(a.shape[-1])
    if packet in (_aten.convolution, _aten.convolution_overrideable, _aten._convolution):
        weight, transposed = args[1], bool(args[6])
        if transposed:
            return _numel(args[0]) * int(weight.shape[1]) * math.prod(weight.shape[2:])
        return _numel(out) * math.prod(weight.shape[1:])
    if packet in (_aten._scaled_dot_product_flash_attention_for_cpu,):
        q, k = args[0], args[1]
        return 2 * _numel(q) * int(k.shape[-2])
    return 0


class _Counter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.elems = 0
        self.macs = 0
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        written = sum(_numel(t) for t in (out if isinstance(out, tuple | list) else (out,)))
        read = sum(_numel(t) for t in args if isinstance(t, torch.Tensor))
        self.elems += written + read
        self.largest = max(self.largest, written)
        with contextlib.suppress(IndexError, TypeError, AttributeError):
            self.macs += _macs(func, args, out)
        return out


def measure(run) -> Cost:
    """Cost of ``run()`` (a call on meta tensors)."""
    counter = _Counter()
    with counter, torch.no_grad():
        run()
    return Cost(counter.elems / 1e6, counter.macs / 1e9, counter.largest / 1e6)


def fit_batch(cost: Cost, largest_input_melems: float, batch: int, cfg: ComposeConfig) -> int:
    """The power-of-two batch whose estimated forward is closest to the target (in log space),
    within ``cfg.batch_range`` and keeping the input and the largest tensor created in forward
    under their caps. Every quantity here is proportional to the batch."""
    lo, hi = cfg.batch_range
    per_item = cost.ms(cfg) / batch
    ideal = cfg.target_forward_ms / per_item if per_item > 0 else hi
    cap = float(hi)
    if largest_input_melems > 0:
        cap = min(cap, cfg.max_input_melems * batch / largest_input_melems)
    if cost.largest_melems > 0:
        cap = min(cap, cfg.max_tensor_melems * batch / cost.largest_melems)
    fitted = 2 ** round(math.log2(max(ideal, 1.0)))
    if fitted > cap:
        fitted = 2 ** math.floor(math.log2(cap)) if cap >= 1 else 0
    return int(max(fitted, lo))
