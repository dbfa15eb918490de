"""The agent's feedback commands: ``python -m opsynth.trainer.commands compile|verify|profile``.

Run from the workdir, inside the agent's shell sandbox. Each runs the evaluator's own checks
in-process, so what the agent is told matches what the scorer does: the static guards, then
the harness stages (``build``: the ``kernels/`` extension and ``model_new.py``;
``correctness`` against ``./model.py``; ``timing`` against eager and ``torch.compile``) with
the default ``EvalConfig`` settings. Failures print the full compiler output or traceback and
exit 1.

None of this decides the reward. After the episode the loop collects ``model_new.py`` and
``kernels/`` and scores them through the evaluator's sandboxed pool
(``evaluator.score.score_pairs(..., pool=...)``) against the task's original code, not this
directory's ``model.py``; so a tampered reference, a patched harness or a forged report here
changes only the agent's own feedback.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODEL = "model.py"
STAGES = {
    "compile": ("build",),
    "verify": ("build", "correctness"),
    "profile": ("build", "correctness", "timing"),
}
CAUSE_CHARS = 12_000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m opsynth.trainer.commands", description=__doc__)
    parser.add_argument("command", choices=list(STAGES))
    command = parser.parse_args(argv).command
    workdir = Path.cwd()
    if not (workdir / MODEL).is_file():
        print(f"no {MODEL} here: run this from the workdir")
        return 2
    failure = guard_failure(workdir)
    if failure:
        print(failure)
        return 1
    return run_stages(workdir, STAGES[command])


def guard_failure(workdir: Path) -> str:
    """Why the scorer would reject the sources before running them, or ""."""
    from opsynth.evaluator.guards import REASONS, check_solution
    from opsynth.evaluator.solution import MODEL_NEW, SolutionError, load_solution

    if not (workdir / MODEL_NEW).is_file():
        return f"no {MODEL_NEW} yet: write class ModelNew there (see INSTRUCTIONS.md)"
    try:
        solution = load_solution(workdir)
    except SolutionError as exc:
        return f"cannot read the solution: {exc}"
    decision = check_solution(solution.model_new, solution.kernels.values())
    if decision.keep:
        return ""
    why = REASONS.get(decision.reason, "")
    return (
        f"rejected by the static checks ({decision.reason}{': ' + why if why else ''}): "
        f"{decision.detail}\nthe scorer gives this reward -1 without running it"
    )


def run_stages(workdir: Path, stages: tuple[str, ...]) -> int:
    import torch

    from opsynth.config import EvalConfig
    from opsynth.evaluator import harness
    from opsynth.evaluator.score import harness_settings

    cfg = EvalConfig()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    settings = {**harness_settings(cfg), "device": device, "task_file": MODEL}
    session = harness.Session(str(workdir), settings)
    run: dict[str, Callable[[Any], dict[str, Any]]] = {
        "build": harness.stage_build,
        "correctness": harness.stage_correctness,
        "timing": harness.stage_timing,
    }
    measures: dict[str, Any] = {}
    for name in stages:
        try:
            measures.update(run[name](session))
        except harness.Rejected as rejected:
            cause = rejected.__cause__
            if cause is not None and rejected.reason == "build_error":
                print(f"{name}: FAILED ({rejected.reason})\n{_cause(cause, full=True)}")
                return 1
            print(f"{name}: FAILED ({rejected.reason}) {rejected.detail}")
            if cause is not None:
                print(_cause(cause, full=False))
            return 1
        except BaseException as exc:  # the solution's code may raise anything
            print(f"{name}: FAILED")
            print(_cause(exc, full=False))
            return 1
        print(REPORTS[name](measures, device, cfg))
    return 0


def _report_build(m: dict[str, Any], device: str, cfg: Any) -> str:
    built = "no kernel sources"
    if m["sources"]:
        built = f"{m['sources']} kernel source(s) built in {m['build_s']:.1f} s"
    return f"build: ok ({built}; model_new.py imports and defines ModelNew)"


def _report_correctness(m: dict[str, Any], device: str, cfg: Any) -> str:
    return (
        f"correctness: ok on {device} ({m['trials']} input draws, max abs diff "
        f"{m['max_abs_diff']:.3g}, tolerance atol=rtol={cfg.atol:g})"
    )


def _report_timing(m: dict[str, Any], device: str, cfg: Any) -> str:
    from opsynth.evaluator.reward import reward

    if not m.get("timed"):
        return (
            "timing: skipped (solutions are timed on CUDA only; without a GPU a correct "
            f"solution earns reward {reward(True, None, None, cfg.margin)})"
        )
    eager, compiled, mine = m["eager_ms"], m["compile_ms"], m["solution_ms"]
    vs_eager = eager / mine if mine > 0 else None
    vs_compile = compiled / mine if mine > 0 else None
    value = reward(True, vs_eager, vs_compile, cfg.margin)
    rows = [
        f"timing on {m['device_name']} (median of {m['timed_runs']} runs):",
        f"  eager          {eager:10.4f} ms",
        f"  torch.compile  {compiled:10.4f} ms",
        f"  model_new      {mine:10.4f} ms   {_x(vs_eager)} vs eager, {_x(vs_compile)} vs compile",
        f"reward this would earn: {value} ({MEANING[value]}; 'faster' means more than "
        f"{cfg.margin:.0%})",
    ]
    return "\n".join(rows)


REPORTS = {"build": _report_build, "correctness": _report_correctness, "timing": _report_timing}
MEANING = {
    1: "correct, not faster than eager",
    2: "faster than eager, not than torch.compile",
    3: "faster than eager and torch.compile",
}


def _x(ratio: float | None) -> str:
    return f"{ratio:.3f}x" if ratio is not None else "n/a"


def _cause(exc: BaseException, full: bool) -> str:
    """A build error's message carries the compiler output; anything else gets its
    traceback, which points into the agent's own files."""
    text = str(exc) if full else "".join(traceback.format_exception(exc))
    if len(text) > CAUSE_CHARS:
        half = CAUSE_CHARS // 2
        text = (
            f"{text[:half]}\n[... {len(text) - CAUSE_CHARS} characters dropped ...]\n{text[-half:]}"
        )
    return text.rstrip()


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)
    sys.exit(main())
