"""Comparisons of a candidate's output tensors, by the checks in its own process.

The checks call these through the module (``compare.all_close``), never by imported name: a
candidate that patches them in its process (the hostile suite's ``*_behind_patched_checks``)
fools every check that uses them, and the judge's ``verify``, which compares outside the
process, is what catches it.

Standard library and torch only: this runs in the sandboxed candidate process.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def real_view(t: torch.Tensor) -> torch.Tensor:
    """A real floating view for statistics: complex as (re, im), integers and halves as fp32."""
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype not in (torch.float32, torch.float64):
        t = t.float()
    return t


def same_value(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
    return a is b


def all_close(a: list[torch.Tensor], b: list[torch.Tensor], *, atol: float, rtol: float) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x.shape != y.shape:
            return False
        if not torch.allclose(real_view(x), real_view(y), atol=atol, rtol=rtol, equal_nan=True):
            return False
    return True


def max_abs_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b, strict=True)):
        return math.inf
    pairs = zip(a, b, strict=True)
    return max((float((real_view(x) - real_view(y)).abs().max()) for x, y in pairs), default=0.0)


def rel_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """Largest difference relative to the larger magnitude, over all output tensors; a shape
    change counts as infinitely different."""
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b, strict=True)):
        return math.inf
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        fx, fy = real_view(x), real_view(y)
        scale = max(float(fx.abs().max()), float(fy.abs().max()))
        diff = float((fx - fy).abs().max())
        if diff > 0:
            worst = max(worst, diff / scale if scale > 0 else math.inf)
    return worst


def least_moved(a: list[torch.Tensor], b: list[torch.Tensor]) -> tuple[int, float]:
    """(output, change) of the output whose ``rel_diff`` between ``a`` and ``b`` is smallest;
    a structure change counts as infinitely different."""
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b, strict=True)):
        return 0, math.inf
    changes = [rel_diff([x], [y]) for x, y in zip(a, b, strict=True)]
    index = min(range(len(changes)), key=changes.__getitem__, default=0)
    return index, changes[index] if changes else math.inf


def input_answer(
    outputs: list[torch.Tensor], inputs: list[Any], *, atol: float, rtol: float
) -> tuple[int, int] | None:
    """(output, input) of the first output that passes allclose against an input tensor of
    its shape and dtype (the input handed back, or a copy), else None. Self-contained: a
    candidate that patches ``all_close`` to pass its other checks is not taken for one."""
    for k, out in enumerate(outputs):
        for i, x in enumerate(t for t in inputs if isinstance(t, torch.Tensor)):
            if x.shape != out.shape or x.dtype != out.dtype:
                continue
            a, b = _as_real(out), _as_real(x)
            if torch.allclose(a, b, atol=atol, rtol=rtol, equal_nan=True):
                return k, i
    return None


def _as_real(t: torch.Tensor) -> torch.Tensor:
    """``real_view``'s conversion, kept apart from it (see ``input_answer``)."""
    t = torch.view_as_real(t) if t.is_complex() else t
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def trivial_answer(t: torch.Tensor, *, atol: float, rtol: float) -> str:
    """Name the trivial answer (zeros, the mean) that passes allclose against ``t``, or ""."""
    f = real_view(t)
    if torch.allclose(torch.zeros_like(f), f, atol=atol, rtol=rtol):
        return "all zeros"
    if f.numel() > 1:
        mean = f.mean()
        if torch.allclose(torch.full_like(f, float(mean)), f, atol=atol, rtol=rtol):
            return f"the constant {float(mean):.4g} (the output's mean)"
    return ""
