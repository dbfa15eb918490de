"""A sample's sums in one pass over the output, on a CUDA device.

A sample (``filters.serve.sample_tensor``) carries ``CHECKSUMS`` weighted sums
``sum(w_j * v)`` with fresh standard normal weights, and ``sum|v|`` and ``sum v^2``. Made of
torch operations, each sum reads the output again and the weights are written to memory and
read back: some twenty passes over a tensor the forward wrote once, so a sample cost several
times the memory-bound forward it checks. Here one Triton kernel reads each element once,
draws its four weights in registers (Philox, ``tl.randn4x``, keyed by the sample's seed) and
keeps all six sums, in float64 per block of elements; torch adds the blocks' partial sums.

The weights differ from the torch path's (another generator), so the samples a judge compares
all come from one path: every process of a job takes the same one (a filter job's
``filters.fused_sums`` names it, the evaluator's always takes this one), this one being
taken on a CUDA device where Triton imports, and the judge compares only samples made on the
same device. Its statistics are the same: independent standard normal
weights, products in float32, sums in float64.

Triton's compiled kernel is code a later process loads: it is built by the trusted compile
layer's warm-up (``filters.compile_cache.warm`` calls ``warm``), not by a candidate, and a
candidate's own build goes to its private cache (``filters.compile_cache``).

Standard library and torch at import; Triton on first use.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

WEIGHTED = 4  # tl.randn4x draws four normals per element from one Philox round
SUMS = WEIGHTED + 2  # then sum|v| and sum v^2
BLOCK = 2048  # elements per program: one partial sum of each kind per block
# Loaded as they are; other dtypes are converted to float32 first, as the torch path does.
LOADED = (torch.float32, torch.float16, torch.bfloat16)
# Keys of successive chunks: a seed's stream per chunk keeps Philox's counters within int32.
_MIX = 0x9E3779B97F4A7C15
_SEED_BIT = 1 << 62  # every key has the same integer width, so one compiled kernel serves all


def available(device: torch.device) -> bool:
    """Whether this process sums on ``device`` with the fused kernel."""
    return device.type == "cuda" and _kernel() is not None


def chunk_key(seed: int, chunk: int) -> int:
    """The Philox key of ``chunk`` of a sample drawn from ``seed``."""
    return ((seed * _MIX + chunk) % _SEED_BIT) | _SEED_BIT


def sums(part: torch.Tensor, seed: int, chunk: int) -> torch.Tensor:
    """``SUMS`` float64 sums of a 1-D CUDA tensor ``part`` (at most 2^31 elements): four
    weighted sums, then ``sum|v|`` and ``sum v^2``."""
    kernel = _kernel()
    if kernel is None:
        raise RuntimeError("the fused sums need Triton")
    if part.dtype not in LOADED:
        part = part.float()
    part = part.contiguous()
    n = part.numel()
    blocks = max(1, -(-n // BLOCK))
    partial = torch.empty((blocks, SUMS), dtype=torch.float64, device=part.device)
    kernel[(blocks,)](part, partial, n, chunk_key(seed, chunk), BLOCK=BLOCK, SUMS=SUMS)
    return partial.sum(0)


def warm(device: str) -> None:
    """Build the kernel for every dtype it loads (the trusted layer's warm-up)."""
    if device != "cuda" or _kernel() is None:
        return
    for dtype in LOADED:
        sums(torch.ones(BLOCK + 1, dtype=dtype, device=device), 1, 0)
    torch.cuda.synchronize()


@functools.cache
def _kernel() -> Any:
    """The compiled-on-demand kernel, or None where Triton does not import."""
    try:
        from opsynth.filters.fused_sums_kernel import fused_sums
    except ImportError:
        return None
    return fused_sums
