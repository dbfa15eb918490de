"""The offline composer: chains of catalogue operators, solved, checked and rendered.

For each wanted task it draws a data source from ``cfg.mix`` (``synth.sampling``): for
``torch#k`` it draws k catalogue seeds by weight (k - 1 and a container that holds their
modules or parameters for ``compose.container_share`` of them: ``synth.containers``),
preferring op sequences not produced before, solves their arguments and shapes on the
``meta`` device (``synth.solve``), fits the batch to the cost read off the chain
(``synth.cost``), and runs the chain once on a small CPU sample to refuse degenerate values
(``synth.degenerate``); for ``transformers`` it passes an unused transformers seed through,
with its batch as a ``batch_size`` to size (``synth.standalone``).
Everything is driven by one RNG seeded from ``(cfg.seed, round_index)``, so the same seeds and
config always give the same tasks.
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing
import os
import random
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

import torch

from opsynth import synth
from opsynth.config import ComposeConfig
from opsynth.record import Task
from opsynth.synth.catalog.serialize import spec_from_json
from opsynth.synth.chain import Chain
from opsynth.synth.constants import is_constant
from opsynth.synth.containers import draw_container, may_hold
from opsynth.synth.cost import fit_batch
from opsynth.synth.degenerate import Degenerate, check_sample
from opsynth.synth.emit import render_task
from opsynth.synth.sampling import (
    TRANSFORMERS,
    Sampler,
    chain_length,
    container_weights,
    seed_name,
    split_seeds,
)
from opsynth.synth.solve import VECTOR_BATCH, Seed, Solver, is_dropout, rebatch
from opsynth.synth.standalone import with_batch_knob
from opsynth.taxonomy import category

COMPOSER = "offline"
UNBATCHED_RANK = {"1d": 2, "2d": 3, "3d": 4}
UNUSED_ATTEMPTS = 4  # draws of a single-operator task spent on operators no chain has used
CONTAINER_ATTEMPTS = 20  # draws of a chain with a container before it is drawn without one
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
    """n distinct composed tasks from catalogue seed tasks (``seeds.parquet`` rows).

    The wanted sources are cut into chunks of ``cfg.chunk_size``, each composed with its own
    RNG (so the result does not depend on how many processes ran them) in up to
    ``cfg.workers`` processes; a task or op sequence two chunks both made is kept once and
    replaced by a draw that knows every chunk's sequences.

    Raises ValueError for unusable seeds or mix, and RuntimeError if ``cfg.max_attempts``
    draws cannot produce a new valid chain of some drawn length.
    """
    if n < 0:
        raise ValueError(f"compose needs n >= 0, got {n}")
    if not seeds:
        raise ValueError("compose needs at least one seed task")
    produced = [tuple(ops) for ops in produced]
    sources = _Drawer(seeds, cfg, round_index, config_hash, produced).sampler.sources(n)
    sources = with_containers(sources, cfg, round_index)
    chunks = [sources[i : i + cfg.chunk_size] for i in range(0, n, cfg.chunk_size)]
    tasks: list[Task] = []
    seen_ids: set[str] = set()
    seen_ops: set[tuple[str, ...]] = set(produced)

    def keep(made: list[Task], by_ops: bool) -> list[str]:
        """Add the tasks not made before; the sources of the others, to draw again (a task
        with a container from its marked source, so it is drawn with one again)."""
        again = []
        for task in made:
            repeated = by_ops and not task.meta.get("standalone") and tuple(task.ops) in seen_ops
            if task.id in seen_ids or repeated:
                again.append(task.data_source + (CONTAINED if "container" in task.meta else ""))
                continue
            seen_ids.add(task.id)
            seen_ops.add(tuple(task.ops))
            tasks.append(task)
        return again

    common = (cfg, round_index, config_hash)
    workers = min(len(chunks), cfg.workers or os.cpu_count() or 1)
    with _chunk_runner(seeds, workers) as run:
        jobs = [(*common, produced, c, part) for c, part in enumerate(chunks)]
        redraw = [source for made in run(jobs) for source in keep(made, by_ops=True)]
        # A draw that met a task or sequence another chunk made is drawn again, knowing every
        # chunk's sequences, in parts of a fixed size (so the result does not depend on the
        # process count); the last round accepts a repeated sequence when no new one is left.
        for attempt in range(REDRAW_ROUNDS):
            if not redraw:
                break
            last = attempt == REDRAW_ROUNDS - 1
            known = sorted(seen_ops)
            parts = [redraw[i : i + REDRAW_PART] for i in range(0, len(redraw), REDRAW_PART)]
            if last:
                parts = [redraw]
            jobs = [(*common, known, f"redraw{attempt}.{i}", part) for i, part in enumerate(parts)]
            redraw = [source for made in run(jobs) for source in keep(made, by_ops=not last)]
    return tasks


REDRAW_ROUNDS = 3
REDRAW_PART = 25
_WORKER_SEEDS: list[Task] = []


def _set_worker_seeds(seeds: list[Task]) -> None:
    """A compose process receives the seeds once, not with every chunk."""
    _WORKER_SEEDS[:] = seeds


@contextlib.contextmanager
def _chunk_runner(seeds: list[Task], workers: int):
    """A function running chunk jobs in order: in a pool of spawned processes that keeps its
    memoised solves across chunks and redraw rounds, or here for one worker."""
    if workers <= 1:
        yield lambda jobs: [_compose_chunk(job, seeds) for job in jobs]
        return
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        workers, mp_context=context, initializer=_set_worker_seeds, initargs=(seeds,)
    ) as pool:
        yield lambda jobs: list(pool.map(_compose_chunk, jobs))


def _compose_chunk(job: tuple, seeds: list[Task] | None = None) -> list[Task]:
    cfg, round_index, config_hash, produced, chunk, sources = job
    seeds = _WORKER_SEEDS if seeds is None else seeds
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the sample checks' sums then do not depend on the host
    try:
        with warnings.catch_warnings():  # operators' own warnings on sample values
            warnings.simplefilter("ignore")
            drawer = _Drawer(seeds, cfg, round_index, config_hash, produced, chunk=chunk)
            tasks = [drawer.draw(source) for source in sources]
    finally:
        torch.set_num_threads(threads)
    log.debug("chunk %s: %d tasks; rejected draws: %s", chunk, len(tasks), dict(drawer.rejected))
    return tasks


# A source drawn with a container: ``torch#2+container`` is one operator and a container.
CONTAINED = "+container"


def with_containers(sources: list[str], cfg: ComposeConfig, round_index: int) -> list[str]:
    """The sources with ``compose.container_share`` of those of two or more operators marked
    to be drawn with a container, from an RNG of their own (the draws of a run without
    containers stay as they were). The mark stays with a draw another chunk repeated, so
    the share holds where popular operator-and-container pairs meet across chunks."""
    if cfg.container_share <= 0:
        return sources
    rng = random.Random(f"opsynth.containers:{cfg.seed}:{round_index}")
    return [
        s + CONTAINED
        if s != TRANSFORMERS and chain_length(s) > 1 and rng.random() < cfg.container_share
        else s
        for s in sources
    ]


def standalone_task(seed: Task, composer: str, config_hash: str, meta: dict) -> Task:
    """A transformers seed as a task of its own: its code with the batch as a ``batch_size``
    the sizing stage scales (``synth.standalone``), this composer's provenance."""
    return Task(
        ops=list(seed.ops),
        data_source=seed.data_source,
        code=with_batch_knob(seed.code),
        seed_ids=[seed.id],
        composer=composer,
        composer_version=COMPOSER_VERSION,
        config_hash=config_hash,
        meta={**meta, "standalone": True},
    )


