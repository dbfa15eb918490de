"""The torch seed library: every nn class, functional and torch function, derived and probed.

For each introspected operator: screen it by name (sparse, quantized, CUDA-only...), derive
candidate argument sets per input rank (``synth.catalog.derive``, or ``overrides.OVERRIDES``),
keep the first set that runs on the meta device, then run it once on CPU and switch the input
to a positive range if random normal inputs give NaN (log, sqrt) or are refused (BCELoss).
The same argument choice is replayed at every other rank on meta, so a seed records every
rank it accepts and the output shape at each: the shape-function evidence a composer needs.
``seeds.added_overrides`` adds the tables written after catalogues were made
(``overrides.ADDED_OVERRIDES``, ``overrides.UNSCREENED``), ``seeds.condition_overrides`` those
written after it (``overrides.CONDITION_OVERRIDES``); off, an extraction derives what one made
before them did.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch

from opsynth.config import SeedsConfig
from opsynth.synth.catalog import derive, introspect, probe
from opsynth.synth.catalog.introspect import Entry, Param
from opsynth.synth.catalog.overrides import (
    ADDED_OVERRIDES,
    CONDITION_OVERRIDES,
    NO_FORWARD,
    NOT_OPERATORS,
    OVERRIDES,
    PROBE_SHAPES,
    RANK_ORDER,
    SCREEN,
    SUFFIX_RANKS,
    UNSCREENED,
    Shape,
)
from opsynth.synth.catalog.spec import CatalogSpec, InputSpec

Table = dict[str, dict[str, Any]]

LIBRARY = "torch"
STOCHASTIC_NAMES = ("dropout", "rrelu", "rand", "normal", "bernoulli", "multinomial", "poisson")
# Uniform input ranges tried, in order, when random normal inputs give NaN or inf.
POSITIVE_RANGES = ((0.1, 0.9), (1.1, 2.1))


class TorchCatalog:
    """The torch adapter of the seed-library plugin API."""

    name = LIBRARY

    def __init__(self, config: SeedsConfig | None = None) -> None:
        config = config if config is not None else SeedsConfig()
        self.only = frozenset(config.operators)
        self.added = config.added_overrides
        self.conditions = config.condition_overrides

    def specs(self) -> Iterator[CatalogSpec]:
        seen: set[str] = set()
        entries = (
            introspect.nn_entries()
            + introspect.functional_entries()
            + introspect.torch_entries()
            + introspect.operator_entries()
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for entry in entries:
                if entry.name not in seen and (not self.only or entry.name in self.only):
                    seen.add(entry.name)
                    yield derive_spec(entry, self.added, self.conditions)


def override_table(added: bool, conditions: bool = False) -> Table:
    """The argument tables a derivation reads: the first ones, with
    ``seeds.added_overrides`` those added after catalogues were made, and with
    ``seeds.condition_overrides`` those added after that."""
    table = {**OVERRIDES, **ADDED_OVERRIDES} if added else OVERRIDES
    return {**table, **CONDITION_OVERRIDES} if conditions else table


def screen(entry: Entry, added: bool) -> str:
    low = entry.name.lower()
    for fragment, reason in SCREEN:
        if fragment in low and not (added and entry.name in UNSCREENED):
            return reason
    if entry.name in NO_FORWARD:
        return "no_forward"
    if entry.kind == "module" and not issubclass(entry.obj, torch.nn.Module):
        return "not_an_operator"
    if entry.name.startswith(NOT_OPERATORS):
        return "not_an_operator"
    return ""


def base_flags(entry: Entry) -> tuple[str, ...]:
    short = entry.name.rpartition(".")[2].lower()
    flags = []
    if _names_stochastic(short):
        flags.append("stochastic")
    if short.endswith("_") and not short.endswith("__"):
        flags.append("inplace")
    return tuple(flags)


def _names_stochastic(short: str) -> bool:
    """``dropout2d``, ``randn_like``, ``normal`` draw random numbers; ``normalize`` does not
    (``normal`` must be a whole word of the name)."""
    return "normal" in short.split("_") or any(
        key in short for key in STOCHASTIC_NAMES if key != "normal"
    )


def _rejected(entry: Entry, reason: str, detail: str = "") -> CatalogSpec:
    return CatalogSpec(LIBRARY, entry.name, entry.kind, entry.target, reason=reason, detail=detail)


def rank_order(entry: Entry, table: Table) -> tuple[int, ...]:
    override = table.get(entry.name, {})
    if "ranks" in override:
        return override["ranks"]
    for suffix, ranks in SUFFIX_RANKS.items():
        if entry.name.lower().endswith(suffix):
            return ranks
    return RANK_ORDER


def _token(value: Any, shape: Shape) -> Any:
    sizes = {"B": shape[0], "C": shape[1] if len(shape) > 1 else shape[0], "L": shape[-1]}
    if isinstance(value, str) and value.endswith(tuple(sizes)) and value[:-1].isdigit():
        return int(value[:-1]) * sizes[value[-1]]
    return sizes.get(value, value) if isinstance(value, str) else value


def override_args(entry: Entry, shape: Shape, table: Table) -> tuple[InputSpec, ...]:
    args = []
    for name, value, *rest in table[entry.name]["args"]:
        options = dict(rest[0]) if rest else {}
        keyword = options.pop("keyword", False)
        if "high" in options:  # an index in range of a dim (``C``) follows that dim
            options["high"] = _token(options["high"], shape)
        if value == "x" or isinstance(value, tuple):
            dims = shape if value == "x" else tuple(_token(v, shape) for v in value)
            args.append(InputSpec(name, dims, keyword=keyword, **options))
        else:
            args.append(InputSpec(name, tensor=False, value=_token(value, shape), keyword=keyword))
    return tuple(args)


def _init_params(entry: Entry) -> list[Param]:
    params = introspect.signature_params(entry.obj.__init__) or []
    return [p for p in params if p.type != "Tensor[]"]


def _forward_params(entry: Entry) -> list[Param]:
    params = introspect.signature_params(entry.obj.forward) or []
    return [p for p in params if p.name != "self"]


def proposals(entry: Entry, shape: Shape, table: Table) -> Iterator[CatalogSpec]:
    """Candidate specs for one input shape, cheapest guesses first."""
    base = CatalogSpec(LIBRARY, entry.name, entry.kind, entry.target, flags=base_flags(entry))
    override = table.get(entry.name, {})
    init_sets: list[tuple] = [((), ())]
    if entry.kind == "module":
        init_sets = _init_sets(entry, shape, override)
    if "args" in override:
        arg_sets: list[tuple] = [override_args(entry, shape, table)]
    elif entry.kind in ("operator", "method"):
        arg_sets = [(InputSpec("x", shape), InputSpec("y", shape))]
        if entry.target == "@":
            arg_sets.append((InputSpec("x", shape), InputSpec("y", shape[:-2] + shape[:-3:-1])))
    else:
        arg_sets = []
    for hints in (False, True):
        if not arg_sets:
            for params in _param_lists(entry):
                arg_sets += list(derive.candidates(params, shape, hints))
        for init, init_kwargs in init_sets:
            for args in arg_sets:
                yield replace(base, init=init, init_kwargs=init_kwargs, args=args)
        if "args" in override or entry.kind in ("operator", "method"):
            return
        arg_sets = []


def _param_lists(entry: Entry) -> list[list[Param]]:
    if entry.kind == "module":
        return [_forward_params(entry)]
    return introspect.entry_params(entry)


def _init_sets(entry: Entry, shape: Shape, override: dict) -> list[tuple]:
    """(positional init, keyword init) pairs: required parameters by name or type, then the
    same with the optional hints (``Upsample(scale_factor=2.0)``, ``Softmax(dim=1)``)."""
    if "init" in override:
        init = tuple((name, _token(value, shape)) for name, value in override["init"])
        return [(init, tuple(override.get("init_kwargs", ())))]
    params = _init_params(entry)
    options = []
    for p in params:
        if p.required:
            values = derive.scalar_options(p, shape)
            if not values:
                return []
            options.append([(p.name, v) for v in values])
    required = list(itertools.islice(itertools.product(*options), 8))
    hints = tuple(
        (p.name, derive.scalar_options(p, shape)[0])
        for p in params
        if not p.required and p.name in derive.OPTIONAL_HINTS
    )
    return [(init, ()) for init in required] + ([(i, hints) for i in required] if hints else [])


def _data_dependent(exc: Exception) -> bool:
    """Meta tensors hold no data: ops whose output shape depends on values (nonzero, unique,
    one_hot) refuse them, and only a CPU run can say whether the arguments are right."""
    text = str(exc).lower()
    return isinstance(exc, NotImplementedError) or "meta" in text or "data-dependent" in text


def try_spec(spec: CatalogSpec) -> tuple[list[list[int]] | None, str]:
    """Output shapes and where they were found (``meta``, or ``cpu`` for data-dependent
    shapes); ``non_tensor`` when the call works but returns no tensor."""
    where = "meta"
    try:
        out = probe.call(spec, "meta")
    except Exception as exc:  # an operator may raise anything on bad arguments
        if not _data_dependent(exc):
            return None, ""
        try:
            out, where = probe.call(spec, "cpu"), "cpu"
        except Exception:
            return None, ""
    try:
        return probe.output_shapes(out), where
    except TypeError:
        return None, "non_tensor"


def _finite_on_cpu(spec: CatalogSpec) -> bool:
    try:
        out = probe.call(spec, "cpu")
    except Exception:
        return False  # maybe a domain error (BCELoss wants [0, 1]); positive inputs are tried
    return all(torch.isfinite(t).all() for t in probe.tensors_of(out) if t.dtype.is_floating_point)


def _positive(spec: CatalogSpec, low_high: tuple[float, float]) -> CatalogSpec:
    args = list(spec.args)
    for i, arg in enumerate(args):
        if arg.tensor and arg.dtype == "float32":
            args[i] = replace(arg, uniform=low_high)
    return replace(spec, args=tuple(args))


def derive_spec(entry: Entry, added: bool, conditions: bool = False) -> CatalogSpec:
    """The first proposal that runs (``added``: ``seeds.added_overrides``; ``conditions``:
    ``seeds.condition_overrides``), or the rejection."""
    reason = screen(entry, added)
    if reason:
        return _rejected(entry, reason)
    table = override_table(added, conditions)
    if entry.kind == "function" and not introspect.entry_params(entry) and entry.name not in table:
        return _rejected(entry, "no_signature", "neither an aten schema nor a Python signature")
    tried, non_tensor = 0, False
    for rank in rank_order(entry, table):
        for index, spec in enumerate(proposals(entry, PROBE_SHAPES[rank], table)):
            tried += 1
            shapes, where = try_spec(spec)
            non_tensor = non_tensor or where == "non_tensor"
            if shapes is None:
                continue
            spec = _make_finite(spec)
            ranks = _other_ranks(entry, rank, index, shapes, table)
            evidence = {"ranks": ranks, "probe_rank": rank, "shape_source": where}
            return replace(spec, evidence=evidence)
    if non_tensor:
        return _rejected(entry, "not_an_operator", "runs, but returns no tensor")
    if tried == 0:
        return _rejected(entry, "no_signature", "no argument set could be derived")
    return _rejected(entry, "probe_failed", f"none of {tried} argument sets ran")


def _make_finite(spec: CatalogSpec) -> CatalogSpec:
    if _finite_on_cpu(spec):
        return spec
    for low_high in POSITIVE_RANGES:
        positive = _positive(spec, low_high)
        if _finite_on_cpu(positive):
            return positive
    return spec


def _other_ranks(entry: Entry, rank: int, index: int, shapes: list, table: Table) -> dict[str, Any]:
    """Replay the chosen argument set (same proposal index) at every probe rank, on meta, or
    at the ranks an override says the operator accepts."""
    found = {str(rank): {"input": list(PROBE_SHAPES[rank]), "output": shapes}}
    accepts = table.get(entry.name, {}).get("accepts", tuple(PROBE_SHAPES))
    for other in sorted(PROBE_SHAPES):
        if other == rank or other not in accepts:
            continue
        for i, spec in enumerate(proposals(entry, PROBE_SHAPES[other], table)):
            if i == index:
                out, _ = try_spec(spec)
                if out is not None:
                    found[str(other)] = {"input": list(PROBE_SHAPES[other]), "output": out}
                break
    return found


def entry_of(spec: CatalogSpec) -> Entry:
    """The introspection entry a validated spec came from, rebuilt from its target."""
    if spec.kind == "operator":
        obj = None
    elif spec.kind == "method":
        obj = getattr(torch.Tensor, spec.target, None)
    else:
        obj = probe.resolve(spec.target)
    return Entry(spec.name, spec.kind, spec.target, obj)


def _call(spec: CatalogSpec) -> tuple:
    """What a spec calls, without the input ranges ``_make_finite`` may have chosen."""
    return (spec.init, spec.init_kwargs, tuple(replace(a, uniform=None) for a in spec.args))


def table_of(spec: CatalogSpec, entry: Entry) -> Table:
    """The tables a seed was derived with. An operator the added tables cover came from them
    when their first proposal at the seed's own input shape is the seed's call; otherwise it
    was derived without them (``seeds.added_overrides`` or ``seeds.condition_overrides`` off,
    where a torch version lets the derived set run)."""
    main = next((a for a in spec.args if a.tensor), None)
    if main is None:
        return OVERRIDES
    for extra, flags in ((ADDED_OVERRIDES, (True, False)), (CONDITION_OVERRIDES, (False, True))):
        if spec.name not in extra:
            continue
        table = override_table(*flags)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            first = next(proposals(entry, main.shape, table), None)
        if first is not None and _call(first) == _call(spec):
            return table
    return OVERRIDES


def rebind(spec: CatalogSpec, shape: Shape, limit: int) -> list[CatalogSpec]:
    """Up to ``limit`` argument sets for the same operator with its first tensor argument of
    ``shape``: the derivation that validated the seed, replayed at another shape. Input ranges
    the seed needed (a positive range for log) carry over by argument name."""
    entry = entry_of(spec)
    table = table_of(spec, entry)
    ranges = {a.name: a.uniform for a in spec.args if a.uniform is not None}
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for candidate in itertools.islice(proposals(entry, shape, table), limit):
            args = candidate.args
            if ranges:
                args = tuple(
                    replace(a, uniform=ranges[a.name])
                    if a.name in ranges and a.tensor and a.dtype == "float32"
                    else a
                    for a in candidate.args
                )
            found.append(replace(candidate, args=args, flags=spec.flags))
    return found
