"""A two-number CPU cost model read off the chain itself, so batch sizes are fitted without
timing anything (timings would make composing depend on the machine's load).

Eager torch on a small CPU is dominated by streaming elements through memory (every aten op
writes its output) and by multiply-adds in matmuls and convolutions. Running a link on the
``meta`` device under a dispatch mode (``counting``) lists every aten op it really calls, with
shapes, whatever operator the catalogue supplied: the elements each op reads and writes and
the multiply-adds of the dense ones are summed and priced with ``compose.cpu_ms_per_melem``
and ``compose.cpu_ms_per_gmac``. The solver counts each link as it propagates shapes, so a
chain's cost is the sum of its links' without running it again. Both grow in proportion to
the batch, which makes fitting the batch a division.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

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


_MEASURING: list[_Counter] = []


@contextlib.contextmanager
def counting():
    """A counter of the aten ops (on meta tensors) run inside."""
    counter = _Counter()
    _MEASURING.append(counter)
    try:
        with counter, torch.no_grad():
            yield counter
    finally:
        _MEASURING.pop()


def cost_of(counter: _Counter) -> Cost:
    return Cost(counter.elems / 1e6, counter.macs / 1e9, counter.largest / 1e6)


def measure(run) -> Cost:
    """Cost of ``run()`` (a call on meta tensors)."""
    with counting() as counter:
        run()
    return cost_of(counter)


def total(costs: Iterable[Cost]) -> Cost:
    """The cost of running one after another what each of ``costs`` measured."""
    costs = list(costs)
    return Cost(
        sum(c.melems for c in costs),
        sum(c.gmacs for c in costs),
        max((c.largest_melems for c in costs), default=0.0),
    )


@contextlib.contextmanager
def uncounted():
    """What runs inside is left out of the active count (inputs made for a stand-in run)."""
    counter = _MEASURING[-1] if _MEASURING else None
    saved = (counter.elems, counter.macs, counter.largest) if counter else None
    try:
        yield
    finally:
        if counter is not None and saved is not None:
            counter.elems, counter.macs, counter.largest = saved


def counted_as_length(run: Callable[[int], Any], steps: int, widen: Callable[[Any], Any]) -> Any:
    """``widen(run(3))`` as the output of ``run(steps)``, counted as ``run(steps)``: a
    recurrence's cost is a fixed part (its initial state) plus one step's times the length, so
    ``run(2)`` and ``run(3)`` give both parts (a single step can take shortcuts that break the
    line). ``synth.chain`` runs recurrent modules on meta this way. ``widen`` makes the long
    output from the short one; only its size is counted."""
    counter = _MEASURING[-1] if _MEASURING else None
    if counter is None:
        return widen(run(3))
    elems, macs = counter.elems, counter.macs
    run(2)
    two_elems, two_macs = counter.elems - elems, counter.macs - macs
    short = run(3)
    step_elems = counter.elems - elems - 2 * two_elems
    step_macs = counter.macs - macs - 2 * two_macs
    out = widen(short)
    counter.elems = elems + two_elems + (steps - 2) * step_elems
    counter.macs = macs + two_macs + (steps - 2) * step_macs
    return out


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
