"""A composed task before it is code: a chain of catalogue operators and how to run it.

Each ``Link`` is one catalogue spec re-derived at the shape the running tensor has there. The
first link's tensor arguments are all drawn; a later link feeds the running tensor into its
``main`` argument and draws its other tensor arguments (a second operand, an index, a mask, a
target). A drawn float tensor that does not follow the batch, other than the first, is held
as a parameter (``weight_names``), an integer or bool one as a buffer where the chain holds
them (``buffer_names``, ``compose.hold_integer_operands``); every other drawn tensor is a task
input. A batch-sized operand may instead be a value the chain already computed (``reuses``,
``compose.reuse_share``): its input, an earlier link's result or, for an attention, the
running tensor itself, transposed where only that fits; a bool one such a value compared
with zero. A link whose operator returns several tensors (``topk``, ``nn.LSTM``,
``max(dim)``) continues on the element at ``pick``; the last link may return the whole tuple
instead. ``execute`` runs a chain on real or meta tensors, so the same code path solves
shapes, measures cost and checks values; the renderer (``synth.emit``) writes the same calls
as source.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from opsynth.synth.catalog.probe import build, make_tensor, value_of
from opsynth.synth.catalog.spec import CatalogSpec, InputSpec
from opsynth.synth.constants import combined
from opsynth.synth.cost import Cost, counted_as_length, uncounted
from opsynth.synth.reuse import derived

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Link:
    """One operator of a chain: the spec as called, which argument is the running tensor
    (``main``; None for the first link), the task-input name of every other tensor argument,
    and the path to the element the chain continues on (``()`` for a tensor output).
    ``combine``: for a constructor composed as a constant operand (``synth.constants``), the
    operator applying its tensor to the running tensor; empty for every other link.
    ``reuses``: operands (by their ``expanded`` names) that are not drawn but take a value of
    the chain, each with its source: ``j`` is the tensor entering link ``j`` (0: the chain's
    first input), up to this link's own running tensor; and how the operand derives from it
    (``synth.reuse.derived``: "" the value itself, a comparison with zero, a transpose)."""

    seed_id: str
    spec: CatalogSpec
    main: int | None
    inputs: tuple[str | None, ...]
    pick: tuple[int, ...] = ()
    combine: str = ""
    reuses: tuple[tuple[str, int, str], ...] = ()

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class Chain:
    """A solved chain at one batch size. ``returns_tuple``: the task returns the last link's
    whole output. ``batch_dims`` maps each task input to the dims that are the batch.
    ``cost``: one forward's cost at ``batch`` as the solver measured it link by link (None
    when unknown, e.g. after a rebatch). ``container``: the module or parameter holder the
    task is written with (``synth.containers``), listed after the links' operators.
    ``holds_integers``: integer and bool operands that do not follow the batch are held as
    buffers (``buffer_names``) rather than drawn by ``get_inputs``."""

    links: tuple[Link, ...]
    batch: int
    returns_tuple: bool = False
    batch_dims: dict[str, tuple[int, ...]] = field(default_factory=dict, hash=False)
    cost: Cost | None = field(default=None, hash=False, compare=False)
    container: str | None = None
    holds_integers: bool = False

    @property
    def ops(self) -> list[str]:
        names = [link.name for link in self.links]
        return names + [self.container] if self.container else names

    def input_specs(self) -> dict[str, InputSpec]:
        """Task inputs in call order, each a single tensor's spec."""
        found: dict[str, InputSpec] = {}
        for link in self.links:
            for name, arg in expanded(link):
                found.setdefault(name, arg)
        return found


def weight_names(chain: Chain) -> set[str]:
    """Inputs that are float tensors independent of the batch (a weight, a bias-like vector,
    a scalar operand), the chain's first input excepted: the task holds them as parameters, as
    hand-written tasks do (``F.conv1d(x, self.weight)``, ``x / self.scale``), rather than
    asking every call for them."""
    return {name for name, arg in _batch_free(chain) if arg.dtype == "float32"}


