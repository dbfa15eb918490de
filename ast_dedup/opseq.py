"""A second, independent contamination signal: the task's operator sequence against the
names of KernelBench level-2 problems, which spell their fused operator sequence
(``Conv2d_ReLU_BiasAdd``, ``Gemm_Divide_Sum_Scaling``).

The AST metric ignores identifiers entirely, so two tasks with the same operators but
different code shapes can score low; this signal looks only at which operators, in which
order. It is reported (name and score), never used to drop: KernelBench names are informal
and Ops-6K's ``ops`` list the operators sampled, not necessarily those used.

Both sides are reduced to canonical operator tokens (``nn.Conv2d`` -> ``conv2d``;
``Gemm``/``Matmul`` -> ``linear``/``matmul``; ``Scaling``/``Multiply`` -> ``mul``) and compared
with difflib's ratio (2 * matched / total tokens, order-aware).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

from opsynth.ast_dedup.index import KernelBenchIndex, Problem

OPSEQ_LEVEL = 2

_ALIASES = {
    "gemm": "linear",
    "scaling": "mul",
    "scale": "mul",
    "multiply": "mul",
    "mult": "mul",
    "divide": "div",
    "division": "div",
    "subtract": "sub",
    "substract": "sub",
    "biasadd": "add",
    "residualadd": "add",
    "addition": "add",
    "sum": "sum",
    "bmm": "bmm",
    "matmul": "matmul",
    "mm": "matmul",
    "globalavgpool": "avgpool",
    "avgpool2d": "avgpool",
    "avgpool3d": "avgpool",
    "avgpool1d": "avgpool",
    "maxpool2d": "maxpool",
    "maxpool3d": "maxpool",
    "maxpool1d": "maxpool",
    "batchnorm2d": "batchnorm",
    "batchnorm3d": "batchnorm",
    "batchnorm1d": "batchnorm",
    "instancenorm2d": "instancenorm",
    "instancenorm3d": "instancenorm",
    "swish": "silu",
}
_PREFIX = re.compile(r"^(torch\.nn\.functional|torch\.nn|torch|nn\.functional|nn|F)\.")


def op_token(op: str) -> str:
    """Canonical token of one operator name, from either an Ops-6K ``ops`` entry or a
    KernelBench name component."""
    name = _PREFIX.sub("", op.strip()).lower().replace("_", "")
    return _ALIASES.get(name, name)


def name_tokens(name: str) -> list[str]:
    """``ConvTranspose2d_BiasAdd_Clamp`` -> ``['convtranspose2d', 'add', 'clamp']``."""
    return [op_token(part) for part in name.split("_") if part]


@dataclass(frozen=True)
class OpSeqMatch:
    name: str | None
    problem_id: int | None
    score: float


class OpSeqMatcher:
    """Best-matching KernelBench level-2 name for an operator sequence.

    Only names sharing a token can score above 0; they are tried in decreasing order of
    difflib's multiset upper bound, stopping once no bound can beat the best ratio."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems = sorted((p for p in problems if p.level == OPSEQ_LEVEL), key=lambda p: p.key)
        self.tokens = [name_tokens(p.name) for p in self.problems]
        self.counts = [Counter(t) for t in self.tokens]
        self.by_token: dict[str, list[int]] = {}
        for i, tokens in enumerate(self.tokens):
            for token in set(tokens):
                self.by_token.setdefault(token, []).append(i)
        self._cache: dict[tuple[str, ...], OpSeqMatch] = {}

    @classmethod
    def from_index(cls, index: KernelBenchIndex) -> OpSeqMatcher:
        return cls(index.problems)

    def match(self, ops: Sequence[str]) -> OpSeqMatch:
        key = tuple(ops)
        cached = self._cache.get(key)
        if cached is None:
            tokens = (op_token(op) for op in key if isinstance(op, str))
            cached = self._match(tuple(t for t in tokens if t))
            if len(self._cache) > 100_000:
                self._cache.clear()
            self._cache[key] = cached
        return cached

    def _match(self, seq: tuple[str, ...]) -> OpSeqMatch:
        candidates = sorted({i for token in set(seq) for i in self.by_token.get(token, ())})
        if not candidates:
            return OpSeqMatch(None, None, 0.0)
        mine = Counter(seq)
        bounds = []
        for i in candidates:
            shared = sum((mine & self.counts[i]).values())
            bounds.append((2.0 * shared / (len(seq) + len(self.tokens[i])), i))
        bounds.sort(key=lambda b: (-b[0], b[1]))
        matcher = SequenceMatcher(autojunk=False)
        matcher.set_seq2(list(seq))
        best_score, best_i = 0.0, -1
        for bound, i in bounds:
            if bound < best_score:
                break
            matcher.set_seq1(self.tokens[i])
            score = matcher.ratio()
            if score > best_score or (score == best_score and i < best_i):
                best_score, best_i = score, i
        if best_i < 0:
            return OpSeqMatch(None, None, 0.0)
        problem = self.problems[best_i]
        return OpSeqMatch(problem.name, problem.problem_id, round(best_score, 4))
