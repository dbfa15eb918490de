"""The transformers seed library: layer classes of ``transformers.models.*.modeling_*``.

For each family in ``seeds.transformers_families`` every ``nn.Module`` subclass its modeling
modules define (not a full ``PreTrainedModel``) is a candidate. It is built from a small,
deterministic config of its family (the family's config class with ``SMALL`` sizes where it has
those keys), its other constructor arguments are filled by name, and its forward inputs are
guessed from its parameter names and its first layer (a ``Conv2d`` wants ``(B, C, H, W)``, a
``Linear`` ``(B, S, in)``) and kept when a CPU call succeeds. The task inlines the class's
source (``synth.catalog.inline``) and builds the config in ``get_init_inputs()``, like the
released set's transformers rows.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import warnings
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch

from opsynth.config import SeedsConfig
from synth.catalog.inline import inline_class
from synth.catalog.probe import output_shapes
from synth.catalog.render import literal
from synth.catalog.spec import CatalogSpec

LIBRARY = "transformers"
BATCH, SEQ, SPATIAL, AUDIO = 2, 16, 32, 400
# Sizes a family's config takes where it has the key: small enough for a CPU run in ms.
SMALL: dict[str, Any] = {
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_heads": 4,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "vocab_size": 100,
    "embedding_size": 32,
    "max_position_embeddings": 64,
    "d_model": 32,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "d_ff": 64,
    "d_kv": 8,
    "num_key_value_heads": 2,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
    "drop_path_rate": 0.0,
}
# Constructor arguments besides ``config``, by name.
INIT_VALUES: dict[str, Any] = {
    "in_channels": 16,
    "out_channels": 16,
    "channels": 16,
    "num_channels": 16,
    "hidden_size": 32,
    "dim": 32,
    "embed_dim": 32,
    "input_dim": 32,
    "output_dim": 32,
    "in_features": 32,
    "out_features": 32,
    "hidden_size_output": 32,
    "num_heads": 4,
    "num_attention_heads": 4,
    "stride": 1,
    "kernel_size": 3,
    "layer_idx": 0,
    "layer_id": 0,
    "layer_index": 0,
    "drop_path": 0.0,
    "drop_path_rate": 0.0,
    "dropout": 0.0,
    "depth": 1,
    "query_stride": 1,
    "window_size": 4,
    "use_mask_unit_attn": False,
    "is_cross_attention": False,
    "normalized_shape": 32,
    "eps": 1e-6,
}
# Optional forward parameters used as the input when a layer has no required one.
INPUT_NAMES = ("hidden_states", "input_ids", "pixel_values", "input_values", "x")
OUTPUT_SUFFIXES = ("PreTrainedModel", "Model", "ForCausalLM")


class TransformersCatalog:
    """The transformers adapter of the seed-library plugin API."""

    name = LIBRARY

    def __init__(self, config: SeedsConfig | None = None) -> None:
        self.cfg = config or SeedsConfig()

    def families(self) -> list[str]:
        import transformers.models as models

        return self.cfg.transformers_families or sorted(
            m.name for m in pkgutil.iter_modules(models.__path__) if m.ispkg
        )

    def specs(self) -> Iterator[CatalogSpec]:
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        for family in self.families():
            modules = _modeling_modules(family)
            if not modules:
                yield CatalogSpec(
                    LIBRARY,
                    f"<{family}>",
                    "layer",
                    family=family,
                    reason="config_error",
                    detail="no importable modeling module",
                )
                continue
            n = 0
            for module in modules:
                for cls in _layer_classes(module):
                    if n >= self.cfg.transformers_max_per_family:
                        break
                    n += 1
                    yield layer_spec(cls, family, _configs(module))


def _modeling_modules(family: str) -> list[ModuleType]:
    try:
        package = importlib.import_module(f"transformers.models.{family}")
    except Exception:
        return []
    found = []
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith("modeling_") and not info.name.startswith(
            ("modeling_tf", "modeling_flax")
        ):
            try:
                found.append(importlib.import_module(f"{package.__name__}.{info.name}"))
            except Exception:
                continue
    return found


def _layer_classes(module: ModuleType) -> list[type]:
    from transformers import PreTrainedModel

    out = []
    for obj in vars(module).values():
        if (
            inspect.isclass(obj)
            and issubclass(obj, torch.nn.Module)
            and obj.__module__ == module.__name__
            and not issubclass(obj, PreTrainedModel)
            and not obj.__name__.endswith(OUTPUT_SUFFIXES)
        ):
            out.append(obj)
    return out


def _configs(module: ModuleType) -> list[type]:
    from transformers import PretrainedConfig

    found = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj)
        and issubclass(obj, PretrainedConfig)
        and obj is not PretrainedConfig
    ]
    # the family's main config first (shortest name), sub-configs (text, vision) after
    return sorted(found, key=lambda c: len(c.__name__))


def small_config(config_cls: type) -> tuple[Any, dict[str, Any]]:
    defaults = config_cls().to_dict()
    kwargs = {k: v for k, v in SMALL.items() if k in defaults}
    try:
        return config_cls(**kwargs), kwargs
    except Exception:
        return config_cls(), {}


def _init_args(cls: type, config: Any) -> list[tuple[str, Any]] | None:
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    args = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.default is not p.empty:
            continue
        if p.name == "config":
            args.append(("config", config))
        elif p.name in INIT_VALUES:
            args.append((p.name, INIT_VALUES[p.name]))
        else:
            return None
    return args


def _first_layer(module: torch.nn.Module) -> torch.nn.Module | None:
    for sub in module.modules():
        if isinstance(
            sub,
            torch.nn.Linear
            | torch.nn.Conv1d
            | torch.nn.Conv2d
            | torch.nn.LayerNorm
            | torch.nn.Embedding,
        ):
            return sub
    return None


def _input_guesses(module: torch.nn.Module, config: Any) -> list[dict[str, Any]]:
    """Input descriptions: ``{"shape": ..., "int_high": n}`` in order of likelihood."""
    hidden = getattr(config, "hidden_size", 32)
    layer = _first_layer(module)
    guesses: list[dict[str, Any]] = []
    if isinstance(layer, torch.nn.Conv2d):
        guesses.append({"shape": (BATCH, layer.in_channels, SPATIAL, SPATIAL)})
    elif isinstance(layer, torch.nn.Conv1d):
        guesses.append({"shape": (BATCH, layer.in_channels, AUDIO)})
    elif isinstance(layer, torch.nn.Linear):
        guesses += [
            {"shape": (BATCH, SEQ, layer.in_features)},
            {"shape": (BATCH, layer.in_features)},
        ]
    elif isinstance(layer, torch.nn.LayerNorm):
        guesses.append({"shape": (BATCH, SEQ, layer.normalized_shape[-1])})
    elif isinstance(layer, torch.nn.Embedding):
        guesses.append({"shape": (BATCH, SEQ), "int_high": layer.num_embeddings})
    guesses += [
        {"shape": (BATCH, SEQ, hidden)},
        {"shape": (BATCH, hidden, SPATIAL, SPATIAL)},
        {"shape": (BATCH, SPATIAL, SPATIAL, hidden)},
        {"shape": (BATCH, hidden)},
        {"shape": (BATCH, AUDIO)},
    ]
    return guesses


def _draw(guess: dict[str, Any]) -> torch.Tensor:
    if "int_high" in guess:
        return torch.randint(0, guess["int_high"], guess["shape"])
    return torch.randn(guess["shape"])


def _forward_inputs(module: torch.nn.Module, config: Any) -> list[tuple[str, dict]] | str:
    signature = list(inspect.signature(module.forward).parameters.values())
    params = [
        p
        for p in signature
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.default is p.empty
    ]
    params = params or [p for p in signature if p.name in INPUT_NAMES][:1]
    if not params:
        return "forward takes no required input"
    error = ""
    hidden = getattr(config, "hidden_size", 32)
    for guess in _input_guesses(module, config):
        rest = {**guess, "shape": (*guess["shape"][:-1], hidden)}
        for later in (guess, rest) if len(params) > 1 else (guess,):
            inputs = [(p.name, guess if i == 0 else later) for i, p in enumerate(params)]
            try:
                with torch.no_grad():
                    output_shapes(module(*[_draw(g) for _, g in inputs]))
                return inputs
            except Exception as exc:
                error = f"{type(exc).__name__}: {str(exc)[:200]}"
    return error or "no input guess ran"


def _render(cls: type, config_cls: type, kwargs: dict, init: list, inputs: list) -> str:
    source = inline_class(cls)
    constants = [f"{name}_shape = {literal(tuple(g['shape']))}" for name, g in inputs]
    draws = []
    for name, g in inputs:
        if "int_high" in g:
            draws.append(f"    {name} = torch.randint(0, {g['int_high']}, {name}_shape)")
        else:
            draws.append(f"    {name} = torch.randn({name}_shape)")
    config_args = ", ".join(f"{k}={literal(v)}" for k, v in kwargs.items())
    init_values = ["config" if name == "config" else literal(value) for name, value in init]
    lines = [
        source.rstrip(),
        "",
        "",
        *constants,
        "",
        "",
        "def get_inputs():",
        *draws,
        f"    return [{', '.join(name for name, _ in inputs)}]",
        "",
        "",
        "def get_init_inputs():",
        "    import transformers",
        "",
        f"    config = transformers.{config_cls.__name__}({config_args})",
        f"    return [{', '.join(init_values)}]",
    ]
    return (
        f'"""transformers layer: {cls.__name__} ({cls.__module__})."""\n\n'
        + "\n".join(lines)
        + "\n"
    )


def layer_spec(cls: type, family: str, configs: list[type]) -> CatalogSpec:
    base = CatalogSpec(LIBRARY, cls.__name__, "layer", family=family, data_source=LIBRARY)
    detail = "no config class in its modeling module"
    reason = "config_error"
    for config_cls in configs:
        try:
            config, kwargs = small_config(config_cls)
        except Exception as exc:
            detail = f"{config_cls.__name__}: {type(exc).__name__}: {str(exc)[:200]}"
            continue
        init = _init_args(cls, config)
        if init is None:
            reason, detail = "no_signature", "a constructor argument has no known value"
            continue
        try:
            module = cls(*[value for _, value in init])
        except Exception as exc:
            reason, detail = "init_error", f"{type(exc).__name__}: {str(exc)[:200]}"
            continue
        inputs = _forward_inputs(module, config)
        if isinstance(inputs, str):
            reason, detail = "probe_failed", inputs
            continue
        try:
            code = _render(cls, config_cls, kwargs, init, inputs)
        except (OSError, TypeError, KeyError) as exc:
            return _with(base, "source_unavailable", f"{type(exc).__name__}: {exc}")
        return CatalogSpec(
            LIBRARY,
            cls.__name__,
            "layer",
            target=f"{cls.__module__}.{cls.__name__}",
            code=code,
            family=family,
            data_source=LIBRARY,
            evidence={
                "config": config_cls.__name__,
                "config_kwargs": kwargs,
                "inputs": {n: list(g["shape"]) for n, g in inputs},
            },
        )
    return _with(base, reason, detail)


def _with(spec: CatalogSpec, reason: str, detail: str) -> CatalogSpec:
    from dataclasses import replace

    return replace(spec, reason=reason, detail=detail)
