"""What to compose next: a data source drawn from the mix, then seed ops drawn by weight.

Both composers (offline and LLM) sample through this module, so the released Ops-6K mix
(``torch#k`` = k chained seed ops, ``transformers`` = a transformers seed kept standalone) and
the per-op weights mean the same thing whichever writes the code; and the mix can be checked
over thousands of draws without solving or asking for a single chain.

Op weights come from ``compose.profile``: ``ops6k`` (the default) weighs each catalogue
operator by how many released tasks use it, moves the share of released names the catalogue
lacks to the catalogue operators of the same category (``opsynth.taxonomy``), and gives every
other catalogue operator ``compose.profile_floor`` so the whole catalogue is reachable;
``uniform`` weighs all alike; a path names a profile file of the same format. Operators that
fail to solve more often than others would drift below their share, so each draw's weight is
scaled by how far the operator is behind its target share (at most ``MAX_BOOST``-fold).

An op sequence already produced (earlier rounds, earlier draws of this call) is redrawn up to
``compose.novelty_attempts`` times, so no sequence repeats while unseen ones remain.
"""

from __future__ import annotations

import functools
import logging
import random
import re
from collections.abc import Iterable, Sequence

from opsynth.config import ComposeConfig
from opsynth.record import Task
from opsynth.synth.containers import CONTAINERS, without_container

TRANSFORMERS = "transformers"
_TORCH_KEY = re.compile(r"torch#([1-9][0-9]*)")
MAX_BOOST = 8.0
CATEGORY_BOOST = 16.0
REWEIGH_EVERY = 8
log = logging.getLogger(__name__)


def is_standalone(seed: Task) -> bool:
    """Transformers seeds are whole model blocks: they are kept as they are, never chained."""
    library = (seed.meta.get("seed") or {}).get("library", "")
    return seed.data_source.startswith(TRANSFORMERS) or library == TRANSFORMERS


def seed_name(seed: Task) -> str:
    return (seed.meta.get("seed") or {}).get("name") or seed.ops[0]


def chain_length(source: str) -> int:
    """``torch#3`` -> 3; raises ValueError for anything that is not a chain source."""
    match = _TORCH_KEY.fullmatch(source)
    if match is None:
        raise ValueError(f"compose.mix key {source!r} is neither torch#k (k >= 1) nor transformers")
    return int(match.group(1))


def effective_mix(
    mix: dict[str, float], *, chains: bool = True, standalone: bool = True
) -> dict[str, float]:
    """The configured mix, validated, without the sources the seed set cannot supply (no
    transformers seeds: that share goes to the torch#k keys in proportion), normalised."""
    usable: dict[str, float] = {}
    dropped: list[str] = []
    for source, weight in mix.items():
        if weight < 0:
            raise ValueError(f"compose.mix weight for {source!r} is negative ({weight})")
        available = standalone if source == TRANSFORMERS else (chain_length(source) and chains)
        if available:
            usable[source] = weight
        elif weight > 0:
            dropped.append(source)
    total = sum(usable.values())
    if total <= 0:
        raise ValueError(
            "compose.mix has no positive weight on a source these seeds can supply; "
            "give a torch#k key weight > 0"
        )
    if dropped:
        log.info(
            "compose.mix: no seeds for %s; re-normalised over %s", dropped, sorted(usable.keys())
        )
    ordered = sorted(usable.items(), key=lambda kv: (kv[0] == TRANSFORMERS, kv[0]))
    return {source: weight / total for source, weight in ordered}


@functools.lru_cache(maxsize=8)
def _profile(spec: str):
    """The profile ``compose.profile`` names, read once per process (every chunk's sampler
    and both weightings use it)."""
    from opsynth.profile import load_profile

    return load_profile(spec)


def profile_arguments(cfg: ComposeConfig) -> dict:
    """The optional keyword arguments ``cfg.profile`` counts per operator (``{}`` for the
    uniform profile or one written before they were counted)."""
    profile = _profile(cfg.profile)
    return profile.arguments if profile is not None else {}


def container_weights(cfg: ComposeConfig) -> dict[str, float]:
    """How often ``cfg.profile``'s set names each container (``synth.containers``), the
    weights a chain's container is drawn by; alike without a profile."""
    profile = _profile(cfg.profile)
    if profile is None:
        return dict.fromkeys(CONTAINERS, 1.0)
    return {name: float(profile.ops.get(name, 0)) for name in CONTAINERS}


