"""Shape solving: re-derive each operator at the running tensor's shape and run it on meta.

A chain is solved greedily at a small batch: draw the input rank and shape, then for each
operator try its re-derived argument sets (``synth.catalog.rebind``) in a seeded order, with
free sizes and attributes varied (``VARIED``), and keep the first whose meta call works and
whose main input has the running tensor's dtype. The same choices are then replayed at a
second batch size: an argument or shape that changed with the batch is the batch (rendered as
``batch_size``), anything else that changed makes the chain impossible to resize and refuses
it. Only catalogue operators run here, on meta tensors (on small CPU samples where meta has
no kernel: ``compose.sampled_shapes``); generated code never does.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from opsynth.config import ComposeConfig
from opsynth.synth.catalog.probe import build, make_tensor
from opsynth.synth.catalog.rebind import main_index, rebind
from opsynth.synth.catalog.spec import CatalogSpec, InputSpec
from opsynth.synth.chain import (
    Chain,
    Link,
    call_link,
    continuation,
    expanded,
    first_input,
    follow,
    layout,
    reused_operands,
    tensors_in,
)
from opsynth.synth.constants import COMBINE, is_constant, sized
from opsynth.synth.cost import Cost, cost_of, counting, total
from opsynth.synth.degenerate import Degenerate, is_dropout
from opsynth.synth.implicit_dim import implicit_dim, names_dim
from opsynth.synth.optional_args import draw_optional
from opsynth.synth.reuse import Reuse, draw_reuses, fits_again, named, operand_slots
from opsynth.synth.sampling import profile_arguments
from opsynth.synth.sorting import stable_sort

# Sample batches: the chain is solved at SOLVE_BATCH and replayed at REPLAY_BATCH; the dims
# that differ are the batch. Rank-1 inputs are all batch, so theirs are longer.
SOLVE_BATCH, REPLAY_BATCH = 2, 3
VECTOR_BATCH, VECTOR_REPLAY = 64, 96
# Keyword/constructor arguments whose value may vary freely, with the menu key of
# ``ComposeConfig`` they draw from (sizes) or a literal menu (attributes).
VARIED: dict[str, str | tuple[Any, ...]] = {
    "out_features": "feature_sizes",
    "out_channels": "channel_sizes",
    "hidden_size": "feature_sizes",
    "embedding_dim": "feature_sizes",
    "num_embeddings": "feature_sizes",
    "kernel_size": (1, 2, 3, 4, 5, 7),
    "stride": (1, 2),
    "padding": (0, 1, 2),
    "dilation": (1, 2),
    "k": (1, 2, 4, 8),
    "reduction": ("mean", "sum", "none"),
    "negative_slope": (0.01, 0.1, 0.2),
    "p": (1.0, 2.0),
    "eps": (1e-5, 1e-6),
    "num_layers": (1, 2),
    "scale_factor": (2.0, 0.5),
    "chunks": (2, 3, 4),
    "diagonal": (-1, 0, 1),
    "shifts": (1, 2, 3),
}
# A loss (or any operator taking ``reduction``) that reduces to a scalar is tried unreduced:
# the catalogue records only required arguments, so the default mean would otherwise end the
# chain, and a mean over a sized batch barely differs between inputs (indistinguishable).
UNREDUCED = ("reduction", "none")
# An operator that splits along its default dim 0 (``unbind``) splits the batch: the task would
# have as many outputs as its batch, which sizing grows into the thousands. It is tried along
# dim 1 instead, as the released set writes it; the replay refuses any that still follows it.
# A reduction to a scalar is tried along dim 1 too (``compose.full_reduction_share``).
ALONG_DIM_1 = ("dim", 1)
# Dropout is composed with p=0: an identity, as the released set keeps it, and deterministic.
NO_DROP = ("p", 0.0)
DTYPES = {torch.float32: "float32", torch.int64: "int64", torch.bool: "bool"}
# The most elements (inputs and parameters) a link solved on CPU samples may hold
# (``compose.sampled_shapes``): the solver's batch keeps most links far below it.
SAMPLE_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class Seed:
    """A catalogue seed as the solver needs it: its id, validated spec, the input ranks it
    accepts and the dtype of its first tensor argument."""

    id: str
    spec: CatalogSpec
    ranks: tuple[int, ...]
    main_dtype: str = "float32"
    dtypes: frozenset[str] = frozenset({"float32"})
    returns_tuple: bool = False
    probe_rank: int = 0


def batches(rank: int) -> tuple[int, int]:
    return (VECTOR_BATCH, VECTOR_REPLAY) if rank == 1 else (SOLVE_BATCH, REPLAY_BATCH)


def draw_shape(rank: int, rng: random.Random, cfg: ComposeConfig) -> tuple[int, ...]:
    batch = batches(rank)[0]
    if rank == 1:
        return (batch,)
    if rank == 2:
        return (batch, rng.choice(cfg.feature_sizes))
    if rank == 3:
        return (batch, rng.choice(cfg.seq_lens), rng.choice(cfg.feature_sizes[:4]))
    if rank == 4:
        side = rng.choice(cfg.spatial_sizes)
        return (batch, rng.choice(cfg.channel_sizes), side, side)
    if rank == 5:
        side = rng.choice(cfg.volume_sizes)
        return (batch, rng.choice(cfg.channel_sizes), side, side, side)
    raise ValueError(f"no input shape family for rank {rank}")


@dataclass(frozen=True)
class _Choice:
    """How one link was chosen, enough to replay it at another batch size."""

    index: int
    varied: tuple[tuple[str, Any], ...]
    pick: tuple[int, ...]
    # where the output's tensors sit: a task whose number of outputs follows the batch
    # (``unbind`` along it) cannot be resized, and sizing would give it thousands
    layout: tuple[tuple[int, ...], ...] = ()
    combine: str = ""  # a constant operand's operator (``synth.constants``)
    reuses: tuple[Reuse, ...] = ()  # operands taken from the chain (``synth.reuse``)


def _vary(spec: CatalogSpec, varied: Sequence[tuple[str, Any]]) -> CatalogSpec:
    """``spec`` with the varied values; a varied name the spec does not pass yet (see
    ``UNREDUCED``) becomes a keyword: a constructor keyword for modules, a call keyword else."""
    values = dict(varied)
    if not values:
        return spec
    init = tuple((k, values.get(k, v)) for k, v in spec.init)
    kwargs = tuple((k, values.get(k, v)) for k, v in spec.init_kwargs)
    args = tuple(
        replace(a, value=values[a.name]) if not a.tensor and a.name in values else a
        for a in spec.args
    )
    passed = {k for k, _ in (*spec.init, *spec.init_kwargs)}
    passed |= {a.name for a in spec.args if not a.tensor}
    # a name varied twice (an optional argument, then a rule of the solver's) passes once,
    # with the later value, as ``values`` has it
    extra = tuple((k, v) for k, v in values.items() if k not in passed)
    if extra and spec.kind == "module":
        kwargs += extra
    elif extra:
        args += tuple(InputSpec(k, tensor=False, value=v, keyword=True) for k, v in extra)
    return replace(spec, init=init, init_kwargs=kwargs, args=args)


def _variations(
    spec: CatalogSpec, rng: random.Random, cfg: ComposeConfig, optional: Mapping[str, Any]
) -> list[tuple]:
    """A few variations of the free arguments to try before the derived values, each with
    optional keyword arguments drawn from ``optional`` (a profile's ``arguments``, empty when
    ``compose.optional_arguments`` is off); then up to ``compose.optional_draws`` distinct
    draws of the optional ones alone; then neither."""
    names = [k for k, _ in spec.init] + [k for k, _ in spec.init_kwargs]
    names += [a.name for a in spec.args if not a.tensor]
    free = [n for n in names if n in VARIED]
    out = []
    for _ in range(cfg.variation_attempts if free else 0):
        varied = []
        for name in free:
            menu = VARIED[name]
            options = getattr(cfg, menu) if isinstance(menu, str) else menu
            varied.append((name, rng.choice(options)))
        out.append((*varied, *draw_optional(spec, optional, rng)))
    alone: list[tuple] = []
    for _ in range(cfg.optional_draws if optional else 0):
        drawn = draw_optional(spec, optional, rng)
        if drawn and drawn not in alone:
            alone.append(drawn)
    return [*out, *alone, ()]


def _link_inputs(spec: CatalogSpec, main: int | None, taken: set[str]) -> tuple:
    """Input names for a link's tensor arguments (None: a literal, or the running tensor);
    a tensor-list argument gets a name prefix even when the running tensor is its first."""
    names: list[str | None] = []
    for i, arg in enumerate(spec.args):
        if not arg.tensor or (i == main and not arg.count):
            names.append(None)
            continue
        base = "x" if main is None and not taken else _safe(arg.name)
        name, k = base, 2
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        taken.add(name)
        names.append(name)
    return tuple(names)


_RESERVED = {"x", "self", "input", "open", "type", "id", "list", "dict", "max", "min", "sum"}


def _safe(name: str) -> str:
    name = name.strip("_") or "t"
    return f"{name}_in" if name in _RESERVED or not name.isidentifier() else name


def _form(spec: CatalogSpec) -> tuple:
    """The shape of a call (which arguments it passes, by name and kind), without values:
    argument sets of the form the catalogue validated are tried first."""
    return (
        tuple(k for k, _ in spec.init),
        tuple(k for k, _ in spec.init_kwargs),
        tuple((a.name, a.tensor, a.dtype, a.keyword) for a in spec.args),
    )


def _takes_integers(spec: CatalogSpec) -> bool:
    return any(a.tensor and a.dtype in ("int64", "bool") for a in spec.args)


def _adds_input(spec: CatalogSpec, running: tuple[int, ...], first: bool = False) -> bool:
    """Whether an argument set asks for another batch-sized input besides the running
    tensor (a later link's ``main``, the first link's first tensor), rather than batch-free
    operands, which the task holds as parameters: the operands ``synth.reuse`` may fill."""
    return bool(operand_slots(spec, None if first else main_index(spec, "float32"), running))


def _main_input(link_spec: CatalogSpec, main: int | None) -> InputSpec | None:
    return link_spec.args[main] if main is not None else None


def _meta_inputs(links: Sequence[Link]) -> dict[str, Any]:
    return {name: make_tensor(arg, "meta") for link in links for name, arg in expanded(link)}


def _first_value(spec: CatalogSpec) -> Any:
    """The chain's first input as the first link ``spec`` would draw it, on meta (None for
    a constructor, which draws none)."""
    arg = next((a for a in spec.args if a.tensor), None)
    return None if arg is None else make_tensor(replace(arg, count=0), "meta")


def _try_link(
    link: Link, running: Any, inputs: dict[str, Any], sampled: bool = False
) -> tuple[Any, Cost, bool]:
    """Run one link on meta; its output, the cost of the call (not of building the module)
    and whether the output's shape follows the input's values, or Degenerate. Meta has no
    kernel for an operator whose output size is data (``masked_select``, ``nonzero``): with
    ``sampled`` (``compose.sampled_shapes``) such a link runs on CPU samples instead."""
    try:
        fn = build(link.spec, "meta")
        with counting() as counter:
            out = call_link(link, fn, running, inputs)
        varies = False
    except NotImplementedError as exc:  # no meta kernel
        if not sampled:
            raise Degenerate("shape", f"{link.name}: {str(exc)[:160]}") from exc
        try:
            out, counter, varies = _sampled_call(link, running)
        except Exception as sampled_exc:  # torch refuses these arguments on CPU too
            raise Degenerate("shape", f"{link.name}: {str(sampled_exc)[:160]}") from sampled_exc
    except Exception as exc:  # torch refuses these arguments
        raise Degenerate("shape", f"{link.name}: {str(exc)[:160]}") from exc
    if continuation(out) is None:
        raise Degenerate("bad_output", f"{link.name} returns no tensor")
    if any(t.numel() == 0 for t in tensors_in(out)):
        raise Degenerate("shape", f"{link.name} returns an empty tensor")
    return out, cost_of(counter), varies


def _sample_like(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """CPU values for a running meta tensor: indices stay in 0..1, valid for any size."""
    if t.dtype == torch.bool:
        return torch.rand(t.shape, generator=generator) > 0.5
    if t.dtype == torch.int64:
        return torch.randint(0, 2, t.shape, generator=generator)
    return torch.randn(t.shape, generator=generator)


def _sample_elements(link: Link, running: Any) -> int:
    """Elements a CPU sample of the link would hold before it runs: the running tensor, the
    link's own inputs and, for a module, its parameters (counted on meta, where they cost
    nothing)."""
    elements = running.numel() if isinstance(running, torch.Tensor) else 0
    elements += sum(math.prod(arg.shape) for _, arg in expanded(link, with_reused=True))
    if link.spec.kind == "module":
        elements += sum(p.numel() for p in build(link.spec, "meta").parameters())
    return elements


def _sampled_call(link: Link, running: Any) -> tuple[Any, Any, bool]:
    """The link run on two seeded CPU draws of its inputs (at the solver's small batch): the
    first output on meta, its cost counter, and whether the two outputs' shapes differ. Only
    catalogue operators run, as on meta; torch's global generator is left as it was. A link
    larger than ``SAMPLE_ELEMENTS`` is not run: its sample would cost the composer seconds
    and gigabytes (an adaptive softmax over 32k features builds its projections for real)."""
    if _sample_elements(link, running) > SAMPLE_ELEMENTS:
        raise ValueError(f"too large to solve on a CPU sample (over {SAMPLE_ELEMENTS} elements)")
    outputs, counters = [], []
    for draw in range(2):
        generator = torch.Generator().manual_seed(draw)
        drawn = expanded(link, with_reused=True)  # a reused operand's sample: its shape
        own = {name: make_tensor(arg, "cpu", generator) for name, arg in drawn}
        value = _sample_like(running, generator) if isinstance(running, torch.Tensor) else None
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(draw)
            fn = build(link.spec, "cpu")
            with counting() as counter:
                outputs.append(call_link(link, fn, value, own))
        counters.append(counter)
    varies = _skeleton(outputs[0]) != _skeleton(outputs[1])
    return _rebuild(_skeleton(outputs[0])), counters[0], varies


def _skeleton(out: Any) -> Any:
    """Shapes and dtypes of an output, enough to rebuild it on meta."""
    if isinstance(out, torch.Tensor):
        return ("tensor", tuple(out.shape), out.dtype)
    if isinstance(out, tuple | list):
        return ("seq", tuple(_skeleton(item) for item in out))
    return ("other",)


def _rebuild(skeleton: Any) -> Any:
    if skeleton[0] == "tensor":
        return torch.empty(skeleton[1], dtype=skeleton[2], device="meta")
    if skeleton[0] == "seq":
        return tuple(_rebuild(item) for item in skeleton[1])
    return None


@dataclass
class _State:
    """A chain being grown: its links, how each was chosen, the input names taken, the
    running tensor, the meta inputs, the cost of each link so far and the tensor that entered
    each link (the first input for the first link), which later links may take again."""

    links: list[Link] = field(default_factory=list)
    entering: list[Any] = field(default_factory=list)
    choices: list[_Choice] = field(default_factory=list)
    costs: list[Cost] = field(default_factory=list)
    taken: set[str] = field(default_factory=set)
    running: Any = None
    inputs: dict[str, Any] = field(default_factory=dict)


Propose = Callable[[int, int, str], Iterable["Seed"]]
_REBINDS: dict[tuple[int, bool], dict[tuple, list[CatalogSpec]]] = {}
_OUTPUTS: dict[bool, dict[tuple, Any]] = {}


class Solver:
    """Solves op sequences for one compose call (memoising re-derivations per shape)."""

    def __init__(self, cfg: ComposeConfig, rng: random.Random) -> None:
        self.cfg, self.rng = cfg, rng
        # Re-derivations and meta outputs depend only on their keys (and the rebind limit and
        # stable sorts), so they are kept for the life of the process, across compose calls
        # and chunks.
        self._rebinds = _REBINDS.setdefault((cfg.rebind_limit, cfg.stable_sort), {})
        self._optional = profile_arguments(cfg) if cfg.optional_arguments else {}
        self._outputs = _OUTPUTS.setdefault(cfg.sampled_shapes, {})

    def _propagate(
        self, key: tuple, link: Link, running: Any, inputs: dict[str, Any]
    ) -> tuple[Any, Cost]:
        """``_try_link`` memoised by what determines the call: the seed, the running tensor's
        shape and dtype, the argument set and its variation."""
        if key not in self._outputs:
            if len(self._outputs) > 200_000:
                self._outputs.clear()
            try:
                out, cost, varies = _try_link(link, running, inputs, self.cfg.sampled_shapes)
                self._outputs[key] = (_skeleton(out), cost, varies)
            except Degenerate as exc:
                self._outputs[key] = exc
        found = self._outputs[key]
        if isinstance(found, Degenerate):
            raise found
        return _rebuild(found[0]), found[1]

    def _varies(self, key: tuple) -> bool:
        """Whether the link ``_propagate`` solved under ``key`` has an output whose shape
        follows its input's values (solved on CPU samples that disagree)."""
        found = self._outputs.get(key)
        return isinstance(found, tuple) and found[2]

    def _rebind(self, seed: Seed, shape: tuple[int, ...]) -> list[CatalogSpec]:
        key = (seed.id, shape)
        if key not in self._rebinds:
            if len(self._rebinds) > 50_000:
                self._rebinds.clear()
            found = rebind(seed.spec, shape, self.cfg.rebind_limit)
            self._rebinds[key] = [stable_sort(s) for s in found] if self.cfg.stable_sort else found
        return self._rebinds[key]

    def solve(self, seeds: Sequence[Seed], rank: int) -> Chain:
        """The chain of exactly ``seeds``, or Degenerate."""
        return self.grow(len(seeds), rank, lambda position, rank, dtype: [seeds[position]])

    def grow(self, k: int, rank: int, propose: Propose) -> Chain:
        """A chain of ``k`` links grown one at a time: ``propose(position, rank, dtype)`` gives
        the seeds to try at each position for the running tensor's rank and dtype, so later
        operators are drawn among those that can take what the earlier ones produced."""
        shape = draw_shape(rank, self.rng, self.cfg)
        state = _State()
        seeds: list[Seed] = []
        for position in range(k):
            running = state.running
            run_rank = len(shape) if running is None else running.dim()
            dtype = "float32" if running is None else DTYPES.get(running.dtype, "")
            last = Degenerate("unsolvable", f"no operator fits rank {run_rank} {dtype}")
            for seed in propose(position, run_rank, dtype):
                try:
                    self._extend(state, seed, position, k, shape)
                except Degenerate as exc:
                    last = exc
                    continue
                seeds.append(seed)
                break
            else:
                raise last
        solved = Chain(
            tuple(state.links),
            batches(rank)[0],
            cost=total(state.costs),
            holds_integers=self.cfg.hold_integer_operands,
        )
        replayed = self._replay(seeds, state.choices, _with_batch(shape, batches(rank)[1]))
        return _with_batch_dims(solved, replayed, batches(rank))

    def _extend(self, state: _State, seed: Seed, position: int, k: int, shape) -> None:
        running = state.running
        target = shape if running is None else tuple(running.shape)
        dtype = "float32" if running is None else DTYPES.get(running.dtype)
        if position and self.cfg.constant_operands and is_constant(seed.spec):
            self._extend_constant(state, seed, target, dtype)
            return
        specs = self._rebind(seed, target)
        order = list(range(len(specs)))
        self.rng.shuffle(order)
        # the seed's validated form, written as its re-derivations are (a stable sort's flag)
        form = _form(stable_sort(seed.spec) if self.cfg.stable_sort else seed.spec)
        integer_first = not position and self.rng.random() < self.cfg.int_input_share
        fills: dict[int, tuple[Reuse, ...]] = {}
        if integer_first:
            order.sort(key=lambda i: not _takes_integers(specs[i]))
        elif self.rng.random() >= self.cfg.multi_input_share:
            # this link adds no batch-sized input: an operator that needs one is not taken
            # here unless the chain has a value for it, so the chain grows with another
            # (multi-input tasks stay as rare as drawn)
            fills = self._draw_reuses(state, specs, target, dtype, position)
            order = [
                i for i in order if i in fills or not _adds_input(specs[i], target, not position)
            ]
            order.sort(key=lambda i: _form(specs[i]) != form)
        else:  # this link may add a batch-sized input: its operands are inputs
            order.sort(key=lambda i: _form(specs[i]) != form)
        if self.cfg.explicit_dim and implicit_dim(seed.spec):
            order.sort(key=lambda i: not names_dim(specs[i]))  # stable: forms keep their order
        last = Degenerate("unsolvable", f"{seed.spec.name} has no arguments for {target}")
        if not order:
            last = Degenerate("multi_input", f"{seed.spec.name} takes another batch-sized input")
        for index in order[: self.cfg.solve_attempts]:
            base = specs[index]
            main = main_index(base, dtype) if position else None
            if position and main is None:
                continue
            main_arg = _main_input(base, main) or next((a for a in base.args if a.tensor), None)
            wanted = dtype if position else seed.main_dtype
            if main_arg is None or (main_arg.dtype != wanted and not integer_first):
                continue
            key = (seed.id, position == 0, target, dtype, index)
            reuses = fills.get(index, ())
            for varied in _variations(base, self.rng, self.cfg, self._optional):
                if is_dropout(base.name):
                    varied = (*varied, NO_DROP)
                try:
                    link, trial, out, cost = self._attempt(state, base, main, key, varied, reuses)
                except Degenerate as exc:
                    last = exc
                    continue
                if follow(out, continuation(out)).dim() == 0 and UNREDUCED[0] not in dict(varied):
                    retried = self._with(state, base, main, key, (*varied, UNREDUCED), reuses)
                    if retried is not None:  # else it takes no reduction: stays a scalar
                        link, trial, out, cost, varied = retried
                if self._along_dim_1(follow(out, continuation(out)), varied):
                    retried = self._with(state, base, main, key, (*varied, ALONG_DIM_1), reuses)
                    if retried is not None:  # else it takes no dim: stays a scalar
                        link, trial, out, cost, varied = retried
                if _splits_the_batch(out, target) and ALONG_DIM_1[0] not in dict(varied):
                    retried = self._with(state, base, main, key, (*varied, ALONG_DIM_1), reuses)
                    if retried is not None:  # else the replay at another batch refuses it
                        link, trial, out, cost, varied = retried
                path = continuation(out)
                following = follow(out, path)
                if following.dim() == 0 and position < k - 1:
                    last = Degenerate("scalar", f"{seed.spec.name} leaves a scalar mid-chain")
                    continue
                if position < k - 1 and self._varies((*key, varied)):
                    # the next link would be solved for one sample's size
                    last = Degenerate("shape", f"{seed.spec.name}'s output size is data")
                    continue
                state.taken.update(n for n in link.inputs if n)
                state.entering.append(self._values(state, link, trial)[-1])
                state.links.append(replace(link, pick=path))
                state.choices.append(_Choice(index, varied, path, layout(out), reuses=reuses))
                state.costs.append(cost)
                state.inputs, state.running = trial, following
                return
        raise last

    def _extend_constant(self, state: _State, seed: Seed, target: tuple, dtype) -> None:
        """A tensor constructor as a constant operand of a float running tensor, sized to its
        last dim and applied with an operator drawn from ``COMBINE`` (``synth.constants``);
        Degenerate when the running tensor is not float, the chain has a constant already
        (two would fold into one; Ops-6K's tasks build one) or it does not broadcast."""
        if dtype != "float32":
            raise Degenerate("unsolvable", f"{seed.spec.name} takes a float running tensor")
        if any(link.combine for link in state.links):
            raise Degenerate("unsolvable", f"{seed.spec.name}: the chain has a constant")
        combine = self.rng.choice(COMBINE)
        link, key = _constant_link(seed, target, dtype, combine)
        out, cost = self._propagate(key, link, state.running, state.inputs)
        state.entering.append(state.running)
        state.links.append(link)
        state.choices.append(_Choice(0, (), (), layout(out), combine))
        state.costs.append(cost)
        state.running = out

    def _along_dim_1(self, following: Any, varied: tuple) -> bool:
        """Whether a link that leaves a scalar is tried along dim 1: all but
        ``compose.full_reduction_share`` of them (no draw at 1, so runs composed before the
        setting compose the same)."""
        share = self.cfg.full_reduction_share
        if following.dim() != 0 or ALONG_DIM_1[0] in dict(varied) or share >= 1.0:
            return False
        return self.rng.random() >= share

    def _draw_reuses(
        self, state: _State, specs: Sequence[CatalogSpec], target: tuple, dtype, position: int
    ) -> dict[int, tuple[Reuse, ...]]:
        """With ``compose.reuse_share``, the argument sets (by index) whose batch-sized
        operands the chain can fill with its own values, each with the sources drawn
        (``synth.reuse``); empty otherwise (no draw at 0, so runs composed before the setting
        compose the same)."""
        share = self.cfg.reuse_share
        if share <= 0 or self.rng.random() >= share:
            return {}
        fills = {}
        for i, spec in enumerate(specs):
            main = main_index(spec, dtype) if position else None
            values = [*state.entering, state.running] if position else [_first_value(spec)]
            found = draw_reuses(spec, main, target, values, self.rng)
            if found:
                fills[i] = found
        return fills

    def _values(self, state: _State, link: Link, inputs: Mapping[str, Any]) -> list[Any]:
        """The tensors a link may take again: those entering each earlier link and its own
        running tensor (for the first link, its first input)."""
        if state.links:
            return [*state.entering, state.running]
        return [first_input(link, inputs)]

    def _with(self, state: _State, base: CatalogSpec, main, key: tuple, varied: tuple, reuses=()):
        """``_attempt`` with ``varied`` and ``varied`` itself, or None when it is Degenerate."""
        try:
            return (*self._attempt(state, base, main, key, varied, reuses), varied)
        except Degenerate:
            return None

    def _attempt(
        self, state: _State, base: CatalogSpec, main, key: tuple, varied: tuple, reuses=()
    ):
        """One argument variation of ``base`` as the next link, run on meta: the link, the
        meta inputs with its own, its output and its cost; or Degenerate. ``key`` names the
        seed, the running tensor and the argument set, for ``_propagate`` (a reused operand
        has the shape of the input it replaces, so the output is the same). ``reuses``: the
        operands taken from the chain."""
        spec = _vary(base, varied)
        names = _link_inputs(spec, main, set(state.taken))
        link = Link(key[0], spec, main, names, reuses=named(reuses, names))
        trial = {**state.inputs, **_meta_inputs([link])}
        if link.reuses:
            trial.update(reused_operands(link, self._values(state, link, trial)))
        return link, trial, *self._propagate((*key, varied), link, state.running, trial)

    def _replay(self, seeds: Sequence[Seed], choices: Sequence[_Choice], shape) -> list[Link]:
        links: list[Link] = []
        taken: set[str] = set()
        running: Any = None
        inputs: dict[str, Any] = {}
        entering: list[Any] = []
        for position, (seed, choice) in enumerate(zip(seeds, choices, strict=True)):
            target = shape if running is None else tuple(running.shape)
            dtype = "float32" if running is None else DTYPES.get(running.dtype)
            if choice.combine:  # sized again: a length that follows the batch is refused later
                link, key = _constant_link(seed, target, dtype, choice.combine)
                entering.append(running)
                running, _ = self._propagate(key, link, running, inputs)
                links.append(link)
                continue
            specs = self._rebind(seed, target)
            if choice.index >= len(specs):
                raise Degenerate("batch", f"{seed.spec.name} derives otherwise at another batch")
            spec = _vary(specs[choice.index], choice.varied)
            main = main_index(spec, dtype) if position else None
            names = _link_inputs(spec, main, taken)
            link = Link(seed.id, spec, main, names, choice.pick, reuses=named(choice.reuses, names))
            inputs = {**inputs, **_meta_inputs([link])}
            values = [*entering, running] if position else [first_input(link, inputs)]
            if not fits_again(choice.reuses, spec, values):
                raise Degenerate("batch", f"{seed.spec.name}: a reused operand's shape differs")
            inputs.update(reused_operands(link, values))
            entering.append(values[-1])
            key = (seed.id, position == 0, target, dtype, choice.index, choice.varied)
            out, _ = self._propagate(key, link, running, inputs)
            if layout(out) != choice.layout:
                raise Degenerate("batch", f"{seed.spec.name}: its output count follows the batch")
            try:
                running = follow(out, choice.pick)
            except (IndexError, TypeError) as exc:
                raise Degenerate(
                    "batch", f"{seed.spec.name}: output changes with the batch"
                ) from exc
            links.append(link)
        return links


def _constant_link(seed: Seed, target: tuple, dtype, combine: str) -> tuple[Link, tuple]:
    """A constructor's link as a constant operand of a running tensor of shape ``target``,
    and its key for ``Solver._propagate`` (apart from every argument set's)."""
    spec = sized(seed.spec, target)
    link = Link(seed.id, spec, None, (None,) * len(spec.args), combine=combine)
    return link, (seed.id, False, target, dtype, "constant", combine)


def _splits_the_batch(out: Any, target: tuple[int, ...]) -> bool:
    """Whether ``out`` is a sequence of one tensor per row of a batched running tensor."""
    return (
        isinstance(out, tuple | list)
        and len(target) > 1
        and len(out) == target[0]
        and all(isinstance(t, torch.Tensor) and tuple(t.shape) == target[1:] for t in out)
    )


def _with_batch(shape: tuple[int, ...], batch: int) -> tuple[int, ...]:
    return (batch, *shape[1:])


def _with_batch_dims(chain: Chain, replayed: Sequence[Link], pair: tuple[int, int]) -> Chain:
    """``chain`` with the dims of its inputs that follow the batch; Degenerate when anything
    else differs between the two batch sizes."""
    first, second = pair
    dims: dict[str, tuple[int, ...]] = {}
    links = []
    for a, b in zip(chain.links, replayed, strict=True):
        if a.spec.init != b.spec.init or a.spec.init_kwargs != b.spec.init_kwargs:
            raise Degenerate("batch", f"{a.name}: a constructor argument follows the batch")
        args = list(a.spec.args)
        for i, (x, y) in enumerate(zip(a.spec.args, b.spec.args, strict=True)):
            if not x.tensor and x.value != y.value:
                inferred = _inferred_batch(x.value, y.value, pair)
                if inferred is None:
                    raise Degenerate("batch", f"{a.name}: argument {x.name} follows the batch")
                args[i] = replace(x, value=inferred)
        a = replace(a, spec=replace(a.spec, args=tuple(args)))
        links.append(a)
        for (name, x), (_, y) in zip(expanded(a), expanded(b), strict=True):
            if len(x.shape) != len(y.shape):
                raise Degenerate("batch", f"{a.name}: input {name} changes rank with the batch")
            follows = []
            for d, (u, v) in enumerate(zip(x.shape, y.shape, strict=True)):
                if u == v:
                    continue
                if (u, v) != (first, second):
                    raise Degenerate("batch", f"{a.name}: input {name} dim {d} is not the batch")
                follows.append(d)
            if x.dtype == "int64" and x.high != y.high:
                raise Degenerate("batch", f"{a.name}: index range of {name} follows the batch")
            dims[name] = tuple(follows)
    return replace(chain, links=tuple(links), batch_dims=dims)


def _inferred_batch(first: Any, second: Any, pair: tuple[int, int]) -> Any:
    """A size list that names the batch (``reshape(x, [B, -1])``) rewritten with -1 there, so
    it holds at any batch; None when the two values differ otherwise or -1 is taken."""
    if not isinstance(first, list | tuple) or not isinstance(second, list | tuple):
        return None
    if len(first) != len(second) or -1 in first:
        return None
    out = []
    for u, v in zip(first, second, strict=True):
        if u == v:
            out.append(u)
        elif (u, v) == pair and -1 not in out:
            out.append(-1)
        else:
            return None
    return type(first)(out)


def rebatch(chain: Chain, batch: int) -> Chain:
    """The same chain with every batch dim of every input at ``batch``."""
    links = []
    for link in chain.links:
        args = list(link.spec.args)
        for i, (arg, name) in enumerate(zip(link.spec.args, link.inputs, strict=True)):
            if not arg.tensor or name is None:
                continue
            keys = [f"{name}_{j}" for j in range(arg.count)] if arg.count else [name]
            follows = next((chain.batch_dims[k] for k in keys if chain.batch_dims.get(k)), ())
            if follows:
                shape = list(arg.shape)
                for d in follows:
                    shape[d] = batch
                args[i] = replace(arg, shape=tuple(shape))
        links.append(replace(link, spec=replace(link.spec, args=tuple(args))))
    return replace(chain, links=tuple(links), batch=batch, cost=None)


def dtype_of(t: torch.Tensor) -> str:
    return DTYPES.get(t.dtype, str(t.dtype))
