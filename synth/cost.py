"""A two-number CPU cost model, so batch sizes can be fitted without running anything.

Eager torch on a small CPU is dominated by two things: streaming elements through memory
(elementwise ops, norms, reductions, including allocation of the output) and multiply-adds in
Linear/Conv2d. Each step costs ``work * elements * ms_per_melem + mac_work * macs *
ms_per_gmac``, with per-operator weights measured on an idle 2-core CPU (see the seed specs); every
step's cost is proportional to the batch size, which is what makes fitting the batch exact.
"""

from __future__ import annotations

import math

from opsynth.config import ComposeConfig
from synth.spec import Choice, SeedSpec, Shape


def step_ms(
    spec: SeedSpec, choice: Choice, shape_in: Shape, shape_out: Shape, cfg: ComposeConfig
) -> float:
    elements = max(math.prod(shape_in), math.prod(shape_out))
    macs = spec.macs(choice, shape_in, shape_out)
    return (
        spec.work * elements / 1e6 * cfg.cpu_ms_per_melem
        + spec.mac_work * macs / 1e9 * cfg.cpu_ms_per_gmac
    )


def fit_batch(
    ms_at_batch: float, peaks_at_batch: tuple[int, int], batch: int, cfg: ComposeConfig
) -> int:
    """The power-of-two batch whose estimated forward is closest to the target (in log space),
    within ``cfg.batch_range`` and keeping the input and the largest tensor created in forward
    (``peaks_at_batch``) under their caps; powers of two match how hand-written tasks are
    sized. Every quantity here is proportional to the batch."""
    lo, hi = cfg.batch_range
    per_item = ms_at_batch / batch
    ideal = cfg.target_forward_ms / per_item if per_item > 0 else hi
    largest_input, largest_created = peaks_at_batch
    cap = min(
        hi,
        cfg.max_input_melems * 1e6 * batch / largest_input,
        cfg.max_tensor_melems * 1e6 * batch / largest_created,
    )
    fitted = 2 ** round(math.log2(max(ideal, 1.0)))
    if fitted > cap:
        fitted = 2 ** math.floor(math.log2(cap)) if cap >= 1 else 0
    return int(max(fitted, lo))
