"""``PythonASTSimilarity`` (continuous-eval, after python-ast-comparison), computed exactly.

The reference metric, restated:

* The *significant subtrees* of a program are its ``Import``, ``FunctionDef``, ``If``,
  ``ClassDef``, ``While``, ``For``, ``comprehension`` and ``Return`` nodes (nested ones count
  again), in ``ast.walk`` order.
* Two nodes match with score 0 if their types differ or they have a different number of AST
  children, 1 if both are leaves, and otherwise 1 plus the best one-to-one pairing of their
  children (children may be reordered; the pairing maximises the summed child scores).
* The significant subtrees of both programs are paired one-to-one (maximum summed score).
  Each pair contributes its score times the weight of its root type (Import 0.3,
  FunctionDef 1.2, If 0.5, the rest 1); the similarity is twice that sum over the weighted
  size of all significant subtrees on both sides, rounded to 4 decimals. When either side
  has at most one significant subtree the reference never fills the weighted sum, so the
  similarity is 0; we keep that.

Scores only depend on structure, so they are computed on interned trees (``tree.Interner``)
with a memo over tree pairs. The child pairing's optimum is unique in value, so any exact
assignment solver reproduces the reference; the top-level pairing splits into independent
blocks per root type and child count, because pairs across blocks score 0.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from opsynth.ast_dedup.source import parse_module, parse_task_code, recursion_headroom
from opsynth.ast_dedup.tree import Interner

SIGNIFICANT_WEIGHTS: dict[str, float] = {
    "Import": 0.3,
    "FunctionDef": 1.2,
    "If": 0.5,
    "ClassDef": 1.0,
    "While": 1.0,
    "For": 1.0,
    "comprehension": 1.0,
    "Return": 1.0,
}

_PERMS3 = list(itertools.permutations(range(3)))


@dataclass(frozen=True)
class Program:
    """A program reduced to what the metric reads: its significant subtrees in walk order,
    their weights, and the weighted size that forms the denominator."""

    root: int
    subtrees: tuple[int, ...]
    weights: tuple[float, ...]
    weighted_size: float

    @property
    def scoreable(self) -> bool:
        return len(self.subtrees) > 1


class Engine:
    """Interned trees plus the memo of pairwise scores; share one engine across a batch."""

    def __init__(self, interner: Interner | None = None) -> None:
        self.trees = interner if interner is not None else Interner()
        self._memo: dict[int, int] = {}
        self._sig_labels: dict[int, float] = {}

    # -- programs -------------------------------------------------------------------------

    def program(self, root: int) -> Program:
        """The significant subtrees of the tree ``root`` (a module, or a class on its own)."""
        trees = self.trees
        sig_weight = self.significant_labels()
        subtrees: list[int] = []
        weights: list[float] = []
        total = 0.0
        for tid in trees.walk(root):
            weight = sig_weight.get(trees.labels[tid])
            if weight is not None:
                subtrees.append(tid)
                weights.append(weight)
                total += trees.sizes[tid] * weight
        return Program(root, tuple(subtrees), tuple(weights), total)

    def program_from_ast(self, node: ast.AST) -> Program:
        return self.program(self.trees.add_ast(node))

    def significant_labels(self) -> dict[int, float]:
        """``{label id: weight}`` of the significant node types."""
        if len(self._sig_labels) != len(SIGNIFICANT_WEIGHTS):
            for name, weight in SIGNIFICANT_WEIGHTS.items():
                self._sig_labels[self.trees.label_id(name)] = weight
        return self._sig_labels

    # -- node scores ------------------------------------------------------------------------

    def compare(self, a: int, b: int) -> int:
        """The reference's node match score (number of matched nodes) of trees ``a`` and ``b``."""
        if a == b:
            return self.trees.sizes[a]
        trees = self.trees
        if trees.labels[a] != trees.labels[b]:
            return 0
        ca = trees.children[a]
        cb = trees.children[b]
        n = len(ca)
        if n != len(cb):
            return 0
        if n == 0:
            return 1
        if n == 1:
            return 1 + self.compare(ca[0], cb[0])
        key = (a << 32) | b if a < b else (b << 32) | a
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        compare = self.compare
        if n == 2:
            a0, a1 = ca
            b0, b1 = cb
            best = max(compare(a0, b0) + compare(a1, b1), compare(a0, b1) + compare(a1, b0))
        else:
            matrix = [[compare(x, y) for y in cb] for x in ca]
            best = _max_assignment(matrix)
        self._memo[key] = best + 1
        return best + 1

    @property
    def memo_size(self) -> int:
        return len(self._memo)

    # -- program scores ---------------------------------------------------------------------

    def similarity(self, pa: Program, pb: Program) -> float:
        """The reference similarity of two programs, rounded to 4 decimals like the reference.

        The weighted sum is accumulated in the reference's order (rows of ``pa`` in walk
        order) so that even float rounding agrees with it."""
        if not (pa.scoreable and pb.scoreable):
            return 0.0
        row_values = self._row_values(pa, pb)
        best = 0.0
        for value in row_values:
            best += value
        return round(2 * best / (pa.weighted_size + pb.weighted_size), 4)

    def _row_values(self, pa: Program, pb: Program) -> list[float]:
        """Per row of ``pa``: the weighted score of the subtree it is paired with (or 0)."""
        trees = self.trees
        blocks: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
        for i, tid in enumerate(pa.subtrees):
            key = (trees.labels[tid], len(trees.children[tid]))
            blocks.setdefault(key, ([], []))[0].append(i)
        for j, tid in enumerate(pb.subtrees):
            key = (trees.labels[tid], len(trees.children[tid]))
            block = blocks.get(key)
            if block is not None:
                block[1].append(j)
        values = [0.0] * len(pa.subtrees)
        for rows, cols in blocks.values():
            if not cols:
                continue
            matrix = [[self.compare(pa.subtrees[i], pb.subtrees[j]) for j in cols] for i in rows]
            for r, c in _assignment_pairs(matrix):
                score = matrix[r][c]
                if score:
                    values[rows[r]] = score * pa.weights[rows[r]]
        return values


