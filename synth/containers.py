"""Containers: the module and parameter holders Ops-6K lists among a task's operators.

About one released chain in twenty-five names a container beside its operators
(``nn.Sequential``, ``nn.ModuleDict``, ``nn.ParameterList``, ``nn.ParameterDict`` or
``nn.Parameter``), and counts it in the chain's length (``torch#2`` for a convolution held in
an ``nn.Sequential``). A container computes nothing: it is how the task holds the modules or
parameters its operators use, so a chain written with one runs exactly the calls it runs
without. The composer draws one for ``compose.container_share`` of its chains, in place of one
of their operators (a ``torch#k`` task then has k - 1 operators and the container); which
containers fit depends on what the chain holds: modules for ``nn.Sequential`` and
``nn.ModuleDict``, parameters (``synth.chain.weight_names``) for the others.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the sampler reads the names below without importing torch
    from opsynth.synth.catalog.spec import CatalogSpec
    from opsynth.synth.chain import Chain, Link

SEQUENTIAL = "nn.Sequential"
MODULE_DICT = "nn.ModuleDict"
PARAMETER_LIST = "nn.ParameterList"
PARAMETER_DICT = "nn.ParameterDict"
PARAMETER = "nn.Parameter"
CONTAINERS = (SEQUENTIAL, MODULE_DICT, PARAMETER_LIST, PARAMETER_DICT, PARAMETER)
MODULE_HOLDERS = (SEQUENTIAL, MODULE_DICT)


def without_container(ops: Sequence[str]) -> tuple[str, ...]:
    """A task's operators less the container it lists last: the sequence whose chain
    computes what it computes (dedup finds the two structurally equal), which a composer
    with containers treats as produced with it."""
    return tuple(ops[:-1]) if len(ops) > 1 and ops[-1] in CONTAINERS else tuple(ops)


def _takes_one_tensor(link: Link) -> bool:
    """A module called with one positional tensor: what ``nn.Sequential`` passes it."""
    if link.spec.kind != "module" or len(link.spec.args) != 1:
        return False
    arg = link.spec.args[0]
    return arg.tensor and not arg.keyword and not arg.count


def sequential_run(links: Sequence[Link]) -> range | None:
    """The links an ``nn.Sequential`` holds: the first module called with one tensor, and the
    modules after it that each take only the tensor the one before returned, unless a later
    link takes that tensor again (``Link.reuses``: the task keeps it between the two calls);
    None when no module fits."""
    start = next((i for i, link in enumerate(links) if _takes_one_tensor(link)), None)
    if start is None:
        return None
    sources = {j for link in links for _, j, _ in link.reuses}
    end = start + 1
    while (
        end < len(links)
        and not links[end - 1].pick
        and end not in sources
        and _takes_one_tensor(links[end])
    ):
        end += 1
    return range(start, end)


def attribute_name(spec: CatalogSpec) -> str:
    """The model attribute a module operator is built as (``nn.Conv2d`` -> ``conv2d``), and
    its key in an ``nn.ModuleDict``."""
    return spec.name.rpartition(".")[2].lower() or "op"


def may_hold(spec: CatalogSpec) -> bool:
    """Whether a chain of this operator alone may take a container: a module does, and so
    does an operator with a float tensor operand besides its input (a parameter, when the
    operand does not follow the batch)."""
    operands = [arg for arg in spec.args if arg.tensor][1:]
    return spec.kind == "module" or any(arg.dtype == "float32" for arg in operands)


def fitting(chain: Chain) -> list[str]:
    """The containers ``chain`` can be written with (none it already calls as an operator)."""
    import torch

    from opsynth.synth.chain import weight_names

    held = set(chain.ops)
    modules = [attribute_name(link.spec) for link in chain.links if link.spec.kind == "module"]
    parameters = weight_names(chain)
    fits = []
    if sequential_run(chain.links) is not None:
        fits.append(SEQUENTIAL)
    if modules and _free_keys(modules, torch.nn.ModuleDict):
        fits.append(MODULE_DICT)
    if parameters:
        fits.append(PARAMETER_LIST)
        if _free_keys(parameters, torch.nn.ParameterDict):
            fits.append(PARAMETER_DICT)
        fits.append(PARAMETER)
    return [name for name in fits if name not in held]


def _free_keys(keys: Iterable[str], holder: type) -> bool:
    """Whether a dict container can hold these keys (its modules' attribute names, its
    parameters' names): torch refuses a key that is already an attribute of the container
    (``values``, ``keys``, ``update``...)."""
    empty = holder()
    return not any(hasattr(empty, key) for key in keys)


def draw_container(chain: Chain, rng: random.Random, weights: Mapping[str, float]) -> str | None:
    """One container that fits ``chain``, drawn by ``weights`` (the profile's counts); None
    when none fits or none of those that fit has weight."""
    fits = [name for name in fitting(chain) if weights.get(name, 0.0) > 0]
    if not fits:
        return None
    return rng.choices(fits, weights=[weights[name] for name in fits])[0]
