"""The offline composer: chains of seed operators, sized and rendered, never executed.

For each wanted task it draws a chain length k from ``cfg.mix`` (keys ``torch#k``), then k
seeds uniformly, preferring op sequences not yet drawn in this call, and solves the chain's
arguments and shapes on the ``meta`` device (``synth.shapes``). Draws that would be degenerate
(an identity, a constant output, an overflow, an op another op erases) are refused by the
seeds' value rules and redrawn. Everything is driven by one RNG seeded from
``(cfg.seed, round_index)``, so the same inputs always give the same tasks.
"""

from __future__ import annotations

import logging
import random
import re
from collections import Counter
from collections.abc import Sequence

import synth
from opsynth.config import ComposeConfig
from opsynth.record import Task
from synth.render import render_task
from synth.seeds import spec_of
from synth.shapes import solve_chain
from synth.spec import Degenerate, SeedSpec

COMPOSER = "offline"
COMPOSER_VERSION = synth.__version__

_MIX_KEY = re.compile(r"torch#([1-9][0-9]*)")
log = logging.getLogger(__name__)


def parse_mix(mix: dict[str, float]) -> dict[int, float]:
    """``{"torch#2": 0.4, ...}`` -> ``{2: 0.4, ...}``; other keys are not ours to compose."""
    sizes: dict[int, float] = {}
    for key, weight in mix.items():
        match = _MIX_KEY.fullmatch(key)
        if match is None:
            raise ValueError(
                f"compose.mix key {key!r} is not torch#k (k >= 1); "
                "the offline composer only chains torch seeds"
            )
        if weight < 0:
            raise ValueError(f"compose.mix weight for {key!r} is negative ({weight})")
        sizes[int(match.group(1))] = weight
    if not sizes or sum(sizes.values()) <= 0:
        raise ValueError("compose.mix has no positive weight; give at least one torch#k > 0")
    return dict(sorted(sizes.items()))


def draw_sizes(rng: random.Random, mix: dict[str, float], n: int) -> list[int]:
    """n chain lengths drawn independently from the mix."""
    sizes = parse_mix(mix)
    return rng.choices(list(sizes), weights=list(sizes.values()), k=n)


def compose(
    seeds: list[Task],
    cfg: ComposeConfig,
    n: int,
    round_index: int = 0,
    config_hash: str = "",
) -> list[Task]:
    """n distinct composed tasks from seed tasks (as made by ``synth.seeds.seed_tasks``).

    Raises ValueError for unusable seeds or mix, and RuntimeError if ``cfg.max_attempts``
    draws cannot produce a new valid chain of some drawn length.
    """
    if n < 0:
        raise ValueError(f"compose needs n >= 0, got {n}")
    if not seeds:
        raise ValueError("compose needs at least one seed task")
    drawer = _Drawer(seeds, cfg, round_index, config_hash)
    tasks = [drawer.draw(k) for k in draw_sizes(drawer.rng, cfg.mix, n)]
    log.debug("composed %d tasks; rejected draws: %s", n, dict(drawer.rejected))
    return tasks


class _Drawer:
    """The state of one compose call: the RNG, what was drawn so far, why draws failed."""

    def __init__(
        self, seeds: Sequence[Task], cfg: ComposeConfig, round_index: int, config_hash: str
    ) -> None:
        self.seeds = list(seeds)
        self.specs: list[SeedSpec] = [spec_of(task) for task in seeds]
        self.cfg = cfg
        self.round_index = round_index
        self.config_hash = config_hash
        self.rng = random.Random(f"opsynth.compose:{cfg.seed}:{round_index}")
        self.seen_ops: set[tuple[str, ...]] = set()
        self.seen_ids: set[str] = set()
        self.rejected: Counter[str] = Counter()

    def draw(self, k: int) -> Task:
        cfg, specs = self.cfg, self.specs
        for attempt in range(cfg.max_attempts):
            picks = [self.rng.randrange(len(specs)) for _ in range(k)]
            ops = tuple(specs[i].name for i in picks)
            novel = ops not in self.seen_ops
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
            self.seen_ops.add(ops)
            self.seen_ids.add(task.id)
            return task
        raise RuntimeError(
            f"compose: no new valid {k}-op chain in {cfg.max_attempts} draws "
            f"(rejections: {dict(self.rejected)}); add seeds or raise compose.max_attempts"
        )
