"""Decontamination against KernelBench, as CUDA Agent does it: drop a task whose ``Model``
class has ``PythonASTSimilarity`` above the threshold (0.9) with any KernelBench level 1-3
problem's ``Model`` class.

Every row, kept or dropped, carries the evidence in its measures:

* ``kb_similarity``: the maximum similarity (rounded to 4 decimals, like the reference), with
  ``kb_nearest_level`` / ``kb_nearest_problem_id`` / ``kb_nearest_name`` naming the problem;
  ``kb_similarity_exact`` says it is the exact maximum. With ``exact_max = false`` only
  problems whose exact upper bound exceeds the threshold are scored: such rows carry
  ``kb_similarity_bound`` (the bound, never above the threshold unless scored), and
  ``kb_similarity`` is None when nothing needed scoring (the named problem is then the one
  with the highest bound). Drops are the same in both modes.
* ``kb_opseq_match`` / ``kb_opseq_problem_id`` / ``kb_opseq_score``: a second, independent
  signal, the KernelBench level-2 name closest to the task's operator sequence (reported only).
* ``kb_threshold``.

Bad code is judged, never fatal: ``unparseable`` and ``no_model_class`` are reason codes.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from opsynth.ast_dedup.index import KernelBenchIndex
from opsynth.ast_dedup.nearest import Nearest, Scorer, nearest_kernelbench
from opsynth.ast_dedup.opseq import OpSeqMatcher
from opsynth.ast_dedup.parallel import paused_gc
from opsynth.config import DecontamConfig
from opsynth.record import Task, Verdict
from opsynth.stage import KEEP, Decision, StepResult, drop

STAGE = "decontam"
KERNELBENCH_SIMILAR = "kernelbench_similar"


class Decontaminator:
    """The ``decontam`` filter (``opsynth.stage.Filter``). The index is loaded when the filter
    is built, so a missing index fails at start-up rather than on the first task."""

    name = STAGE

    def __init__(self, cfg: DecontamConfig, index_path: Path | None = None) -> None:
        self.cfg = cfg
        self.index = KernelBenchIndex.load(index_path)
        self.index.select(cfg.levels)  # fail now if the index lacks a configured level
        self.opseq = OpSeqMatcher.from_index(self.index)
        self._scorer: Scorer | None = None
        self._lock = threading.Lock()  # the scorer's intern table and memo are not thread-safe

    @property
    def floor(self) -> float | None:
        return None if self.cfg.exact_max else self.cfg.threshold

    @property
    def scorer(self) -> Scorer:
        if self._scorer is None:
            self._scorer = Scorer(self.index, self.cfg.levels)
        return self._scorer

    def filter(self, task: Task) -> Decision:
        with self._lock:
            nearest = self.scorer.nearest_code(task.code, self.floor)
            return self.decide(task, nearest)

    def decide(self, task: Task, nearest: Nearest) -> Decision:
        """The decision for ``task`` given its nearest KernelBench problem."""
        measures = self.measures(task, nearest)
        if not nearest.ok:
            return drop(nearest.reason, nearest.detail, **measures)
        if nearest.similarity is not None and nearest.similarity > self.cfg.threshold:
            detail = (
                f"Model class AST similarity {nearest.similarity:.4f} > {self.cfg.threshold} "
                f"to KernelBench level {nearest.level} problem {nearest.problem_id} "
                f"({nearest.name})"
            )
            return drop(KERNELBENCH_SIMILAR, detail, **measures)
        return Decision(True, KEEP.reason, "", measures)

    def measures(self, task: Task, nearest: Nearest) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kb_similarity": nearest.similarity,
            "kb_similarity_exact": nearest.exact if nearest.ok else False,
            "kb_nearest_level": nearest.level,
            "kb_nearest_problem_id": nearest.problem_id,
            "kb_nearest_name": nearest.name,
            "kb_threshold": self.cfg.threshold,
        }
        if nearest.ok and not nearest.exact:
            out["kb_similarity_bound"] = nearest.upper_bound
        match = self.opseq.match(task.ops)
        out["kb_opseq_match"] = match.name
        out["kb_opseq_problem_id"] = match.problem_id
        out["kb_opseq_score"] = match.score
        return out


def decontaminate_tasks(
    tasks: list[Task], cfg: DecontamConfig, *, index_path: Path | None = None
) -> StepResult:
    """Batch decontamination: one ``decontam`` verdict per task, in input order. Scores each
    distinct code once, over ``cfg.workers`` processes."""
    start = time.perf_counter()
    flt = Decontaminator(cfg, index_path)
    nearest = nearest_kernelbench(
        [t.code for t in tasks],
        flt.index,
        levels=cfg.levels,
        floor=flt.floor,
        workers=cfg.workers,
    )
    return decontam_result(flt, tasks, nearest, started=start)


def decontam_result(
    flt: Decontaminator, tasks: list[Task], nearest: list[Nearest], *, started: float
) -> StepResult:
    """Verdicts and the kept/dropped split, given each task's nearest KernelBench problem."""
    with paused_gc():
        return _decontam_result(flt, tasks, nearest, started)


def _decontam_result(
    flt: Decontaminator, tasks: list[Task], nearest: list[Nearest], started: float
) -> StepResult:
    result = StepResult()
    decisions = [flt.decide(task, near) for task, near in zip(tasks, nearest, strict=True)]
    elapsed = round((time.perf_counter() - started) / max(1, len(tasks)), 6)
    for task, decision in zip(tasks, decisions, strict=True):
        result.add(
            task,
            [
                Verdict(
                    task_id=task.id,
                    stage=STAGE,
                    passed=decision.keep,
                    reason=decision.reason,
                    detail=decision.detail,
                    measures=decision.measures,
                    elapsed_s=elapsed,
                )
            ],
        )
    return result
