"""What to compose next: a data source drawn from the mix, then seed ops drawn by weight.

Both composers (offline and LLM) sample through this module, so the released Ops-6K mix
(``torch#k`` = k chained seed ops, ``transformers`` = a transformers seed kept standalone) and
the per-op weights mean the same thing whichever writes the code; and the mix can be checked
over thousands of draws without solving or asking for a single chain.

Op sequences already produced (earlier rounds of a run, earlier draws of this call) are
avoided for ``cfg.novelty_attempts`` draws before a repeat is allowed, so a run spreads over
the op space instead of re-asking for the same combination.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Iterable, Sequence

from opsynth.config import ComposeConfig
from opsynth.record import Task

TRANSFORMERS = "transformers"
_TORCH_KEY = re.compile(r"torch#([1-9][0-9]*)")
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


class Sampler:
    """Seeded draws of sources and op sequences over one seed set.

    ``chainable`` are the seeds ops are drawn from (by ``cfg.op_weights``, default 1.0 each),
    ``standalone`` the transformers seeds; ``produced`` the op sequences made before this call.
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
        self.weights = [cfg.op_weights.get(name, 1.0) for name in self.names]
        has_chains = sum(self.weights) > 0
        self.mix = effective_mix(cfg.mix, chains=has_chains, standalone=bool(self.standalone))
        self.produced: set[tuple[str, ...]] = {tuple(ops) for ops in produced}
        unknown = sorted(set(cfg.op_weights) - set(self.names))
        if unknown:
            log.info("compose.op_weights names ops not in the seed set: %s", unknown)

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

    def pick_novel(self, k: int) -> tuple[list[int], tuple[str, ...], bool]:
        """Like ``pick`` but redrawn up to ``cfg.novelty_attempts`` times while the sequence
        was already produced; the flag says whether the result is new."""
        picks, ops = self.pick(k)
        for _ in range(self.cfg.novelty_attempts):
            if ops not in self.produced:
                return picks, ops, True
            picks, ops = self.pick(k)
        return picks, ops, ops not in self.produced

    def is_new(self, ops: Sequence[str]) -> bool:
        return tuple(ops) not in self.produced

    def mark(self, ops: Sequence[str]) -> None:
        self.produced.add(tuple(ops))

    def standalone_seed(self) -> Task | None:
        """A transformers seed not yet produced (drawn uniformly), or None when all are."""
        fresh = [s for s in self.standalone if tuple(s.ops) not in self.produced]
        return self.rng.choice(fresh) if fresh else None


def split_seeds(seeds: Sequence[Task]) -> tuple[list[Task], list[Task]]:
    """(chainable, standalone) seeds, each list in the given order."""
    chainable = [s for s in seeds if not is_standalone(s)]
    standalone = [s for s in seeds if is_standalone(s)]
    return chainable, standalone
