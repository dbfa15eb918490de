"""Every reason code a filter can give, with a one-line explanation each, and the runner's
own (``INFRA``), which any sandboxed harness may give (``filters.harness``).

Codes are stable strings: they are counted as ``dropped_<reason>``, stored in verdict rows and
listed in ARCHITECTURE.md, so a code is never renamed, only added. This module is imported by
the sandboxed worker, so it must stay standard-library only.
"""

from __future__ import annotations

OK = "ok"

STATIC: dict[str, str] = {
    "syntax_error": "the source does not parse as Python",
    "missing_symbol": "Model, get_inputs or get_init_inputs is not defined at module level",
    "forbidden_import": "imports a module outside the allow-list (os, sys, subprocess, ...)",
    "forbidden_call": "uses a forbidden builtin or attribute (open, eval, __subclasses__, ...)",
}

EAGER: dict[str, str] = {
    "import_error": "executing the module source raised",
    "init_error": "get_init_inputs(), Model(...) or get_inputs() raised",
    "forward_error": "the forward pass raised",
    "bad_output": "forward returned something other than non-empty tensors (or tuples of them)",
    "too_many_outputs": "forward returned more tensors than the judge samples (MAX_OUTPUTS)",
    "nonfinite_output": "an output contains NaN or Inf",
    "wrong_device": "an output or a module tensor is not on the evaluation device",
    "input_mutated": "forward modified its input tensors in place",
    "oom": "the candidate ran out of (device) memory",
}

RANDOMNESS: dict[str, str] = {
    "random": "same inputs and weights under two RNG states give different outputs",
    "nondeterministic": "repeated runs with the same RNG state give different outputs",
}

DEGENERATE: dict[str, str] = {
    "constant_output": "an output is constant across its elements (up to float noise)",
    "trivial_answer": "zeros, the output's mean or an input tensor passes the evaluator's allclose",
    "indistinguishable": "independent input draws give outputs within distinct_rtol",
    "input_ignored": "changing one input tensor does not change the output",
    "unstable_inputs": "input draws differ in their tensors' count, shapes or dtypes",
}

RUNTIME: dict[str, str] = {
    "too_fast": "eager median (scaled by device_speed_factor) is below the runtime window",
    "too_slow": "eager median (scaled by device_speed_factor) is above the runtime window",
}

COMPILE: dict[str, str] = {
    "compile_error": "torch.compile (default mode) failed",
    "compile_mismatch": "torch.compile output differs from eager beyond compile_atol/rtol",
}

INFRA: dict[str, str] = {
    "timeout": "the candidate exceeded its wall-clock or CPU-time limit and was killed",
    "crashed": "the candidate process died from a signal (segfault, abort, ...)",
    "exited": "the candidate ended its process (sys.exit, os._exit) before reporting",
    "worker_lost": "the worker process died or stopped answering while evaluating the candidate",
    "cuda_error": "a CUDA error (illegal address, device assert, ...) poisoned the context",
    "resource_limit": "the candidate exceeded its memory, process or file-size limit",
    "output_flood": "the candidate wrote more than output_limit_kb to stdout/stderr",
    "filter_error": "a filter itself raised (a bug in the filter, not in the candidate)",
    "harness_failed": "the check harness raised inside the candidate's process after the "
    "candidate's code could run there (a harness bug, or the candidate's doing: the detail "
    "holds the traceback its process reported)",
    "protocol_violation": "the candidate's process reported a malformed or unexpected message",
}

ALL: dict[str, str] = {
    OK: "the stage passed",
    **STATIC,
    **EAGER,
    **RANDOMNESS,
    **DEGENERATE,
    **RUNTIME,
    **COMPILE,
    **INFRA,
}

# Execution stages, cheapest first; the sandboxed checks run them in this order.
STAGES: tuple[str, ...] = ("eager", "randomness", "degenerate", "runtime", "compile")
# The worker's own re-check of the decisive facts, outside the candidate's process, after the
# candidate's stages passed (``filters.verify``); its rows carry the codes above.
VERIFY = "verify"
