"""The Triton kernel of ``filters.fused_sums``, in a module of its own so that Triton is imported
only where a sample is summed on a CUDA device. Triton's JIT reads the kernel's names from this
module's globals."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["n", "key"])
def fused_sums(x_ptr, partial_ptr, n, key, BLOCK: tl.constexpr, SUMS: tl.constexpr):  # noqa: N803
    """Block ``program_id``'s partial sums of ``x`` (``n`` elements): ``w_j * v`` for the four
    normals ``tl.randn4x`` draws per element from Philox keyed by ``key``, then ``|v|`` and
    ``v^2``; products in float32, sums in float64, written to row ``program_id`` of
    ``partial`` (``SUMS`` float64 each)."""
    block = tl.program_id(0)
    offsets = block * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offsets, mask=offsets < n, other=0.0).to(tl.float32)
    w0, w1, w2, w3 = tl.randn4x(key, offsets)
    out = partial_ptr + block * SUMS
    tl.store(out + 0, tl.sum((w0 * v).to(tl.float64), axis=0))
    tl.store(out + 1, tl.sum((w1 * v).to(tl.float64), axis=0))
    tl.store(out + 2, tl.sum((w2 * v).to(tl.float64), axis=0))
    tl.store(out + 3, tl.sum((w3 * v).to(tl.float64), axis=0))
    tl.store(out + 4, tl.sum(tl.abs(v).to(tl.float64), axis=0))
    tl.store(out + 5, tl.sum((v * v).to(tl.float64), axis=0))
