"""Single-turn GRPO: one prompt per task, one reply holding the whole solution, scored by the
evaluator.

The multi-turn agent needs a sandbox with a shell per episode; a single reply needs nothing
but the evaluator, so it is the cheap way to put the reward itself under RL. The reply's last
fenced Python block defining ``ModelNew`` is the solution (native code goes in
``load_inline`` strings, the one native entry point the guards allow). A reply without one
is -1 and never reaches the sandbox.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opsynth.config import EvalConfig, FiltersConfig
from opsynth.evaluator.score import ScoringPool
from opsynth.evaluator.solution import Solution
from opsynth.record import Task

INSTRUCTIONS = {
    "cuda": (
        "Write custom CUDA kernels that make it faster on an NVIDIA GPU. Compile them with "
        "torch.utils.cpp_extension.load_inline (cuda_sources for the kernels and launchers, "
        "cpp_sources for the declarations, functions=[...])."
    ),
    "cpu": (
        "Write custom C++ code that computes it on the CPU. Compile it with "
        "torch.utils.cpp_extension.load_inline (cpp_sources with the functions, "
        "functions=[...])."
    ),
}

SYSTEM = (
    "You are an expert in high-performance GPU programming. You replace PyTorch models with "
    "equivalent ones whose computation runs in custom kernels."
)

RULES = (
    "Reply with one complete Python file in a single ```python code block. It must define "
    "class ModelNew(nn.Module) with the same __init__ arguments and parameters (state_dict "
    "keys and shapes) as Model, and a forward that returns the same outputs within 1e-2. "
    "ModelNew.forward must do its computation in your kernels: torch.nn.functional and "
    "PyTorch compute ops are not allowed there (shape queries, views and allocation are). "
    "No try/except fallbacks, threads, extra CUDA streams or patching of torch; do not "
    "import the task's Model."
)

_FENCE = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def prompt_for(task: Task, device: str) -> list[dict[str, str]]:
    """The chat prompt for one task; ``device`` picks CUDA or CPU C++ instructions."""
    how = INSTRUCTIONS["cuda" if device == "cuda" else "cpu"]
    user = (
        "Here is a PyTorch model:\n\n```python\n"
        + task.code.rstrip()
        + f"\n```\n\n{how}\n\n{RULES}"
    )
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def completion_text(completion: Any) -> str:
    """TRL hands conversational completions as message lists, plain ones as strings."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(
            str(m.get("content") or "") for m in completion if m.get("role") == "assistant"
        )
    return ""


def parse_solution(text: str, name: str = "completion") -> Solution | None:
    """The last closed code block that parses and defines ``ModelNew``; None otherwise (a
    truncated reply has no closing fence and is refused rather than guessed at)."""
    for block in reversed(_FENCE.findall(text)):
        if "ModelNew" not in block:
            continue
        try:
            tree = ast.parse(block)
        except (SyntaxError, ValueError):
            return None
        if any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body):
            return Solution(name, block)
        return None
    return None


class KernelReward:
    """A TRL reward function: the evaluator's reward for each completion of a task.

    Called with TRL's batch (``prompts``, ``completions``, and the dataset's ``task_id``
    column). One warm ``WorkerPool`` serves every call of a training run: started on the first
    completion worth scoring, closed by ``close()``. Each call's rows are appended to
    ``log_path`` (JSONL) so rewards can be audited against the completions that earned them.
    """

    __name__ = "kernel_reward"

    def __init__(
        self,
        tasks: Sequence[Task],
        eval_cfg: EvalConfig,
        filters: FiltersConfig,
        device: str,
        *,
        gpus: list[str] | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.tasks = {t.id: t for t in tasks}
        self.eval_cfg, self.filters, self.device, self.gpus = eval_cfg, filters, device, gpus
        self.log_path = Path(log_path) if log_path else None
        self.calls = 0
        self._scoring = ScoringPool(eval_cfg, filters, device, gpus)

    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[Any], task_id=None, **kwargs: Any
    ) -> list[float]:
        ids = list(task_id) if task_id is not None else [None] * len(completions)
        solutions = [parse_solution(completion_text(c)) for c in completions]
        # identical completions of one task (common within a GRPO group) are scored once
        unique: dict[tuple[str, str], int] = {}
        pairs, slot = [], []
        for tid, solution in zip(ids, solutions, strict=True):
            if solution is None or tid not in self.tasks:
                slot.append(None)
                continue
            key = (tid, solution.digest)
            if key not in unique:
                unique[key] = len(pairs)
                pairs.append((self.tasks[tid], solution))
            slot.append(unique[key])
        rewards = [-1.0] * len(completions)
        reasons = ["unknown_task" if t not in self.tasks else "no_solution" for t in ids]
        if pairs:
            scores, _ = self._scoring.score(pairs)
            for i, j in enumerate(slot):
                if j is not None:
                    rewards[i], reasons[i] = float(scores[j].reward), scores[j].reason
        self.calls += 1
        self._log(ids, completions, rewards, reasons, kwargs.get("trainer_state"))
        return rewards

    def close(self) -> None:
        self._scoring.close()

    def __enter__(self) -> KernelReward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _log(self, ids, completions, rewards, reasons, state) -> None:
        if self.log_path is None:
            return
        step = getattr(state, "global_step", None)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as fh:
            for tid, completion, value, reason in zip(
                ids, completions, rewards, reasons, strict=True
            ):
                row = {
                    "call": self.calls,
                    "step": step,
                    "task_id": tid,
                    "reward": value,
                    "reason": reason,
                    "completion": completion_text(completion),
                }
                fh.write(json.dumps(row) + "\n")
