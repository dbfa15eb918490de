"""The offline composer: chains of seed operators, sized and rendered, never executed.

For each wanted task it draws a data source from ``cfg.mix`` (``synth.sampling``): for
``torch#k`` it draws k seeds by weight, preferring op sequences not produced before (in
earlier rounds, passed as ``produced``, or in this call), and solves the chain's arguments and
shapes on the ``meta`` device (``synth.shapes``); for ``transformers`` it passes an unused
transformers seed through as is. Draws that would be degenerate (an identity, a constant
output, an overflow, an op another op erases) are refused by the seeds' value rules and
redrawn. Everything is driven by one RNG seeded from ``(cfg.seed, round_index)``, so the same
inputs always give the same tasks.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Iterable, Sequence

import synth
from opsynth.config import ComposeConfig
from opsynth.record import Task
from synth.render import render_task
from synth.sampling import TRANSFORMERS, Sampler, chain_length, split_seeds
from synth.seeds import spec_of
from synth.shapes import solve_chain
from synth.spec import Degenerate, SeedSpec

COMPOSER = "offline"
COMPOSER_VERSION = synth.__version__

log = logging.getLogger(__name__)


def compose(
    seeds: list[Task],
    cfg: ComposeConfig,
    n: int,
    round_index: int = 0,
    config_hash: str = "",
    produced: Iterable[Sequence[str]] = (),
) -> list[Task]:
    """n distinct composed tasks from seed tasks (as made by ``synth.seeds.seed_tasks``).

    Raises ValueError for unusable seeds or mix, and RuntimeError if ``cfg.max_attempts``
    draws cannot produce a new valid chain of some drawn length.
    """
    if n < 0:
        raise ValueError(f"compose needs n >= 0, got {n}")
    if not seeds:
        raise ValueError("compose needs at least one seed task")
    drawer = _Drawer(seeds, cfg, round_index, config_hash, produced)
    tasks = [drawer.draw(source) for source in drawer.sampler.sources(n)]
    log.debug("composed %d tasks; rejected draws: %s", n, dict(drawer.rejected))
    return tasks


def standalone_task(seed: Task, composer: str, config_hash: str, meta: dict) -> Task:
    """A transformers seed as a task of its own: same code and id, this composer's provenance."""
    return Task(
        ops=list(seed.ops),
        data_source=seed.data_source,
        code=seed.code,
        seed_ids=[seed.id],
        composer=composer,
        composer_version=COMPOSER_VERSION,
        config_hash=config_hash,
        meta={**meta, "standalone": True, "adapters": []},
    )


class _Drawer:
    """The state of one compose call: the RNG, what was drawn so far, why draws failed."""

    def __init__(
        self,
        seeds: Sequence[Task],
        cfg: ComposeConfig,
        round_index: int,
        config_hash: str,
        produced: Iterable[Sequence[str]],
    ) -> None:
        chainable, standalone = split_seeds(seeds)
        self.seeds = chainable
        self.specs: list[SeedSpec] = [spec_of(task) for task in chainable]
        self.cfg = cfg
        self.round_index = round_index
        self.config_hash = config_hash
        self.rng = random.Random(f"opsynth.compose:{cfg.seed}:{round_index}")
        self.sampler = Sampler(chainable, standalone, cfg, self.rng, produced)
        self.seen_ids: set[str] = set()
        self.rejected: Counter[str] = Counter()

    def draw(self, source: str) -> Task:
        if source == TRANSFORMERS:
            seed = self.sampler.standalone_seed()
            if seed is not None:
                self.sampler.mark(seed.ops)
                meta = {"novel_ops": True, "attempts": 1, "round": self.round_index}
                return standalone_task(seed, COMPOSER, self.config_hash, meta)
            self.rejected["transformers_exhausted"] += 1
            source = self.sampler.fallback_source()
        return self.draw_chain(chain_length(source))

    def draw_chain(self, k: int) -> Task:
        cfg, specs = self.cfg, self.specs
        for attempt in range(cfg.max_attempts):
            picks, ops = self.sampler.pick(k)
            novel = self.sampler.is_new(ops)
            if not novel and attempt < cfg.novelty_attempts:
                self.rejected["seen_ops"] += 1
                continue
            try:
                chain = solve_chain([specs[i] for i in picks], self.rng, cfg)
            except Degenerate as exc:
                self.rejected[exc.reason] += 1
                continue
            task = render_task(
                chain,
                seed_ids=[self.seeds[i].id for i in picks],
                composer=COMPOSER,
                composer_version=COMPOSER_VERSION,
                config_hash=self.config_hash,
                meta={"novel_ops": novel, "attempts": attempt + 1, "round": self.round_index},
            )
            if task.id in self.seen_ids:
                self.rejected["duplicate"] += 1
                continue
            self.sampler.mark(ops)
            self.seen_ids.add(task.id)
            return task
        raise RuntimeError(
            f"compose: no new valid {k}-op chain in {cfg.max_attempts} draws "
            f"(rejections: {dict(self.rejected)}); add seeds or raise compose.max_attempts"
        )