def buffer_names(chain: Chain) -> set[str]:
    """With ``chain.holds_integers``, the integer and bool tensors independent of the batch
    (an index, a small mask), the first input excepted: a parameter cannot hold them, so the
    task registers them as buffers, which follow the model to its device as an index passed
    at init or held by the model does in hand-written tasks."""
    if not chain.holds_integers:
        return set()
    return {
        name
        for name, arg in _batch_free(chain)
        if arg.dtype != "float32" and not hasattr(torch.nn.Module, name)  # register_buffer refuses
    }


def held_names(chain: Chain) -> set[str]:
    """Every drawn tensor the model holds instead of taking it as an input."""
    return weight_names(chain) | buffer_names(chain)


def _batch_free(chain: Chain) -> list[tuple[str, InputSpec]]:
    drawn = [(name, arg) for link in chain.links for name, arg in expanded(link)]
    return [(name, arg) for name, arg in drawn[1:] if not chain.batch_dims.get(name)]


def expanded(link: Link, with_reused: bool = False) -> list[tuple[str, InputSpec]]:
    """The task inputs one link draws: a tensor argument is one input, a tensor-list argument
    one input per element (``name_0``, ``name_1``...), the running tensor none of them, and
    no operand the link takes from the chain (``reuses``) unless ``with_reused``."""
    out = []
    for i, (arg, name) in enumerate(zip(link.spec.args, link.inputs, strict=True)):
        if not arg.tensor or name is None:
            continue
        if arg.count:
            first = 1 if i == link.main else 0
            out += [(f"{name}_{j}", replace(arg, count=0)) for j in range(first, arg.count)]
        else:
            out.append((name, arg))
    if with_reused or not link.reuses:
        return out
    reused = {name for name, _, _ in link.reuses}
    return [(name, arg) for name, arg in out if name not in reused]


def reuse_sources(links: Sequence[Link]) -> set[int]:
    """The links whose entering tensor a later link takes again (``Link.reuses``): the task
    keeps it under a name of its own before that link overwrites it."""
    return {j for k, link in enumerate(links) for _, j, _ in link.reuses if j < k}


def without_link(chain: Chain, i: int) -> Chain:
    """``chain`` less link ``i``, its reuse sources renumbered: a value that entered a later
    link now enters the one before, and the value link ``i`` produced is the one it took."""

    def moved(j: int) -> int:
        return j - 1 if j > i else j

    links = [
        replace(link, reuses=tuple((name, moved(j), how) for name, j, how in link.reuses))
        for k, link in enumerate(chain.links)
        if k != i
    ]
    return replace(chain, links=tuple(links))


def follow(out: Any, path: Sequence[int]) -> Any:
    for i in path:
        out = out[i]
    return out


def continuation(out: Any) -> tuple[int, ...] | None:
    """The path to the element a chain continues on: the output itself when it is a tensor,
    else the largest floating tensor inside it (an LSTM's sequence output, topk's values),
    else the largest tensor of any dtype; None when there is no tensor at all."""
    if isinstance(out, torch.Tensor):
        return ()
    best: tuple[tuple[bool, int], tuple[int, ...]] | None = None
    for path, t in _tensor_paths(out, ()):
        key = (t.dtype.is_floating_point, t.numel())
        if best is None or key > best[0]:
            best = (key, path)
    return best[1] if best is not None else None


def _tensor_paths(out: Any, prefix: tuple[int, ...]):
    if isinstance(out, torch.Tensor):
        yield prefix, out
    elif isinstance(out, tuple | list):
        for i, item in enumerate(out):
            yield from _tensor_paths(item, (*prefix, i))


def layout(out: Any) -> tuple[tuple[int, ...], ...]:
    """Where the tensors sit in an output: a tensor's is ``((),)``, a pair's ``((0,), (1,))``."""
    return tuple(path for path, _ in _tensor_paths(out, ()))


