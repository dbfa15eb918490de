"""Exact upper bounds on ``PythonASTSimilarity``, cheap enough to compute for every pair.

The node score of two trees counts node pairs that the reference matched, and it only matches
nodes of the same type with the same number of children. The one-to-one pairing of significant
subtrees only scores pairs whose roots agree on that (type, child count) key. So, with
``H_P[r, k]`` the number of nodes with key ``k`` inside the significant subtrees of program
``P`` whose root key is ``r``, the weighted best pairing is at most
``sum over (r, k) of weight(r) * min(H_A[r, k], H_B[r, k])``: every matched pair of nodes uses
one node of each side under the same root key. Dividing twice that by the weighted sizes gives
an upper bound on the similarity, which lets a nearest-neighbour search skip most exact scores.
"""

from __future__ import annotations

import numpy as np

from opsynth.ast_dedup.similarity import Engine, Program

_KEY_SPAN = 1 << 12  # child counts above this share a key; the bound stays valid (coarser)
_FEATURE_SHIFT = 32  # a feature packs (root key << 32) | node key


def _key(label: int, n_children: int) -> int:
    return label * _KEY_SPAN + min(n_children, _KEY_SPAN - 1)


def program_features(engine: Engine, program: Program) -> dict[int, int]:
    """``{feature: count}`` with feature = (root key, node key) packed in one int, counted over
    every significant subtree that encloses the node (nested subtrees count it again)."""
    labels = engine.trees.labels
    children = engine.trees.children
    sig = engine.significant_labels()
    feats: dict[int, int] = {}
    stack: list[tuple[int, tuple[int, ...]]] = [(program.root, ())]
    while stack:
        tid, active = stack.pop()
        kids = children[tid]
        label = labels[tid]
        key = _key(label, len(kids))
        if label in sig:
            active = (*active, key << _FEATURE_SHIFT)
        for r in active:
            f = r | key
            feats[f] = feats.get(f, 0) + 1
        for c in kids:
            stack.append((c, active))
    return feats


def _root_label(feature: int) -> int:
    return (feature >> _FEATURE_SHIFT) // _KEY_SPAN


def root_sizes(engine: Engine, program: Program) -> dict[int, float]:
    """``{root key: weighted size}`` summed over the program's significant subtrees."""
    labels = engine.trees.labels
    children = engine.trees.children
    sizes = engine.trees.sizes
    out: dict[int, float] = {}
    for tid, weight in zip(program.subtrees, program.weights, strict=True):
        key = _key(labels[tid], len(children[tid]))
        out[key] = out.get(key, 0.0) + sizes[tid] * weight
    return out


class _Table:
    """Reference values per feature, stored feature-major so a query gathers whole rows."""

    def __init__(self, per_ref: list[dict[int, float]], weight_of) -> None:
        self.columns: dict[int, int] = {}
        for values in per_ref:
            for key in values:
                self.columns.setdefault(key, len(self.columns))
        self.values = np.zeros((max(1, len(self.columns)), len(per_ref)), dtype=np.float64)
        self.weights = np.zeros(max(1, len(self.columns)), dtype=np.float64)
        for ref, values in enumerate(per_ref):
            for key, value in values.items():
                row = self.columns[key]
                self.values[row, ref] = value
                self.weights[row] = weight_of(key)

    def shared(self, query: dict[int, float]) -> np.ndarray | None:
        """``sum over features of weight * min(query, reference)`` for every reference."""
        rows = []
        amounts = []
        columns = self.columns
        for key, amount in query.items():
            row = columns.get(key)
            if row is not None:
                rows.append(row)
                amounts.append(amount)
        if not rows:
            return None
        idx = np.asarray(rows)
        block = np.minimum(self.values[idx], np.asarray(amounts, dtype=np.float64)[:, None])
        return self.weights[idx] @ block


class BoundMatrix:
    """Upper bounds of a query program's similarity to every reference program, two ways:

    * ``coarse_bounds``: matched nodes lie in significant subtrees with equal root keys, so the
      weighted best pairing is at most ``sum over root keys of min(weighted sizes)``;
    * ``upper_bounds``: the (root key, node key) histogram bound of the module docstring,
      tighter and a few times dearer.
    """

    def __init__(self, engine: Engine, programs: list[Program]) -> None:
        weight_of = engine.significant_labels()
        self.fine = _Table(
            [program_features(engine, p) for p in programs],
            lambda feature: weight_of[_root_label(feature)],
        )
        self.coarse = _Table([root_sizes(engine, p) for p in programs], lambda _key: 1.0)
        self.weighted_sizes = np.array([p.weighted_size for p in programs], dtype=np.float64)
        self.scoreable = np.array([p.scoreable for p in programs], dtype=bool)

    def _finish(self, program: Program, numer: np.ndarray | None) -> np.ndarray:
        if numer is None or not program.scoreable:
            return np.zeros(len(self.weighted_sizes))
        bound = 2.0 * numer / (program.weighted_size + self.weighted_sizes)
        bound[~self.scoreable] = 0.0
        return np.minimum(bound, 1.0)

    def coarse_bounds(self, engine: Engine, program: Program) -> np.ndarray:
        return self._finish(program, self.coarse.shared(root_sizes(engine, program)))

    def upper_bounds(self, engine: Engine, program: Program) -> np.ndarray:
        return self._finish(program, self.fine.shared(program_features(engine, program)))