def composable(seed: Task) -> Seed | None:
    """The solver's view of a catalogue seed; None for seeds without a usable spec (stochastic
    or in-place operators, or seed rows written before specs were recorded)."""
    info = seed.meta.get("seed") or {}
    flags = set(info.get("flags", []))
    if "spec" not in info or "inplace" in flags:
        return None
    if "stochastic" in flags and not is_dropout(seed_name(seed)):
        return None  # dropout is composed at p=0 (synth.solve.NO_DROP)
    ranks = tuple(sorted(int(r) for r in (info.get("ranks") or {}))) or (
        (len(info["input_shapes"][0]),) if info.get("input_shapes") else ()
    )
    spec = spec_from_json(info["spec"])
    suffix = spec.name[-2:].lower()
    if category(spec.name) == "conv" and suffix in UNBATCHED_RANK:
        # An unbatched input (C, H, W) to a 2-d convolution makes the task's batch dim its
        # channels: the weight would be sized for one batch, so only batched ranks chain.
        ranks = tuple(r for r in ranks if r != UNBATCHED_RANK[suffix])
    main = next((a for a in spec.args if a.tensor), None)
    dtypes = frozenset(a.dtype for a in spec.args if a.tensor)
    returns_tuple = len(info.get("output_shapes") or []) > 1
    main_dtype = main.dtype if main is not None else ""
    probe_rank = int(info.get("probe_rank") or 0)
    return Seed(seed.id, spec, ranks, main_dtype, dtypes, returns_tuple, probe_rank)


