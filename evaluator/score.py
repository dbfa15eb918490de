"""Score (task, solution) pairs: static guards here, then the harness in the sandboxed pool.

Each pair gets ``Verdict`` rows (stage ``guard``, then the harness's ``build``,
``correctness`` and ``timing``), like every other stage of the project, and one ``Score``
carrying the reward. Solution code only ever runs inside the filters' workers.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from opsynth.config import EvalConfig, FiltersConfig
from opsynth.evaluator.guards import check_solution
from opsynth.evaluator.reasons import HARNESS as EVALUATOR_HARNESS
from opsynth.evaluator.reward import Score, flags_for, reward
from opsynth.evaluator.solution import Solution
from opsynth.record import Task, Verdict

HARNESS = EVALUATOR_HARNESS.name


@dataclass(frozen=True)
class Job:
    """One (task, solution) pair as the worker pool sees it."""

    id: str
    code: str
    files: dict[str, str] = field(default_factory=dict)


def job_id(task: Task, solution: Solution) -> str:
    return hashlib.sha256(f"{task.id}:{solution.digest}".encode()).hexdigest()[:16]


def harness_settings(cfg: EvalConfig) -> dict:
    return {
        "atol": cfg.atol,
        "rtol": cfg.rtol,
        "trials": cfg.trials,
        "strict": cfg.strict,
        "warmup_runs": cfg.warmup_runs,
        "timed_runs": cfg.timed_runs,
        "input_sets": cfg.input_sets,
        "time_on_cpu": cfg.time_on_cpu,
        "task_timeout_s": cfg.timeout_s,
    }


def score_pairs(
    pairs: Sequence[tuple[Task, Solution]],
    cfg: EvalConfig,
    filters: FiltersConfig,
    device: str,
    group_of=lambda task: "",
    pool=None,
) -> tuple[list[Score], list[Verdict]]:
    """Scores in input order and every verdict row (keyed by the pair's job id). ``pool``: a
    started ``WorkerPool`` to reuse (rollouts score many episodes on one warm pool); None
    starts one for this call."""
    from opsynth.filters.pool import WorkerPool

    verdicts: dict[str, list[Verdict]] = {}
    jobs = []
    for task, solution in pairs:
        jid = job_id(task, solution)
        guard = check_solution(solution.model_new, solution.kernels.values())
        verdicts[jid] = [Verdict(jid, "guard", guard.keep, guard.reason, guard.detail)]
        if guard.keep:
            jobs.append(Job(jid, task.code, solution.files()))
    results: dict[str, list[Verdict]] = {}
    if jobs and pool is not None:
        results = pool.run_harness(jobs, HARNESS, harness_settings(cfg))
    elif jobs:
        with WorkerPool(filters, device) as started:
            results = started.run_harness(jobs, HARNESS, harness_settings(cfg))
    for jid, rows in results.items():
        verdicts[jid] += rows
    scores = [
        score_of(task, solution, verdicts[job_id(task, solution)], cfg, group_of(task))
        for task, solution in pairs
    ]
    return scores, [v for rows in verdicts.values() for v in rows]


def score_of(
    task: Task, solution: Solution, rows: list[Verdict], cfg: EvalConfig, group: str = ""
) -> Score:
    last = rows[-1]
    correct = all(v.passed for v in rows) and any(v.stage == "correctness" for v in rows)
    measures = {k: v for row in rows for k, v in row.measures.items()}
    timed = bool(measures.get("timed"))
    eager = measures.get("eager_ms") if timed else None
    compiled = measures.get("compile_ms") if timed else None
    mine = measures.get("solution_ms") if timed else None
    score = Score(
        task_id=task.id,
        solution=solution.name,
        reward=-1,
        correct=correct,
        reason="ok" if correct else last.reason,
        detail="" if correct else f"{last.stage}: {last.detail}",
        eager_ms=eager,
        compile_ms=compiled,
        solution_ms=mine,
        group=group,
    )
    flags = flags_for(
        score.speedup_eager,
        score.speedup_compile,
        cfg.review_speedup,
        int(measures.get("torch_compute_calls") or 0),
        int(measures.get("functional_calls") or 0),
        int(measures.get("aten_kernels") or 0),
    )
    value = reward(correct, score.speedup_eager, score.speedup_compile, cfg.margin)
    return dataclasses.replace(score, reward=value, flags=flags)


class ScoringPool:
    """``score_pairs`` on one warm ``WorkerPool`` kept across calls (rollout episodes, GRPO
    reward batches), usable from any thread. The pool starts on the first pair worth running,
    so a caller that never produces one never pays for it. Every pool call runs on one
    dedicated thread: bwrap's ``--die-with-parent`` ties the sandboxed workers to the thread
    that started them, and callers' threads come and go. Calls are served one at a time."""

    def __init__(
        self,
        cfg: EvalConfig,
        filters: FiltersConfig,
        device: str,
        gpus: list[str] | None = None,
    ) -> None:
        self.cfg, self.filters, self.device, self.gpus = cfg, filters, device, gpus
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scoring-pool")
        self._pool = None

    def score(
        self, pairs: Sequence[tuple[Task, Solution]], group_of=lambda task: ""
    ) -> tuple[list[Score], list[Verdict]]:
        return self._thread.submit(self._score, list(pairs), group_of).result()

    def _score(self, pairs: list[tuple[Task, Solution]], group_of) -> tuple[list, list]:
        from opsynth.filters.pool import WorkerPool

        if self._pool is None:
            pool = WorkerPool(self.filters, self.device, gpus=self.gpus)
            pool.start()
            self._pool = pool
        return score_pairs(pairs, self.cfg, self.filters, self.device, group_of, self._pool)

    def close(self) -> None:
        """Stop the pool's workers; a later ``score`` starts a new pool."""

        def stop() -> None:
            if self._pool is not None:
                self._pool.close()
                self._pool = None

        self._thread.submit(stop).result()

    def __enter__(self) -> ScoringPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
