"""The evaluator's reason codes and stages, registered as the sandboxed runner's ``evaluator``
harness (``filters.harness``): its rows may carry these codes and the runner's own.

Codes are stable strings, listed in ARCHITECTURE.md: a code is never renamed, only added.
"""

from __future__ import annotations

from opsynth.filters import reasons
from opsynth.filters.harness import Harness, register

EVALUATION: dict[str, str] = {
    "build_error": "the solution's CUDA/C++ sources did not build as a torch extension",
    "solution_import_error": "executing model_new.py raised, or it defines no ModelNew",
    "state_dict_mismatch": "ModelNew cannot load Model's state_dict",
    "incorrect": "ModelNew's outputs differ from Model's beyond atol/rtol, or in structure",
    "functional_call": "ModelNew called a torch.nn.functional function (blocked)",
    "torch_compute": "ModelNew.forward ran torch compute ops from Python (a fallback)",
    "aten_compute": "ModelNew's forward launched PyTorch's own (ATen) compute kernels, e.g. "
    "through at:: calls in its extension (the profiler's trace of one forward)",
    "not_a_tensor": "ModelNew returned a tensor subclass or a non-tensor",
    "unstable_output": "two runs on the same inputs differ (uninitialised memory?)",
    "replayed_output": "a timed call's output does not match the reference on its inputs",
    "unfinished_forward": "a timed forward replied before its output was whole (its proof, a "
    "weighted sum of every element, is off): work deferred past the timed request",
}

# The stages of one (task, solution) evaluation, in order.
EVAL_STAGES: tuple[str, ...] = ("build", "correctness", "timing")

# Codes the evaluator shares with the filters' checks: a solution that writes its inputs, runs
# out of device memory, or returns nothing or more tensors than a sample holds
# (``filters.serve``'s refusals) is refused for the same reason a task would be.
SHARED = ("input_mutated", "oom", "bad_output", "too_many_outputs")

HARNESS = register(
    Harness(
        "evaluator",
        "opsynth.evaluator.runner:serve_role",
        EVAL_STAGES,
        {**EVALUATION, **{code: reasons.ALL[code] for code in SHARED}},
        judge="opsynth.evaluator.judge:judge",
        judged=EVAL_STAGES,
    )
)
