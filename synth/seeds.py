"""Seed operators: the spec type, the library registry and standalone seed tasks.

A seed library is anything with a ``name`` and ``specs()``; libraries register a factory under
their name so ``seeds.libraries`` in the config can select them. Each seed also becomes a
standalone one-operator KernelBench task (``torch#1``) whose content id is its seed id, which
composed tasks cite in ``seed_ids``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import synth
from opsynth.config import ComposeConfig
from opsynth.record import Task
from synth.render import render_task
from synth.shapes import solve_chain
from synth.spec import Degenerate, SeedSpec
from synth.torch_seeds import torch_specs

__all__ = [
    "SeedLibrary",
    "SeedSpec",
    "TorchLibrary",
    "get_library",
    "library_names",
    "register_library",
    "seed_tasks",
    "spec_of",
]

SEED_COMPOSER = "seed"


class SeedLibrary(Protocol):
    name: str

    def specs(self) -> list[SeedSpec]: ...


@dataclass(frozen=True)
class TorchLibrary:
    """The hand-written torch catalogue (see ``synth.torch_seeds``)."""

    name: str = "torch"

    def specs(self) -> list[SeedSpec]:
        return torch_specs()


_LIBRARIES: dict[str, Callable[[], SeedLibrary]] = {"torch": TorchLibrary}


def register_library(name: str, factory: Callable[[], SeedLibrary]) -> None:
    _LIBRARIES[name] = factory


def library_names() -> list[str]:
    return sorted(_LIBRARIES)


def get_library(name: str) -> SeedLibrary:
    try:
        return _LIBRARIES[name]()
    except KeyError:
        known = ", ".join(library_names())
        raise ValueError(f"unknown seed library {name!r}; known libraries: {known}") from None


def spec_of(task: Task) -> SeedSpec:
    """The spec a seed task was made from, looked up by the library and name in its meta."""
    seed = task.meta.get("seed") or {}
    library, name = seed.get("library"), seed.get("name")
    if not library or not name:
        raise ValueError(f"task {task.id} is not a seed task (no meta.seed library/name)")
    for spec in get_library(library).specs():
        if spec.name == name:
            return spec
    raise ValueError(f"seed {name!r} of task {task.id} is not in library {library!r}")


def seed_tasks(specs: Sequence[SeedSpec], cfg: ComposeConfig | None = None) -> list[Task]:
    """One standalone task per seed. Shapes come from the composer's own solver with an RNG
    keyed by the seed's name, so a seed task is the same whatever else is in the catalogue."""
    cfg = cfg or ComposeConfig()
    tasks = []
    for spec in specs:
        rng = random.Random(f"opsynth.seed:{spec.library}:{spec.name}")
        try:
            chain = solve_chain([spec], rng, cfg, enforce_window=False)
        except Degenerate as exc:
            raise ValueError(f"seed {spec.name!r} has no valid standalone task: {exc}") from exc
        task = render_task(
            chain,
            seed_ids=[],
            composer=SEED_COMPOSER,
            composer_version=synth.__version__,
            meta={"seed": spec.describe()},
        )
        task.seed_ids = [task.id]
        tasks.append(task)
    return tasks
