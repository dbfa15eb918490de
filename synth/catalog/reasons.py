"""Reason codes of the ``seeds`` stage: why an operator a library exposes is not a seed.

Stable strings, never renamed (ARCHITECTURE.md lists them). ``ok`` marks a runnable seed.
"""

from __future__ import annotations

OK = "ok"

REASONS: dict[str, str] = {
    OK: "ran on meta and on CPU; a runnable seed",
    "unsupported_sparse": "needs sparse tensors or layouts",
    "unsupported_complex": "takes complex tensors only",
    "unsupported_quantized": "needs quantized tensors or a quantization backend",
    "unsupported_distributed": "needs a process group",
    "needs_cuda": "a CUDA-only kernel (cudnn, miopen, cuda, mkldnn backends)",
    "not_an_operator": "not a tensor operator (a utility, a type, a module of functions)",
    "no_forward": "a container without a forward of its own",
    "no_signature": "no argument list could be derived from its signature or schema",
    "probe_failed": "no derived argument set ran on the meta device",
    "config_error": "no small config of its family could be built",
    "init_error": "constructing the module raised",
    "forward_error": "the CPU forward raised",
    "meta_mismatch": "the CPU output shape differs from the meta device's",
    "bad_output": "the output is not a tensor or a tuple/list of tensors",
    "nonfinite_output": "the CPU output holds NaN or inf on random inputs (or is memory left "
    "uninitialized, which reads as NaN: seeds.fill_uninitialized)",
    "source_unavailable": "its source could not be inlined into a self-contained task",
    "seed_timeout": "validating this seed exceeded seeds.seed_timeout_s",
    "library_error": "the library adapter raised while listing its seeds",
    "library_timeout": "the library did not finish within seeds.library_timeout_s",
    "library_crashed": "the library's extraction process died",
    "invalid_spec": "the library yielded something that is not a valid CatalogSpec",
    "duplicate_name": "another seed of the same library already has this name",
    "not_discovered": "(coverage only) no library exposes an operator of that name",
}


def check(reason: str) -> str:
    if reason not in REASONS:
        raise ValueError(f"unknown seed reason {reason!r}")
    return reason