def tensors_in(out: Any) -> list[torch.Tensor]:
    return [t for _, t in _tensor_paths(out, ())]


def draw_inputs(
    chain: Chain, device: str, generator: torch.Generator | None = None
) -> dict[str, Any]:
    """Every task input as ``get_inputs()`` draws it (a list for a tensor-list argument)."""
    return {name: make_tensor(arg, device, generator) for name, arg in chain.input_specs().items()}


def build_callables(links: Sequence[Link], device: str) -> list[Any]:
    """The module or function each link calls, built on ``device`` (modules in train mode, as
    the filters run them)."""
    return [build(link.spec, device) for link in links]


def call_link(link: Link, fn: Any, running: Any, inputs: Mapping[str, Any]) -> Any:
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for i, (arg, name) in enumerate(zip(link.spec.args, link.inputs, strict=True)):
        if arg.tensor and arg.count and name is not None:
            value = [
                running if (i == link.main and j == 0) else inputs[f"{name}_{j}"]
                for j in range(arg.count)
            ]
        elif i == link.main:
            value = running
        elif name is not None:
            value = inputs[name]
        else:
            value = value_of(arg.value)
        if arg.keyword:
            kwargs[arg.name] = value
        else:
            args.append(value)
    if link.combine:  # a constant built where the running tensor is, then applied to it
        return combined(link.combine, running, fn(*args, device=running.device, **kwargs))
    if isinstance(fn, torch.nn.RNNBase) and args and getattr(args[0], "is_meta", False):
        return _recurrent_on_meta(fn, args, kwargs)
    return fn(*args, **kwargs)


def _recurrent_on_meta(fn: torch.nn.RNNBase, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """A recurrent module's output on meta from a few time steps: on meta, torch unrolls the
    sequence into per-step cell ops in Python, which made recurrent chains the slowest part of
    composing. The output's shape only depends on the sequence length through its time dim,
    and its cost is a fixed part plus the length times a step's (``counted_as_length``)."""
    sequence = args[0]
    time_dim = 1 if fn.batch_first and sequence.dim() == 3 else 0
    steps = sequence.shape[time_dim] if sequence.dim() else 0
    if steps <= 3:
        return fn(*args, **kwargs)

    with uncounted():
        short = {n: sequence.narrow(time_dim, 0, n).contiguous() for n in (2, 3)}

    def run(length: int) -> Any:
        return fn(short[length], *args[1:], **kwargs)

    def widen(short: Any) -> Any:
        output, hidden = short
        shape = list(output.shape)
        shape[time_dim] = steps
        return output.new_empty(shape), hidden

    return counted_as_length(run, steps, widen)


def execute(
    chain: Chain, callables: Sequence[Any], inputs: Mapping[str, Any], trace: list | None = None
) -> Any:
    """The chain's output on ``inputs``; ``trace`` collects (running in, continued out) per link."""
    running: Any = None
    out: Any = None
    entering: list[Any] = []  # the tensor entering each link; the first input for link 0
    for k, (link, fn) in enumerate(zip(chain.links, callables, strict=True)):
        entering.append(running if k else first_input(link, inputs))
        if link.reuses:
            inputs = {**inputs, **reused_operands(link, entering)}
        out = call_link(link, fn, running, inputs)
        following = follow(out, link.pick)
        if trace is not None:
            trace.append((running, following))
        running = following
    return out if chain.returns_tuple else running


def reused_operands(link: Link, entering: Sequence[Any]) -> dict[str, Any]:
    """The operands a link takes from the chain, by name, from the tensors that entered each
    link up to it (``Link.reuses``)."""
    return {name: derived(entering[j], how) for name, j, how in link.reuses}


def first_input(link: Link, inputs: Mapping[str, Any]) -> Any:
    """The chain's first input: the first tensor the first link draws (a reuse's source 0)."""
    drawn = expanded(link)
    return inputs.get(drawn[0][0]) if drawn else None