class _Drawer:
    """The state of one compose call: the RNG, what was drawn so far, why draws failed."""

    def __init__(
        self,
        seeds: Sequence[Task],
        cfg: ComposeConfig,
        round_index: int,
        config_hash: str,
        produced: Iterable[Sequence[str]],
        chunk: int | str = 0,
    ) -> None:
        chainable, standalone = split_seeds(seeds)
        usable = [(task, composable(task)) for task in chainable]
        usable = [(task, seed) for task, seed in usable if seed is not None and seed.ranks]
        self.seeds = [seed for _, seed in usable]
        self.cfg = cfg
        self.round_index = round_index
        self.config_hash = config_hash
        self.rng = random.Random(f"opsynth.compose:{cfg.seed}:{round_index}:{chunk}")
        self.sampler = Sampler([t for t, _ in usable], standalone, cfg, self.rng, produced)
        self.solver = Solver(cfg, self.rng)
        self.seen_ids: set[str] = set()
        self.rejected: Counter[str] = Counter()
        self.index = {seed.id: i for i, seed in enumerate(self.seeds)}
        self._fits: dict[tuple[int, str], list[int]] = {}
        self.container_weights = container_weights(cfg)
        self.holders = [i for i, seed in enumerate(self.seeds) if may_hold(seed.spec)]

    def draw(self, source: str) -> Task:
        contained = source.endswith(CONTAINED)
        source = source.removesuffix(CONTAINED)
        if source == TRANSFORMERS:
            seed = self.sampler.standalone_seed()
            if seed is not None:
                self.sampler.mark(seed.ops)
                meta = {"novel_ops": True, "attempts": 1, "round": self.round_index}
                return standalone_task(seed, COMPOSER, self.config_hash, meta)
            self.rejected["transformers_exhausted"] += 1
            source = self.sampler.fallback_source()
        return self.draw_chain(chain_length(source), contained)

    def _rank(self, seed: Seed) -> int:
        weights = self.cfg.rank_weights
        ranks = [r for r in seed.ranks if weights.get(r, 0) > 0] or list(seed.ranks)
        bonus = self.cfg.probe_rank_bonus
        odds = [(weights.get(r, 0) or 1) * (bonus if r == seed.probe_rank else 1) for r in ranks]
        return self.rng.choices(ranks, weights=odds)[0]

    def _compatible(self, rank: int, dtype: str, tuples: bool = False) -> list[int]:
        """Seeds that can take a running tensor of this rank and dtype (by the ranks and
        tensor dtypes their validation recorded); only tuple-returning ones with ``tuples``.
        A tensor constructor takes no tensor: with ``compose.constant_operands`` it is a
        constant operand of a float one (``synth.constants``)."""
        key = (rank, dtype, tuples)
        constants = self.cfg.constant_operands and dtype == "float32"
        if key not in self._fits:
            self._fits[key] = [
                i
                for i, seed in enumerate(self.seeds)
                if rank in seed.ranks
                and (dtype in seed.dtypes or (constants and is_constant(seed.spec)))
                and (seed.returns_tuple or not tuples)
            ]
        return self._fits[key]

    def _propose(self, first: int, k: int, tuple_end: bool):
        draws = self.cfg.link_draws

        def propose(position: int, rank: int, dtype: str):
            if position == 0:
                yield self.seeds[first]
                return
            fits = self._compatible(rank, dtype, tuple_end and position == k - 1)
            for _ in range(draws):
                i = self.sampler.pick_among(fits)
                if i is None:
                    return
                yield self.seeds[i]

        return propose

    def draw_chain(self, k: int, contained: bool = False) -> Task:
        """A new valid chain of k operators; ``contained``: k - 1 and a container that holds
        their modules or parameters (``synth.containers``), while one fits."""
        cfg = self.cfg
        tuples = [i for i, seed in enumerate(self.seeds) if seed.returns_tuple]
        for attempt in range(cfg.max_attempts):
            if contained and attempt == CONTAINER_ATTEMPTS:
                contained = False  # these seeds rarely give a chain a container fits
            k_links = k - 1 if contained else k
            tuple_end = bool(tuples) and self.rng.random() < cfg.tuple_output_share
            first = self.sampler.pick_among(tuples) if tuple_end and k_links == 1 else None
            if first is None and k_links == 1 and contained:
                # one operator and a container: an operator that can hold one, and no task
                # has computed alone yet (with or without a container)
                names = self.sampler.names
                fresh = [i for i in self.holders if self.sampler.is_new((names[i],))]
                first = self.sampler.pick_among(fresh or self.holders)
            elif first is None and k_links == 1 and attempt < UNUSED_ATTEMPTS:
                # a single-operator task goes to an operator no chain has used yet, so the
                # operators chains rarely fit (complex or boolean outputs) appear at least once
                first = self.sampler.pick_among(self.sampler.unused())
            if first is None:  # no tuple end wanted, or none of those seeds may be drawn
                tuple_end = tuple_end and k_links > 1
                first = self.sampler.pick_among(range(len(self.seeds)))
            if first is None:
                break
            try:
                propose = self._propose(first, k_links, tuple_end)
                chain = self.solver.grow(k_links, self._rank(self.seeds[first]), propose)
            except Degenerate as exc:
                self.rejected[exc.reason] += 1
                continue
            if contained:
                container = draw_container(chain, self.rng, self.container_weights)
                if container is None:
                    self.rejected["no_container_fits"] += 1
                    continue
                chain = replace(chain, container=container)
            ops = chain.ops
            # a chain with a container computes what its operators alone do: new if both are
            novel = self.sampler.is_new(ops) and not (
                chain.container and not self.sampler.is_new(ops[:-1])
            )
            if not novel and attempt < cfg.novelty_attempts:
                self.rejected["seen_ops"] += 1
                continue
            try:
                chain = self._finish(chain, tuple_end)
            except Degenerate as exc:
                self.rejected[exc.reason] += 1
                continue
            meta = {"novel_ops": novel, "attempts": attempt + 1, "round": self.round_index}
            task = self._render(chain, meta)
            if task.id in self.seen_ids:
                self.rejected["duplicate"] += 1
                continue
            self.sampler.mark(ops, [self.index[link.seed_id] for link in chain.links])
            if chain.container:
                self.sampler.mark(ops[:-1])
            self.seen_ids.add(task.id)
            return task
        raise RuntimeError(
            f"compose: no new valid {k}-op chain in {cfg.max_attempts} draws "
            f"(rejections: {dict(self.rejected)}); add seeds or raise compose.max_attempts"
        )

    def _finish(self, chain: Chain, tuple_end: bool) -> Chain:
        """Decide a tuple return, read the cost off the chain on meta (refusing what would
        not fit in memory even at the sample's batch), check the values on the sample, then
        fit the batch."""
        if tuple_end and chain.links[-1].pick:
            chain = replace(chain, returns_tuple=True)
        cfg = self.cfg
        cost = chain.cost
        assert cost is not None, "the solver measures every chain it grows"
        largest_input = max(
            (math.prod(a.shape) / 1e6 for a in chain.input_specs().values()), default=0.0
        )
        if largest_input > cfg.max_input_melems or cost.largest_melems > cfg.max_tensor_melems:
            raise Degenerate("memory", "tensors too large even at the sample's batch")
        check_sample(chain, cfg)
        if chain.batch == VECTOR_BATCH:  # a rank-1 input: its length is the batch
            cfg = cfg.model_copy(
                update={"batch_range": (cfg.batch_range[0], cfg.max_vector_length)}
            )
        batch = fit_batch(cost, largest_input, chain.batch, cfg)
        scale = batch / chain.batch
        est_ms = cost.ms(cfg) * scale
        low, high = cfg.forward_window_ms
        if largest_input * scale > cfg.max_input_melems * 1.01:
            raise Degenerate("memory", f"inputs too large even at batch {batch}")
        if cost.largest_melems * scale > cfg.max_tensor_melems * 1.01:
            raise Degenerate("memory", f"tensors too large even at batch {batch}")
        if not low <= est_ms <= high:
            raise Degenerate("runtime", f"estimated {est_ms:.3g} ms at batch {batch}")
        return rebatch(chain, batch)

    def _render(self, chain: Chain, meta: dict) -> Task:
        return render_task(
            chain,
            composer=COMPOSER,
            composer_version=COMPOSER_VERSION,
            config_hash=self.config_hash,
            meta=meta,
        )