def profile_weights(names: Sequence[str], cfg: ComposeConfig) -> list[float]:
    """The base draw weight of each name under ``cfg.profile`` and ``cfg.op_weights``. With
    ``compose.container_share`` the profile's containers are drawn as containers, so their
    counts weigh no catalogue operator (not even a catalogue seed of the same name)."""
    from opsynth.taxonomy import category

    profile = _profile(cfg.profile)
    if profile is None:
        weights = [1.0] * len(names)
    else:
        present = set(names)
        drawn_apart = set(CONTAINERS) if cfg.container_share > 0 else set()
        profiled = {n: c for n, c in profile.ops.items() if n not in drawn_apart}
        counts = {n: float(c) for n, c in profiled.items() if n in present}
        missing: dict[str, float] = {}
        for name, count in profiled.items():
            if name not in present:
                missing[category(name)] = missing.get(category(name), 0.0) + count
        by_category: dict[str, list[str]] = {}
        for name in dict.fromkeys(names):
            by_category.setdefault(category(name), []).append(name)
        for cat, mass in missing.items():
            # to the category's profiled operators in proportion; the uncategorised share
            # (containers, factories) to every catalogue operator outside the categories
            members = [n for n in by_category.get(cat, []) if n in counts and cat != "other"]
            if members:
                total = sum(counts[n] for n in members)
                for n in members:
                    counts[n] += mass * counts[n] / total
            else:
                for n in by_category.get(cat, []):
                    counts[n] = counts.get(n, 0.0) + mass / len(by_category[cat])
        floor, named = cfg.profile_floor, cfg.profile_min_weight
        weights = [max(counts[n], named) if n in counts else floor for n in names]
    return [w * cfg.op_weights.get(n, 1.0) for w, n in zip(weights, names, strict=True)]


def _behind(wanted: float, got: int) -> float:
    """How strongly to favour a category: wanted over produced tasks to the fifth power
    (within ``CATEGORY_BOOST`` either way). Categories whose operators solve less often
    (convolutions: memory and runtime refusals) or that fill any later link (activations)
    drift from their share under a linear pull (benchmarks/compose_variety.py shows it)."""
    return min(CATEGORY_BOOST, max(1 / CATEGORY_BOOST, ((wanted + 1) / (got + 1)) ** 5))


def _category_targets(names: Sequence[str], cfg: ComposeConfig):
    """The profile's share of tasks per category (empty without a profile), and each name's
    category."""
    from opsynth.taxonomy import category

    profile = _profile(cfg.profile)
    categories = [category(n) for n in names]
    if profile is None:
        return {}, categories
    present = set(categories)
    return {
        c: t for c, t in profile.categories.items() if c in present and c != "other"
    }, categories


