"""Nearest KernelBench problem of a task's ``Model`` class under ``PythonASTSimilarity``.

A search visits reference problems in decreasing order of an exact upper bound
(``bounds.BoundMatrix``) and stops once no remaining bound can beat the best exact score, so it
returns the same answer as scoring all problems. With a ``floor`` (the decontamination
threshold) it only scores problems whose bound exceeds the floor: enough to decide "above the
threshold or not" exactly, and the answer says that its similarity is then a lower bound.
Ties between problems go to the smaller (level, problem_id).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from opsynth.ast_dedup.bounds import BoundMatrix
from opsynth.ast_dedup.index import DEFAULT_LEVELS, KernelBenchIndex, Problem
from opsynth.ast_dedup.parallel import map_chunks
from opsynth.ast_dedup.similarity import Engine, Program
from opsynth.ast_dedup.source import Parsed, parse_task_code, recursion_headroom

# Scores are rounded to 4 decimals, so a rounded score can exceed its unrounded bound by 5e-5.
_ROUNDING_SLACK = 1e-4
# Interned trees and memoised pairs grow with every distinct query; past these sizes the
# engine restarts from the index (results are unaffected, only cached work is dropped).
_MAX_TREES = 1_500_000
_MAX_MEMO = 4_000_000


@dataclass(frozen=True)
class Nearest:
    """The nearest KernelBench problem of one code string.

    ``reason`` is ``"ok"``, ``"unparseable"`` or ``"no_model_class"``. When ``exact``,
    ``similarity`` is the rounded reference score against the nearest problem, the maximum
    over all problems. Otherwise (a search with a floor) only problems whose upper bound
    exceeded the floor were scored: ``similarity`` is the best of those (None if there were
    none, and the named problem is then the one with the highest bound) and ``upper_bound``
    bounds the true maximum, which therefore cannot exceed the floor unless it was scored."""

    reason: str
    similarity: float | None = None
    level: int | None = None
    problem_id: int | None = None
    name: str | None = None
    exact: bool = True
    upper_bound: float | None = None
    scored: int = 0
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.reason == "ok"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Scorer:
    """The interned reference programs of an index, and a search over them."""

    def __init__(self, index: KernelBenchIndex, levels: Iterable[int] = DEFAULT_LEVELS) -> None:
        self.index = index
        self.problems: list[Problem] = index.select(levels)
        self._reset()

    def _reset(self) -> None:
        self.engine = Engine()
        roots = self.index.intern_into(self.engine.trees, self.problems)
        self.refs: list[Program] = [self.engine.program(r) for r in roots]
        self.bounds = BoundMatrix(self.engine, self.refs)
        self._results: dict[tuple[int, float | None], Nearest] = {}

    def _maybe_reset(self) -> None:
        if len(self.engine.trees) > _MAX_TREES or self.engine.memo_size > _MAX_MEMO:
            self._reset()

    def all_similarities(self, model: ast.ClassDef) -> np.ndarray:
        """Scores against every reference problem (no pruning); for audits and tests."""
        program = self.engine.program_from_ast(model)
        return np.array([self.engine.similarity(program, ref) for ref in self.refs])

    def nearest_code(self, code: str, floor: float | None = None) -> Nearest:
        return self.nearest_parsed(parse_task_code(code), floor)

    def nearest_parsed(self, parsed: Parsed, floor: float | None = None) -> Nearest:
        if not parsed.ok:
            return Nearest(reason=parsed.reason, detail=parsed.detail[:500])
        return self.nearest_model(parsed.model, floor)

    def nearest_model(self, model: ast.ClassDef, floor: float | None = None) -> Nearest:
        with recursion_headroom():
            return self._nearest_model(model, floor)

    def _nearest_model(self, model: ast.ClassDef, floor: float | None) -> Nearest:
        self._maybe_reset()
        root = self.engine.trees.add_ast(model)
        key = (root, floor)
        cached = self._results.get(key)
        if cached is not None:
            return cached
        result = self._search(self.engine.program(root), floor)
        self._results[key] = result
        return result

    def _search(self, program: Program, floor: float | None) -> Nearest:
        if not self.refs:
            return Nearest(reason="ok", similarity=0.0)
        if floor is not None:
            coarse = _rounded(self.bounds.coarse_bounds(self.engine, program))
            if coarse.max() <= floor:
                return self._visit(program, coarse, floor)
        return self._visit(program, _rounded(self.bounds.upper_bounds(self.engine, program)), floor)

    def _visit(self, program: Program, bounds: np.ndarray, floor: float | None) -> Nearest:
        """Score references in decreasing bound order until no bound can beat the best score
        (or, with a floor, until no bound exceeds it). When nothing needed scoring, the
        answer names the problem with the highest bound and has no similarity."""
        order = np.argsort(-bounds, kind="stable").tolist()
        best = -1.0
        best_j = -1
        scored = 0
        exact = True
        for j in order:
            bound = float(bounds[j])
            if bound < best:
                break
            if bound == best and j > best_j:
                continue
            if floor is not None and bound <= floor:
                exact = False
                break
            score = self.engine.similarity(program, self.refs[j])
            scored += 1
            if score > best or (score == best and j < best_j):
                best, best_j = score, j
        if best_j < 0:
            problem = self.problems[order[0]]
            return Nearest(
                reason="ok",
                level=problem.level,
                problem_id=problem.problem_id,
                name=problem.name,
                exact=False,
                upper_bound=float(bounds[order[0]]),
            )
        problem = self.problems[best_j]
        return Nearest(
            reason="ok",
            similarity=best,
            level=problem.level,
            problem_id=problem.problem_id,
            name=problem.name,
            exact=exact,
            upper_bound=None if exact else float(bounds.max()),
            scored=scored,
        )


def _rounded(bounds: np.ndarray) -> np.ndarray:
    """Bounds on rounded scores: rounding is monotone, so a rounded score never exceeds its
    rounded bound; the tiny offset covers float error in the bound itself."""
    return np.round(bounds + 1e-9, 4)


def _make_scorer(index: KernelBenchIndex, levels: tuple[int, ...]) -> Scorer:
    return Scorer(index, levels)


def _score_chunk(scorer: Scorer, chunk: Sequence[tuple[str, float | None]]) -> list[Nearest]:
    return [scorer.nearest_code(code, floor) for code, floor in chunk]


def nearest_kernelbench(
    codes: list[str],
    index: KernelBenchIndex | None = None,
    *,
    levels: Iterable[int] = DEFAULT_LEVELS,
    floor: float | None = None,
    workers: int = 1,
    index_path: Path | None = None,
) -> list[Nearest]:
    """The nearest KernelBench problem of each code string (its ``Model`` class), in order.

    ``floor=None`` gives the exact maximum for every code; a floor (e.g. the decontamination
    threshold) only guarantees exactness where the maximum exceeds it, which is much faster.
    Identical code strings are scored once. ``workers=0`` uses every core."""
    if index is None:
        index = KernelBenchIndex.load(index_path)
    unique: dict[str, int] = {}
    for code in codes:
        unique.setdefault(code, len(unique))
    items = [(code, floor) for code in unique]
    results = map_chunks(_make_scorer, (index, tuple(levels)), _score_chunk, items, workers=workers)
    return [results[unique[code]] for code in codes]