def _max_assignment(matrix: list[list[int]]) -> int:
    """Maximum total of a one-to-one pairing of rows and columns of a square matrix."""
    n = len(matrix)
    if n == 3:
        m0, m1, m2 = matrix
        return max(m0[p[0]] + m1[p[1]] + m2[p[2]] for p in _PERMS3)
    arr = np.asarray(matrix, dtype=np.int64)
    if not arr.any():
        return 0
    r, c = linear_sum_assignment(arr, maximize=True)
    return int(arr[r, c].sum())


def _assignment_pairs(matrix: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """A maximum-total one-to-one pairing of a (possibly rectangular) matrix."""
    if len(matrix) == 1:
        row = matrix[0]
        return [(0, max(range(len(row)), key=row.__getitem__))]
    if len(matrix[0]) == 1:
        return [(max(range(len(matrix)), key=lambda i: matrix[i][0]), 0)]
    arr = np.asarray(matrix, dtype=np.int64)
    r, c = linear_sum_assignment(arr, maximize=True)
    return list(zip(r.tolist(), c.tolist(), strict=True))


def python_ast_similarity(code_a: str, code_b: str, engine: Engine | None = None) -> float:
    """Reference-compatible similarity of two whole programs; -1.0 when either fails to parse
    (the reference's convention)."""
    tree_a, _ = parse_module(code_a)
    tree_b, _ = parse_module(code_b)
    if tree_a is None or tree_b is None:
        return -1.0
    engine = engine or Engine()
    with recursion_headroom():
        return engine.similarity(engine.program_from_ast(tree_a), engine.program_from_ast(tree_b))


def model_class_similarity(code_a: str, code_b: str, engine: Engine | None = None) -> float | None:
    """Similarity of the ``Model`` classes of two programs (what decontamination scores), or
    None when either program does not parse or has no ``Model`` class."""
    parsed_a = parse_task_code(code_a)
    parsed_b = parse_task_code(code_b)
    if not (parsed_a.ok and parsed_b.ok):
        return None
    engine = engine or Engine()
    with recursion_headroom():
        return engine.similarity(
            engine.program_from_ast(parsed_a.model), engine.program_from_ast(parsed_b.model)
        )
