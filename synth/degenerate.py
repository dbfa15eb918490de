"""Refuse degenerate chains by measuring them on a small sample, before any code exists.

No formula can know what each of the catalogue's operators does to its values, so the chain
is run on CPU at a small batch, with the weights and input draws the task itself would use,
and the outputs are put through the same tests the filters' degenerate stage applies later
(``filters.checks.stage_degenerate``): not constant, not passed by zeros, the mean or an input
handed back, different for different inputs, moved by every input. Two more refusals need the
trace of each link: a link whose output equals its input is an identity on these values (relu
of a softmax, a transpose that undoes the previous one), and values beyond ``compose.max_rms``
or not finite make eager-vs-kernel comparisons meaningless. A constant operand
(``synth.constants``) must move the output: the chain run without it must differ.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from opsynth.config import ComposeConfig
from opsynth.synth.chain import (
    Chain,
    build_callables,
    draw_inputs,
    execute,
    held_names,
    tensors_in,
    without_link,
)

# Operators that are identities by definition; Ops-6K keeps them as tasks of their own (and
# dropout, composed at p=0: ``synth.solve.NO_DROP``).
IDENTITY_OPS = frozenset({"torch.clone", "torch.detach", "nn.Identity", "torch.Tensor.contiguous"})


def is_dropout(name: str) -> bool:
    """Dropout-family operators: stochastic, but an identity at p=0 (``synth.solve.NO_DROP``)."""
    return "dropout" in name.lower()


class Degenerate(Exception):
    """A chain or draw that cannot become a good task; ``reason`` is a stable code."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def _real(t: torch.Tensor) -> torch.Tensor:
    if t.is_complex():
        t = torch.view_as_real(t)
    return t if t.dtype == torch.float64 else t.float()


def rel_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """Largest difference relative to the larger magnitude, as the filters measure it."""
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        if x.shape != y.shape:
            return math.inf
        fx, fy = _real(x), _real(y)
        if fx.numel() == 0:
            continue
        scale = max(float(fx.abs().max()), float(fy.abs().max()))
        diff = float((fx - fy).abs().max())
        if diff > 0:
            worst = max(worst, diff / scale if scale > 0 else math.inf)
    return worst


def _check_outputs(outputs: list[torch.Tensor], cfg: ComposeConfig) -> None:
    if not outputs:
        raise Degenerate("bad_output", "no tensor in the output")
    tol = cfg.trivial_tolerance
    for k, t in enumerate(outputs):
        if t.numel() == 0:
            raise Degenerate("shape", f"output {k} is empty")
        f = _real(t)
        if not torch.isfinite(f).all():
            raise Degenerate("nonfinite", f"output {k} has NaN or inf on random inputs")
        rms = float(f.square().mean().sqrt())
        if rms > cfg.max_rms:
            raise Degenerate("magnitude", f"output {k} has rms {rms:.3g}")
        lo, hi = (float(v) for v in torch.aminmax(f))
        scale = max(abs(lo), abs(hi))
        if t.numel() > 1 and hi - lo <= cfg.distinct_rtol * scale:
            raise Degenerate("constant", f"output {k} is constant across its elements")
        # allclose(zeros, f): |f| <= atol + rtol * |f| everywhere
        if scale * (1 - tol) <= tol:
            raise Degenerate("trivial", f"output {k} passes as all zeros")
        if t.numel() > 1 and bool(((f - f.mean()).abs() <= tol + tol * f.abs()).all()):
            raise Degenerate("trivial", f"output {k} passes as its mean")


def _check_input_answer(
    outputs: list[torch.Tensor], draw: dict[str, Any], cfg: ComposeConfig
) -> None:
    """Refuse an output that an input tensor of its shape and dtype matches within
    ``trivial_tolerance``: the task hands its input back (``filters.input_as_answer``)."""
    tol = cfg.trivial_tolerance
    for k, out in enumerate(outputs):
        for name, value in draw.items():
            for x in tensors_in(value):  # a tensor-list argument's tensors too
                if (x.shape, x.dtype) != (out.shape, out.dtype):
                    continue
                if torch.allclose(_real(out), _real(x), atol=tol, rtol=tol, equal_nan=True):
                    raise Degenerate("trivial", f"output {k} is input {name} handed back")


def _check_links(chain: Chain, trace: list[tuple[Any, Any]]) -> None:
    for link, (before, after) in zip(chain.links, trace, strict=True):
        if not isinstance(before, torch.Tensor) or not isinstance(after, torch.Tensor):
            continue
        if link.name in IDENTITY_OPS or is_dropout(link.name):
            continue
        if before.shape != after.shape or before.dtype != after.dtype:
            continue
        fb, fa = _real(before), _real(after)
        scale = float(fb.abs().max()) if fb.numel() else 0.0
        if float((fa - fb).abs().max()) <= 1e-4 * max(scale, 1e-2):
            raise Degenerate("noop", f"{link.name} is an identity on its input here")


def _check_constants(
    chain: Chain,
    callables: list[Any],
    draw: dict[str, Any],
    outputs: list[torch.Tensor],
    cfg: ComposeConfig,
) -> None:
    """Refuse a constant operand the output does not depend on: a later link that undoes it
    (a normalization after a scale) leaves the constant built for nothing."""
    for i, link in enumerate(chain.links):
        if not link.combine:
            continue
        kept = [j for j in range(len(chain.links)) if j != i]
        without = without_link(chain, i)
        rest = tensors_in(execute(without, [callables[j] for j in kept], draw))
        if rel_diff(outputs, rest) <= cfg.distinct_rtol:
            raise Degenerate("constant_ignored", f"{link.name} does not move the output")


def check_sample(chain: Chain, cfg: ComposeConfig) -> None:
    """Raise Degenerate when the chain (at its own, small batch) is degenerate."""
    torch.manual_seed(cfg.seed)
    try:
        with torch.no_grad():
            callables = build_callables(chain.links, "cpu")
            draws = [
                draw_inputs(chain, "cpu", torch.Generator().manual_seed(cfg.seed * 7919 + i))
                for i in range(2)
            ]
            trace: list[tuple[Any, Any]] = []
            first = tensors_in(execute(chain, callables, draws[0], trace))
            _check_outputs(first, cfg)
            if cfg.refuse_input_answer:
                _check_input_answer(first, draws[0], cfg)
            _check_links(chain, trace)
            _check_constants(chain, callables, draws[0], first, cfg)
            fixed = held_names(chain)
            draws[1].update({name: draws[0][name] for name in fixed})
            second = tensors_in(execute(chain, callables, draws[1]))
            if rel_diff(first, second) <= cfg.distinct_rtol:
                raise Degenerate("indistinguishable", "two input draws give the same output")
            if cfg.every_output_distinct and len(first) > 1:
                for k, (x, y) in enumerate(zip(first, second, strict=True)):
                    if rel_diff([x], [y]) <= cfg.distinct_rtol:
                        raise Degenerate("indistinguishable", f"output {k} is the same for both")
            varied = [name for name in draws[0] if name not in fixed]
            for name in varied:
                if len(varied) == 1:
                    break
                mixed = {**draws[0], name: draws[1][name]}
                moved = rel_diff(first, tensors_in(execute(chain, callables, mixed)))
                if moved <= cfg.distinct_rtol:
                    raise Degenerate("input_ignored", f"input {name} does not move the output")
    except Degenerate:
        raise
    except Exception as exc:  # an operator refusing these values (an index out of range)
        raise Degenerate("sample_error", f"{type(exc).__name__}: {str(exc)[:200]}") from exc
