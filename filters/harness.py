"""The harnesses the sandboxed runner can run, registered by name.

A harness is what a worker's child executes for one job: ``entry`` names a function
``fn(workdir, settings, emit)`` (``"package.module:function"``, imported in the child), which
reports one verdict row per stage of ``stages`` through ``emit``, each with a reason from
``reasons`` (or the runner's own codes: ``filters.reasons.OK`` and ``INFRA``). The runner
(``filters.pool``, ``filters.worker``, ``filters.protocol``) knows harnesses only through this
description, which the pool sends with every job, so a package above ``filters`` (the
evaluator) plugs in its own harness by calling ``register`` without the runner importing it.
The filters' checks are the ``filters`` harness, registered here.

Standard library only: the sandboxed worker imports this module.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opsynth.filters import reasons

# The runner writes a job's ``code`` to this file in the child's working directory.
CODE_FILE = "candidate.py"
DEFAULT = "filters"


@dataclass(frozen=True)
class Harness:
    """A sandboxed harness: its name, entry point, stages in order and reason codes."""

    name: str
    entry: str
    stages: tuple[str, ...]
    reasons: Mapping[str, str] = field(default_factory=dict)
    # ``"package.module:function"`` run in the worker, outside the child, after the child's
    # entry reported ``done`` (``filters.judge``); it alone reports the ``judged`` stages.
    judge: str = ""
    judged: tuple[str, ...] = ()

    def known(self, reason: str) -> bool:
        """Whether a row of this harness may carry ``reason``."""
        return reason == reasons.OK or reason in reasons.INFRA or reason in self.reasons

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "entry": self.entry,
            "stages": list(self.stages),
            "reasons": sorted(self.reasons),
            "judge": self.judge,
            "judged": list(self.judged),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Harness:
        return cls(
            str(data["name"]),
            str(data["entry"]),
            tuple(str(s) for s in data["stages"]),
            {str(code): "" for code in data.get("reasons", ())},
            str(data.get("judge", "")),
            tuple(str(s) for s in data.get("judged", ())),
        )

    @property
    def package(self) -> str:
        """The package (or module) of the entry point bound into the sandbox: its top-level
        name, or for opsynth's own stages the stage (``opsynth.evaluator``)."""
        parts = self.entry.partition(":")[0].split(".")
        return ".".join(parts[:2]) if parts[0] == "opsynth" and len(parts) > 2 else parts[0]

    def function(self) -> Callable[[str, dict[str, Any], Callable[[dict[str, Any]], None]], Any]:
        """The entry point, imported (in the child that runs it). It may return the request
        handlers (``filters.serve``) the child serves the judge with after ``done``."""
        return _imported(self.entry)

    def judge_function(self) -> Callable[[Any], None] | None:
        """The judge, imported (in the worker), or None for a harness whose child's rows are
        its verdicts."""
        return _imported(self.judge) if self.judge else None


def _imported(spec: str) -> Any:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


_REGISTRY: dict[str, Harness] = {}


def register(harness: Harness) -> Harness:
    """Make ``harness`` runnable by name; registering the same description again is a no-op."""
    known = _REGISTRY.get(harness.name)
    if known is not None and known != harness:
        raise ValueError(f"harness {harness.name!r} is already registered as {known.entry}")
    judged_ok = set(harness.judged) <= set(harness.stages)
    if not judged_ok or bool(harness.judged) != bool(harness.judge):
        raise ValueError(f"harness {harness.name!r}: judged stages need a judge, and are stages")
    clash = sorted(set(harness.reasons) & (set(reasons.INFRA) | {reasons.OK}))
    if clash:
        raise ValueError(f"harness {harness.name!r} redefines the runner's codes {clash}")
    _REGISTRY[harness.name] = harness
    return harness


def packages(base: tuple[str, ...]) -> tuple[str, ...]:
    """``base`` and the package of every registered harness, each once, in that order: what a
    worker started now must be able to import."""
    found = list(base)
    for harness in _REGISTRY.values():
        if harness.package not in found:
            found.append(harness.package)
    return tuple(found)


def lookup(name: str | None) -> Harness:
    """The registered harness called ``name`` (the filters' when None); ValueError otherwise."""
    harness = _REGISTRY.get(name or DEFAULT)
    if harness is None:
        raise ValueError(f"unknown harness {name!r}; registered: {', '.join(sorted(_REGISTRY))}")
    return harness


def of_settings(settings: Mapping[str, Any]) -> Harness:
    """The harness a job's settings describe: the description the pool sent with the job,
    else the registered one named by ``settings["harness"]``."""
    described = settings.get("harness_spec")
    if isinstance(described, Mapping):
        return Harness.from_json(described)
    return lookup(settings.get("harness"))


def stages_of(settings: Mapping[str, Any], harness: Harness | None = None) -> tuple[str, ...]:
    """The stages this job runs: every one of its harness (``of_settings`` unless given), or
    the subset a measurement asked for (the first stage always, since it builds what the
    others use; then in order)."""
    base = (harness or of_settings(settings)).stages
    wanted = tuple(settings.get("stages") or base)
    order = [base.index(s) for s in wanted if s in base]
    if len(order) != len(wanted) or order != sorted(set(order)) or wanted[0] != base[0]:
        raise ValueError(f"stages {wanted} are not {base[0]} + an ordered subset of {base}")
    return wanted


FILTERS = register(
    Harness(
        DEFAULT,
        "opsynth.filters.checks:run_in",
        (*reasons.STAGES, reasons.VERIFY),
        {c: t for c, t in reasons.ALL.items() if c not in reasons.INFRA and c != reasons.OK},
        judge="opsynth.filters.verify:judge",
        judged=(reasons.VERIFY,),
    )
)