class Sampler:
    """Seeded draws of sources and op sequences over one seed set.

    ``chainable`` are the seeds ops are drawn from, ``standalone`` the transformers seeds;
    ``produced`` the op sequences made before this call.
    """

    def __init__(
        self,
        chainable: Sequence[Task],
        standalone: Sequence[Task],
        cfg: ComposeConfig,
        rng: random.Random,
        produced: Iterable[Sequence[str]] = (),
    ) -> None:
        self.chainable, self.standalone = list(chainable), list(standalone)
        self.cfg, self.rng = cfg, rng
        self.names = [seed_name(s) for s in self.chainable]
        self.base = profile_weights(self.names, cfg) if self.names else []
        total = sum(self.base)
        self.share = [w / total for w in self.base] if total > 0 else []
        self.got = [0] * len(self.names)
        self.picked = 0
        self.category_target, self.categories = _category_targets(self.names, cfg)
        self.category_got: dict[str, int] = {}
        self.tasks_marked = 0
        self.weights = list(self.base)
        self.mix = effective_mix(cfg.mix, chains=total > 0, standalone=bool(self.standalone))
        self.produced: set[tuple[str, ...]] = {tuple(ops) for ops in produced}
        self.used_names = {name for ops in self.produced for name in ops}
        self._count_produced()
        if cfg.container_share > 0:  # a task with a container stands for its operators too
            self.produced |= {without_container(ops) for ops in self.produced}
        unknown = sorted(set(cfg.op_weights) - set(self.names))
        if unknown:
            log.info("compose.op_weights names ops not in the seed set: %s", unknown)

    def _count_produced(self) -> None:
        """Start the category shares from the chains produced before this sampler (earlier
        rounds, other chunks when redrawing), so a later draw makes up what they lack."""
        if not self.category_target:
            return
        known = set(self.names)
        index = {name: i for i, name in enumerate(self.names)}
        for ops in self.produced:
            ops = tuple(name for name in ops if name in known or name not in CONTAINERS)
            if ops and all(name in known for name in ops):
                self._count_task([index[name] for name in ops])
        if self.tasks_marked:
            self._reweigh()

    def sources(self, n: int) -> list[str]:
        """n data sources drawn independently from the effective mix."""
        return self.rng.choices(list(self.mix), weights=list(self.mix.values()), k=n)

    def chain_sources(self) -> dict[str, float]:
        return {s: w for s, w in self.mix.items() if s != TRANSFORMERS}

    def fallback_source(self) -> str:
        """A torch#k source, for a transformers draw when every transformers seed is used."""
        chains = self.chain_sources()
        if not chains:
            raise RuntimeError(
                "compose: every transformers seed is used and the mix has no torch#k"
            )
        return self.rng.choices(list(chains), weights=list(chains.values()))[0]

    def pick(self, k: int) -> tuple[list[int], tuple[str, ...]]:
        """k chainable seed indices drawn by weight (with replacement) and their op names."""
        picks = self.rng.choices(range(len(self.names)), weights=self.weights, k=k)
        return picks, tuple(self.names[i] for i in picks)

    def pick_among(self, indices: Sequence[int]) -> int | None:
        """One index of ``indices`` drawn by weight; None when none has weight."""
        weights = [self.weights[i] for i in indices]
        if not indices or sum(weights) <= 0:
            return None
        return self.rng.choices(indices, weights=weights)[0]

    def pick_novel(self, k: int) -> tuple[list[int], tuple[str, ...], bool]:
        """Like ``pick`` but redrawn up to ``cfg.novelty_attempts`` times while the sequence
        was already produced; the flag says whether the result is new."""
        picks, ops = self.pick(k)
        for _ in range(self.cfg.novelty_attempts):
            if ops not in self.produced:
                return picks, ops, True
            picks, ops = self.pick(k)
        return picks, ops, ops not in self.produced

    def unused(self) -> list[int]:
        """Chainable seeds whose operator no produced sequence contains."""
        return [i for i, name in enumerate(self.names) if name not in self.used_names]

    def is_new(self, ops: Sequence[str]) -> bool:
        return tuple(ops) not in self.produced

    def mark(self, ops: Sequence[str], picks: Sequence[int] = ()) -> None:
        """Record a produced sequence (and, given its seed indices, their share so far)."""
        self.produced.add(tuple(ops))
        self.used_names.update(ops)
        if picks:
            self._count_task(picks)
        for i in picks:
            self.got[i] += 1
            self.picked += 1
            if self.picked % REWEIGH_EVERY == 0:
                self._reweigh()

    def _count_task(self, picks: Sequence[int]) -> None:
        """One more task, in every category its seeds fall in."""
        self.tasks_marked += 1
        for category in {self.categories[i] for i in picks}:
            self.category_got[category] = self.category_got.get(category, 0) + 1

    def _reweigh(self) -> None:
        """Scale each operator by how far it and its category are behind their targets."""
        total, tasks = self.picked, self.tasks_marked
        factor = {
            c: _behind(t * tasks, self.category_got.get(c, 0))
            for c, t in self.category_target.items()
        }
        self.weights = [
            base * min(MAX_BOOST, (share * total + 1) / (got + 1)) * factor.get(category, 1.0)
            for base, share, got, category in zip(
                self.base, self.share, self.got, self.categories, strict=True
            )
        ]

    def standalone_seed(self) -> Task | None:
        """A transformers seed not yet produced (drawn uniformly), or None when all are."""
        fresh = [s for s in self.standalone if tuple(s.ops) not in self.produced]
        return self.rng.choice(fresh) if fresh else None


def split_seeds(seeds: Sequence[Task]) -> tuple[list[Task], list[Task]]:
    """(chainable, standalone) seeds, each list in the given order."""
    chainable = [s for s in seeds if not is_standalone(s)]
    standalone = [s for s in seeds if is_standalone(s)]
    return chainable, standalone
