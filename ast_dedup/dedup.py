"""Intra-set deduplication: exact, near and structural duplicates, one representative each.

Three kinds, applied in this order and each switchable in ``DedupConfig``:

* ``exact_duplicate``: equal normalised code (``normalize``): the same program up to comments,
  docstrings, formatting and the names it chose.
* ``near_duplicate``: Jaccard similarity of normalised AST shingles at or above
  ``near_threshold``. Candidate pairs come from datasketch's MinHash LSH; each candidate pair
  is then checked with the exact Jaccard of its shingle sets, so LSH only affects recall.
  Clusters are the connected components of the verified pairs.
* ``structural_duplicate``: equal Weisfeiler-Lehman hash of the ``forward`` dataflow graph
  (``dataflow``): the same operators wired the same way, with other sizes or constants.

Each cluster keeps its member with the smallest task id (ids are content hashes, so the choice
does not depend on input order) and drops the rest. Every row gets one verdict whose measures
name its clusters (``exact_cluster``: the normalised-code digest; ``near_cluster``: the id of
the cluster's kept task; ``structural_cluster``: the graph hash) and its parse status; a
dropped row also names the kept task of its cluster (``duplicate_of``), and rows linked to a
near duplicate carry their best verified Jaccard (``near_jaccard``). Code that does not parse
is keyed by its raw text, so only identical strings of it are exact duplicates.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from datasketch import LeanMinHash, MinHash, MinHashLSH

from opsynth.ast_dedup.dataflow import forward_graph, structural_hash
from opsynth.ast_dedup.normalize import normal_form
from opsynth.ast_dedup.parallel import map_chunks, paused_gc
from opsynth.ast_dedup.source import Parsed, parse_task_code, recursion_headroom
from opsynth.config import DedupConfig
from opsynth.record import Task, Verdict
from opsynth.stage import StepResult

STAGE = "dedup"
EXACT = "exact_duplicate"
NEAR = "near_duplicate"
STRUCTURAL = "structural_duplicate"
_MINHASH_SEED = 1


@dataclass(frozen=True)
class DedupKeys:
    """What dedup needs from one code string. ``parse`` is ``ok``, ``unparseable`` or
    ``no_model_class``; unparseable code is keyed by its raw text only."""

    parse: str
    exact: str
    shingles: np.ndarray | None = None
    minhash: np.ndarray | None = None
    structural: str | None = None


@dataclass(frozen=True)
class _KeySettings:
    near: bool
    structural: bool
    num_perm: int
    wl_iterations: int


_MAX_REMEMBERED = 200_000


class _KeyMaker:
    """Computes ``DedupKeys``; everything after the normal form depends only on the normal
    form, so a repeated normalised program reuses its earlier keys."""

    def __init__(self, settings: _KeySettings) -> None:
        self.settings = settings
        self.seen: dict[str, DedupKeys] = {}
        self.permutations = None
        if settings.near:
            template = MinHash(num_perm=settings.num_perm, seed=_MINHASH_SEED, hashfunc=int)
            self.permutations = template.permutations
            self.scheme = template.scheme

    def keys(self, code: str) -> DedupKeys:
        return self.keys_parsed(code, parse_task_code(code))

    def keys_parsed(self, code: str, parsed: Parsed) -> DedupKeys:
        with recursion_headroom():
            return self._keys_parsed(code, parsed)

    def _keys_parsed(self, code: str, parsed: Parsed) -> DedupKeys:
        if parsed.tree is None:
            return DedupKeys(parse=parsed.reason, exact="raw:" + _sha(code))
        form = normal_form(parsed.tree)
        seen = self.seen.get(form.key)
        if seen is not None:
            return seen
        minhash = None
        if self.settings.near and len(form.shingles):
            mh = MinHash(
                num_perm=self.settings.num_perm,
                seed=_MINHASH_SEED,
                hashfunc=int,
                permutations=self.permutations,
                scheme=self.scheme,
            )
            mh.update_batch(form.shingles.tolist())
            minhash = mh.hashvalues
        structural = None
        if self.settings.structural and parsed.model is not None:
            graph = forward_graph(parsed.model)
            if graph is not None:
                structural = structural_hash(graph, self.settings.wl_iterations)
        keys = DedupKeys(
            parse=parsed.reason,
            exact=form.key,
            shingles=form.shingles if self.settings.near else None,
            minhash=minhash,
            structural=structural,
        )
        if len(self.seen) >= _MAX_REMEMBERED:
            self.seen.clear()
        self.seen[form.key] = keys
        return keys


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def key_settings(cfg: DedupConfig) -> _KeySettings:
    return _KeySettings(cfg.near, cfg.structural, cfg.num_perm, cfg.wl_iterations)


def make_keymaker(settings: _KeySettings) -> _KeyMaker:
    return _KeyMaker(settings)


def _keys_chunk(maker: _KeyMaker, codes: Sequence[str]) -> list[DedupKeys]:
    return [maker.keys(code) for code in codes]


class KeyCache:
    """Dedup keys kept across calls, for a set that grows: a run dedups everything accepted so
    far after each chunk, and without this it would parse every earlier task again each time.
    Keys depend only on the code and the key settings, so a cache serves one setting only."""

    def __init__(self) -> None:
        self.settings: _KeySettings | None = None
        self.keys: dict[str, DedupKeys] = {}

    def serving(self, settings: _KeySettings) -> dict[str, DedupKeys]:
        if settings != self.settings:
            self.settings, self.keys = settings, {}
        return self.keys


def dedup_keys(
    codes: Sequence[str], cfg: DedupConfig, cache: KeyCache | None = None
) -> list[DedupKeys]:
    """Keys of each code string, in order; identical strings are analysed once, and strings
    ``cache`` holds are not analysed again."""
    settings = key_settings(cfg)
    known = cache.serving(settings) if cache is not None else {}
    unknown = list(dict.fromkeys(code for code in codes if code not in known))
    fresh = map_chunks(make_keymaker, (settings,), _keys_chunk, unknown, workers=cfg.workers)
    known.update(zip(unknown, fresh, strict=True))
    return [known[code] for code in codes]


class _UnionFind:
    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, x: int) -> int:
        parent = self.parent
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def _jaccard(a: np.ndarray, b: np.ndarray) -> float:
    shared = np.intersect1d(a, b, assume_unique=True).size
    return shared / (a.size + b.size - shared)


def near_clusters(
    members: list[int], keys: list[DedupKeys], threshold: float, num_perm: int
) -> tuple[dict[int, int], dict[int, float]]:
    """Connected components of verified near-duplicate pairs among ``members`` (positions in
    ``keys``). Returns each member's component root (the smallest member position, which the
    caller orders by task id) and, for linked members, the best Jaccard of their links."""
    candidates = [m for m in members if keys[m].minhash is not None]
    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
    uf = _UnionFind(len(candidates))
    best: dict[int, float] = {}
    for pos, member in enumerate(candidates):
        key = keys[member]
        sketch = LeanMinHash(seed=_MINHASH_SEED, hashvalues=key.minhash, scheme="affine32")
        for other in lsh.query(sketch):
            score = _jaccard(key.shingles, keys[candidates[other]].shingles)
            if score >= threshold:
                best[member] = max(best.get(member, 0.0), score)
                best[candidates[other]] = max(best.get(candidates[other], 0.0), score)
                uf.union(pos, other)
        lsh.insert(pos, sketch, check_duplication=False)
    root_of = {m: m for m in members}
    for pos, member in enumerate(candidates):
        root_of[member] = candidates[uf.find(pos)]
    return root_of, best


def dedup(tasks: list[Task], cfg: DedupConfig, cache: KeyCache | None = None) -> StepResult:
    """Deduplicate ``tasks`` within the set; one ``dedup`` verdict per input task, in order.
    The verdicts do not depend on ``cache``, only the work does."""
    start = time.perf_counter()
    keys = dedup_keys([t.code for t in tasks], cfg, cache)
    return dedup_with_keys(tasks, keys, cfg, started=start)


def dedup_with_keys(
    tasks: list[Task], keys: list[DedupKeys], cfg: DedupConfig, *, started: float | None = None
) -> StepResult:
    """``dedup`` with the keys of each task (aligned with ``tasks``) already computed."""
    with paused_gc():
        return _dedup_with_keys(tasks, keys, cfg, started)


def _dedup_with_keys(
    tasks: list[Task], keys: list[DedupKeys], cfg: DedupConfig, started: float | None
) -> StepResult:
    start = time.perf_counter() if started is None else started
    result = StepResult()
    if not tasks:
        return result
    # Positions sorted by task id: "first in this order" is the deterministic representative.
    order = sorted(range(len(tasks)), key=lambda i: (tasks[i].id, i))
    ordered = [tasks[i] for i in order]
    keys = [keys[i] for i in order]
    n = len(ordered)
    reason = ["ok"] * n
    duplicate_of: list[int | None] = [None] * n

    exact_rep: dict[str, int] = {}
    for i, key in enumerate(keys):
        exact_rep.setdefault(key.exact, i)
    if cfg.exact:
        for i, key in enumerate(keys):
            rep = exact_rep[key.exact]
            if rep != i:
                reason[i], duplicate_of[i] = EXACT, rep
    alive = [i for i in range(n) if reason[i] == "ok"]

    near_root: dict[int, int] = {}
    near_score: dict[int, float] = {}
    if cfg.near:
        near_root, near_score = near_clusters(alive, keys, cfg.near_threshold, cfg.num_perm)
        for i in alive:
            if near_root[i] != i:
                reason[i], duplicate_of[i] = NEAR, near_root[i]
        alive = [i for i in alive if reason[i] == "ok"]

    if cfg.structural:
        struct_rep: dict[str, int] = {}
        for i in alive:
            if keys[i].structural is not None:
                rep = struct_rep.setdefault(keys[i].structural, i)
                if rep != i:
                    reason[i], duplicate_of[i] = STRUCTURAL, rep

    elapsed = round((time.perf_counter() - start) / n, 6)
    verdicts: list[Verdict | None] = [None] * n
    for i, task in enumerate(ordered):
        key = keys[i]
        measures: dict[str, Any] = {"parse": key.parse, "exact_cluster": key.exact}
        if cfg.near:
            root = near_root.get(exact_rep[key.exact], exact_rep[key.exact])
            measures["near_cluster"] = ordered[root].id
            if i in near_score:
                measures["near_jaccard"] = round(near_score[i], 4)
        if cfg.structural:
            measures["structural_cluster"] = key.structural
        if duplicate_of[i] is not None:
            measures["duplicate_of"] = ordered[duplicate_of[i]].id
        verdicts[order[i]] = Verdict(
            task_id=task.id,
            stage=STAGE,
            passed=reason[i] == "ok",
            reason=reason[i],
            measures=measures,
            elapsed_s=elapsed,
        )
    for pos, task in enumerate(tasks):
        result.add(task, [verdicts[pos]])
    return result
