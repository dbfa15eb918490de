"""The transformers seed library: layer classes of ``transformers.models.*.modeling_*``.

For each family in ``seeds.transformers_families`` every ``nn.Module`` subclass its modeling
modules define (not a full ``PreTrainedModel``) is a candidate; the released set's classes
(``RELEASED_CLASSES``) come first in their family, so the per-family cap never drops them. A
class is built from a small, deterministic config of its family (the family's config class with
``SMALL`` sizes where it has those keys, ``WIDE`` ones when the small config cannot build or run
it), its other constructor arguments are filled by name, and its forward inputs are guessed from its
parameter names and annotations and its first layers (a ``Conv2d`` wants ``(B, C, H, W)``, a
``Linear`` ``(B, S, in)``, a ``list[Tensor]`` a list of those) and kept when a CPU call
succeeds. A few classes whose forward wants inputs no generic rule can guess (several
resolutions at once, a query-major layout) have theirs in ``INPUT_OVERRIDES``. The task inlines
the class's source (``synth.catalog.inline``) and builds the config in ``get_init_inputs()``,
like the released set's transformers rows.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

import torch

from opsynth.config import SeedsConfig
from opsynth.synth.catalog.inline import inline_class
from opsynth.synth.catalog.probe import output_shapes
from opsynth.synth.catalog.render import literal
from opsynth.synth.catalog.spec import CatalogSpec

LIBRARY = "transformers"
BATCH, SEQ, SPATIAL, AUDIO, PATCHES = 2, 16, 32, 400, 4
# Length of a list argument (per-stage rates, lateral widths) and of a list of feature maps.
LIST_LEN = 4
# Sizes a family's config takes where it has the key: small enough for a CPU run in ms. A list
# default (per-stage sizes) gets the value once per entry.
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
    "tdnn_dim": 32,
    "num_filters": 8,
    "neck_hidden_sizes": 32,
    "fusion_hidden_size": 32,
    "reassemble_hidden_size": 32,
    "hidden_sizes": 32,
    "embed_dim": 32,
    "depths": 1,
    "conv_dim": 32,
}
# For a layer the small config cannot build (heads derived as ``hidden_size // 64``).
WIDE: dict[str, Any] = {
    **SMALL,
    "hidden_size": 128,
    "embedding_size": 128,
    "d_model": 128,
    "intermediate_size": 256,
    "d_ff": 256,
}
# Constructor arguments besides ``config``, by name; channel and feature sizes agree, so a
# layer that mixes them (pooling on ``num_channels``, an MLP on ``hidden_size``) still builds.
INIT_VALUES: dict[str, Any] = {
    "in_channels": 32,
    "out_channels": 32,
    "channels": 32,
    "num_channels": 32,
    "input_channels": 32,
    "in_channel": 32,
    "hidden_size": 32,
    "dim": 32,
    "dimension": 32,
    "width": 32,
    "embed_dim": 32,
    "input_dim": 32,
    "output_dim": 32,
    "in_features": 32,
    "out_features": 32,
    "in_size": 32,
    "out_size": 32,
    "condition_dim": 32,
    "mask_feature_size": 32,
    "lateral_widths": 32,
    "fpn_channels": 32,
    "hidden_size_output": 32,
    "intermediate_size": 64,
    "num_heads": 4,
    "num_attention_heads": 4,
    "n_heads": 4,
    "heads": 4,
    "stride": 1,
    "kernel_size": 3,
    "patch_size": 3,
    "pool_size": 3,
    "pool_scale": 2,
    "num_blocks": 1,
    "num_layers": 1,
    "layer_idx": 0,
    "layer_id": 0,
    "layer_index": 0,
    "stage_num": 0,
    "drop_path": 0.0,
    "drop_path_rate": 0.0,
    "dropout": 0.0,
    "depth": 1,
    "query_stride": 1,
    "window_size": 4,
    "use_mask_unit_attn": False,
    "is_cross_attention": False,
    "attn_mask": None,
    "normalized_shape": 32,
    "eps": 1e-6,
}
# Optional forward parameters used as the input when a layer has no required one.
INPUT_NAMES = ("hidden_states", "input_ids", "pixel_values", "input_values", "x")
# Forward parameters that are an output size, not a tensor.
SIZE_NAMES = ("size", "output_size", "target_size")
# A layer above this many parameters holds a part the small config does not reach (a default
# backbone built from a nested config): slow to probe and too big to be one task's operator.
MAX_PARAMETERS = 8_000_000
# Forward attempts per layer: enough for every guess of a layer with a few inputs.
MAX_ATTEMPTS = 60
# The released set's transformers classes, walked first in their family.
RELEASED_CLASSES = frozenset(
    {
        "ASTPatchEmbeddings",
        "BlipTextAttention",
        "BridgeTowerMLMHead",
        "BridgeTowerResidualAttention",
        "BrosBboxEmbeddings",
        "ConditionalDetrMaskHeadSmallConv",
        "ConvNextLayer",
        "ConvNextStage",
        "DPTDepthEstimationHead",
        "DPTFeatureFusionLayer",
        "DPTFeatureFusionStage",
        "Data2VecVisionPyramidPoolingBlock",
        "DepthAnythingFeatureFusionStage",
        "DepthAnythingNeck",
        "EncodecLSTM",
        "ErniePreTrainingHeads",
        "FNetPreTrainingHeads",
        "FlavaImageCodebookLayerGroup",
        "GLPNOverlapPatchEmbeddings",
        "GLPNSelectiveFeatureFusion",
        "HieraLayer",
        "HieraMaskUnitAttention",
        "HieraStage",
        "LevitPatchEmbeddings",
        "MPNetLMHead",
        "Mask2FormerMaskPredictor",
        "MaskFormerFPNModel",
        "MaskFormerSwinAttention",
        "MaskFormerSwinSelfAttention",
        "MegatronBertPreTrainingHeads",
        "MobileBertLMPredictionHead",
        "MobileBertPreTrainingHeads",
        "MultiHeadAttention",
        "NystromformerSelfAttention",
        "OneFormerTextTransformerLayer",
        "PoolFormerLayer",
        "ResNetBasicLayer",
        "ResNetBottleNeckLayer",
        "ResNetShortCut",
        "SegGptAttention",
        "SegGptDecoder",
        "SpeechT5FeatureEncoder",
        "Swin2SRPatchEmbeddings",
        "SwinSelfAttention",
        "TDNNLayer",
        "VitDetAttention",
        "VitMatteFusionBlock",
        "ZoeDepthConditionalLogBinomialSoftmax",
        "ZoeDepthFeatureFusionStage",
        "ZoeDepthRelativeDepthEstimationHead",
    }
)


@dataclass(frozen=True)
class Arg:
    """One forward argument: a float tensor of ``shape`` (integers below ``int_high`` when it
    is set, all ones for a mask), a list of float tensors of ``shapes``, or a literal
    ``value`` (``literal``)."""

    shape: tuple[int, ...] = ()
    int_high: int = 0
    ones: bool = False
    shapes: tuple[tuple[int, ...], ...] = ()
    value: Any = None
    literal: bool = False

    def draw(self) -> Any:
        if self.literal:
            return self.value
        if self.shapes:
            return [torch.randn(s) for s in self.shapes]
        if self.int_high:
            return torch.randint(0, self.int_high, self.shape)
        return torch.ones(self.shape) if self.ones else torch.randn(self.shape)

    def constant(self, name: str) -> str:
        """The module-level constant ``get_inputs()`` draws from ("" for a literal)."""
        if self.literal:
            return ""
        if self.shapes:
            return f"{name}_shapes = {literal(list(self.shapes))}"
        return f"{name}_shape = {literal(self.shape)}"

    def expression(self, name: str) -> str:
        if self.literal:
            return literal(self.value)
        if self.shapes:
            return f"[torch.randn(shape) for shape in {name}_shapes]"
        if self.int_high:
            return f"torch.randint(0, {self.int_high}, {name}_shape)"
        return f"torch.{'ones' if self.ones else 'randn'}({name}_shape)"

    def describe(self) -> Any:
        if self.literal:
            return repr(self.value)
        return [list(s) for s in self.shapes] if self.shapes else list(self.shape)


def tensor(*shape: int, int_high: int = 0, ones: bool = False) -> Arg:
    return Arg(shape=tuple(shape), int_high=int_high, ones=ones)


def tensors(*shapes: tuple[int, ...]) -> Arg:
    return Arg(shapes=tuple(shapes))


def value(v: Any) -> Arg:
    return Arg(value=v, literal=True)


def _pyramid(channels: int, side: int, count: int = 3) -> tuple[tuple[int, ...], ...]:
    """Feature maps of ``channels`` at ``side``, twice ``side``, ... (an FPN's inputs)."""
    return tuple((BATCH, channels, side * 2**i, side * 2**i) for i in range(count))


def _detr_mask_head(config: Any) -> list[tuple[str, Arg]]:
    """Encoder features and per-query attention maps whose channels add up to the head's
    ``input_channels``, then FPN maps at growing resolution."""
    channels, queries, heads = INIT_VALUES["input_channels"], 2, 4
    return [
        ("features", tensor(BATCH, channels - heads, 8, 8)),
        ("attention_masks", tensor(BATCH, queries, heads, 8, 8)),
        ("fpn_features", tensors(*_pyramid(INIT_VALUES["fpn_channels"], 16))),
    ]


def _depth_anything_neck(config: Any) -> list[tuple[str, Arg]]:
    """Backbone tokens (a class token and a patch grid) per neck stage, and the grid's side."""
    tokens = (BATCH, 1 + PATCHES * PATCHES, config.reassemble_hidden_size)
    stages = len(config.neck_hidden_sizes)
    return [
        ("hidden_states", tensors(*[tokens] * stages)),
        ("patch_height", value(PATCHES)),
        ("patch_width", value(PATCHES)),
    ]


def _mask2former_predictor(config: Any) -> list[tuple[str, Arg]]:
    """Query-major decoder outputs, pixel embeddings, and the attention mask's size."""
    hidden = INIT_VALUES["hidden_size"]
    return [
        ("outputs", tensor(8, BATCH, hidden)),
        ("pixel_embeddings", tensor(BATCH, INIT_VALUES["mask_feature_size"], SPATIAL, SPATIAL)),
        ("attention_mask_target_size", value((SPATIAL // 2, SPATIAL // 2))),
    ]


def _vitmatte_fusion(config: Any) -> list[tuple[str, Arg]]:
    """Coarse features upsampled twice to the detail map's size; their channels add up to the
    block's ``in_channels``."""
    half = INIT_VALUES["in_channels"] // 2
    return [
        ("features", tensor(BATCH, half, SPATIAL // 2, SPATIAL // 2)),
        ("detailed_feature_map", tensor(BATCH, half, SPATIAL, SPATIAL)),
    ]


# Forward inputs of classes no generic guess can feed, from the layer's config, by the end of
# the class name (DETR's mask head is copied into several families).
INPUT_OVERRIDES: dict[str, Callable[[Any], list[tuple[str, Arg]]]] = {
    "DetrMaskHeadSmallConv": _detr_mask_head,
    "DepthAnythingNeck": _depth_anything_neck,
    "Mask2FormerMaskPredictor": _mask2former_predictor,
    "VitMatteFusionBlock": _vitmatte_fusion,
}


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
        seen: set[str] = set()
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
            for module, cls in _walk_order(modules):
                if n >= self.cfg.transformers_max_per_family:
                    break
                if cls.__name__ not in seen:
                    n += 1
                    seen.add(cls.__name__)
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


def _walk_order(modules: list[ModuleType]) -> list[tuple[ModuleType, type]]:
    """A family's layer classes in definition order, the released set's first: the per-family
    cap then drops other classes, never one the released set has. A class another family
    already yielded (a copied ``MultiHeadAttention``) is skipped by the caller."""
    found = [(module, cls) for module in modules for cls in _layer_classes(module)]
    return sorted(found, key=lambda pair: pair[1].__name__ not in RELEASED_CLASSES)


def _layer_classes(module: ModuleType) -> list[type]:
    from transformers import PreTrainedModel

    return [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj)
        and issubclass(obj, torch.nn.Module)
        and obj.__module__ == module.__name__
        and not issubclass(obj, PreTrainedModel)
    ]


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


@functools.cache
def _config_defaults(config_cls: type) -> dict[str, Any]:
    """A config class's default values (building one is slow; every layer of its family asks)."""
    return config_cls().to_dict()


def _sized(default: Any, size: Any) -> Any:
    """``size`` in the shape of a config's default: once per entry of a per-stage list."""
    if isinstance(default, list | tuple) and isinstance(size, int) and not isinstance(size, bool):
        if default and all(isinstance(d, int | float) for d in default):
            return [size] * len(default)
        return default
    return size


def _config_key(config_cls: type, key: str, defaults: dict[str, Any]) -> str:
    """The name a config class stores ``key`` under (GPT-2's ``n_embd`` for ``hidden_size``),
    "" when it has none."""
    if key in defaults:
        return key
    stored = getattr(config_cls, "attribute_map", {}).get(key, "")
    return stored if stored in defaults else ""


def small_config(config_cls: type, sizes: dict[str, Any] = SMALL) -> tuple[Any, dict[str, Any]]:
    defaults = _config_defaults(config_cls)
    kwargs = {}
    for key, size in sizes.items():
        stored = _config_key(config_cls, key, defaults)
        if stored and stored not in kwargs:
            kwargs[stored] = _sized(defaults[stored], size)
    try:
        return config_cls(**kwargs), kwargs
    except Exception:
        return config_cls(), {}


def _annotation(p: inspect.Parameter) -> str:
    a = p.annotation
    return "" if a is p.empty else a if isinstance(a, str) else repr(a)


def _is_list(p: inspect.Parameter) -> bool:
    return re.search(r"\b(list|List|Sequence)\[", _annotation(p)) is not None


def _init_value(p: inspect.Parameter, config: Any) -> tuple[bool, Any]:
    """(known, value) of a required constructor argument; a scalar for a ``list[...]``
    argument (per-layer rates, lateral widths) is repeated ``LIST_LEN`` times."""
    if p.name == "config":
        return True, config
    if p.name not in INIT_VALUES:
        return False, None
    known = INIT_VALUES[p.name]
    if _is_list(p) and not isinstance(known, list):
        return True, [known] * LIST_LEN
    return True, known


def _init_args(cls: type, config: Any) -> list[tuple[str, Any]] | None:
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    args = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.default is not p.empty:
            continue
        known, v = _init_value(p, config)
        if not known:
            return None
        args.append((p.name, v))
    return args


def _first_layers(module: torch.nn.Module, count: int = 3) -> list[torch.nn.Module]:
    """The first sub-layer of each kind an input meets, in definition order."""
    kinds = (
        torch.nn.modules.conv._ConvNd,
        torch.nn.Linear,
        torch.nn.LayerNorm,
        torch.nn.Embedding,
        torch.nn.RNNBase,
    )
    found: dict[type, torch.nn.Module] = {}
    for sub in module.modules():
        kind = next((k for k in kinds if isinstance(sub, k)), None)
        if kind is not None and kind not in found:
            found[kind] = sub
            if len(found) == count:
                break
    return list(found.values())


def _conv_guesses(layer: torch.nn.modules.conv._ConvNd) -> list[Arg]:
    """Channels-first inputs of a (transposed) convolution; a 1-D one on several channels
    reads features over time (a decoder's latent frames: short, a recurrent layer may
    follow), on one channel a waveform."""
    channels = layer.in_channels
    if len(layer.kernel_size) == 2:
        return [tensor(BATCH, channels, SPATIAL, SPATIAL)]
    if len(layer.kernel_size) == 1 and channels > 1:
        return [tensor(BATCH, channels, SEQ), tensor(BATCH, channels, AUDIO)]
    if len(layer.kernel_size) == 1:
        return [tensor(BATCH, channels, AUDIO)]
    return [tensor(BATCH, channels, *[SEQ] * len(layer.kernel_size))]


def _layer_guesses(layer: torch.nn.Module) -> list[Arg]:
    """Inputs a layer of this kind takes: see ``_conv_guesses``; features-last tokens (or a
    patch grid) for a Linear; a convolutional layout first for a recurrent layer."""
    if isinstance(layer, torch.nn.modules.conv._ConvNd):
        return _conv_guesses(layer)
    if isinstance(layer, torch.nn.Linear):
        n = layer.in_features
        return [tensor(BATCH, SEQ, n), tensor(BATCH, n), tensor(BATCH, 8, 8, n)]
    if isinstance(layer, torch.nn.LayerNorm):
        return [tensor(BATCH, SEQ, layer.normalized_shape[-1])]
    if isinstance(layer, torch.nn.Embedding):
        return [tensor(BATCH, SEQ, int_high=layer.num_embeddings)]
    if isinstance(layer, torch.nn.RNNBase):
        return [tensor(BATCH, layer.input_size, SEQ), tensor(BATCH, SEQ, layer.input_size)]
    return []


def _input_guesses(module: torch.nn.Module, config: Any) -> list[Arg]:
    """Tensor inputs in order of likelihood: from the first layers, then generic shapes."""
    hidden = getattr(config, "hidden_size", 32)
    guesses = [g for layer in _first_layers(module) for g in _layer_guesses(layer)]
    guesses += [
        tensor(BATCH, SEQ, hidden),
        tensor(BATCH, hidden, SPATIAL, SPATIAL),
        tensor(BATCH, SPATIAL, SPATIAL, hidden),
        tensor(BATCH, hidden),
        tensor(BATCH, AUDIO),
    ]
    return list(dict.fromkeys(guesses))


def _named_input(p: inspect.Parameter, config: Any) -> Arg | None:
    """An input its name alone tells: a box list, an all-ones mask, an output size."""
    if p.name == "bbox":
        return tensor(BATCH, SEQ, getattr(config, "dim_bbox", 4))
    if p.name.endswith("mask"):
        return tensor(BATCH, SEQ, ones=True)
    if p.name in SIZE_NAMES or _annotation(p).startswith("tuple[int"):
        return value((SPATIAL, SPATIAL))
    return None


def _companions(guess: Arg, count: int, hidden: int) -> list[list[Arg]]:
    """Tensors for ``count`` inputs given the first one's guess: all alike, the rest
    ``hidden``-wide, or the guess's channels split between them (a layer that concatenates
    its inputs)."""
    if count == 1:
        return [[guess]]
    shape = guess.shape
    out = [[guess] * count, [guess] + [tensor(*shape[:-1], hidden)] * (count - 1)]
    if len(shape) >= 3 and shape[1] % count == 0 and not guess.int_high:
        out.append([tensor(shape[0], shape[1] // count, *shape[2:])] * count)
    return out


def _as_list(guess: Arg) -> Arg:
    """``LIST_LEN`` inputs like ``guess``: a backbone's feature maps, each half the previous
    one's side, or token sequences alike."""
    shape = guess.shape
    if len(shape) == 4:
        b, c, h, w = shape
        return tensors(*[(b, c, max(1, h >> i), max(1, w >> i)) for i in range(LIST_LEN)])
    return tensors(*[shape] * LIST_LEN)


def _forward_params(module: torch.nn.Module) -> list[inspect.Parameter]:
    signature = list(inspect.signature(module.forward).parameters.values())
    params = [
        p
        for p in signature
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.default is p.empty
    ]
    return params or [p for p in signature if p.name in INPUT_NAMES][:1]


def _candidates(module: torch.nn.Module, config: Any) -> Iterator[list[tuple[str, Arg]]]:
    """Input lists to try, most likely first. An unannotated first tensor input is tried as
    a list of feature maps after every single-tensor guess failed (fusion stages)."""
    params = _forward_params(module)
    named = [_named_input(p, config) for p in params]
    free = [i for i, arg in enumerate(named) if arg is None]
    if not free:
        yield [(p.name, arg) for p, arg in zip(params, named, strict=True)]
        return
    hidden = getattr(config, "hidden_size", 32)
    lists = [_is_list(params[i]) for i in free]
    passes = [lists]
    if not lists[0] and not _annotation(params[free[0]]):
        passes.append([True] + lists[1:])
    for as_list in passes:
        for guess in _input_guesses(module, config):
            for tensors_ in _companions(guess, len(free), hidden):
                args = list(named)
                for i, listed, arg in zip(free, as_list, tensors_, strict=True):
                    args[i] = _as_list(arg) if listed else arg
                yield [(p.name, arg) for p, arg in zip(params, args, strict=True)]


def _runs(module: torch.nn.Module, inputs: list[tuple[str, Arg]]) -> str:
    """ "" when the module runs on the inputs and returns tensors, else the error."""
    try:
        with torch.no_grad():
            output_shapes(module(*[arg.draw() for _, arg in inputs]))
        return ""
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc)[:200]}"


def _forward_inputs(module: torch.nn.Module, config: Any) -> list[tuple[str, Arg]] | str:
    name = type(module).__name__
    override = next((f for end, f in INPUT_OVERRIDES.items() if name.endswith(end)), None)
    if override is not None:
        inputs = override(config)
        return _runs(module, inputs) or inputs
    if not _forward_params(module):
        return "forward takes no required input"
    first, tried = "", set()
    for inputs in _candidates(module, config):
        key = repr(inputs)
        if key in tried:
            continue
        tried.add(key)
        if len(tried) > MAX_ATTEMPTS:
            break
        error = _runs(module, inputs)
        if not error:
            return inputs
        first = first or error
    return first or "no input guess ran"


def _render(cls: type, config_cls: type, kwargs: dict, init: list, inputs: list) -> str:
    source = inline_class(cls)
    constants = [c for c in (arg.constant(name) for name, arg in inputs) if c]
    draws = [f"    {name} = {arg.expression(name)}" for name, arg in inputs]
    config_args = ", ".join(f"{k}={literal(v)}" for k, v in kwargs.items())
    init_values = ["config" if name == "config" else literal(v) for name, v in init]
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


def _probe(cls: type, config_cls: type, sizes: dict[str, Any]) -> tuple[str, Any]:
    """("", (kwargs, init, inputs)) when ``cls`` builds from ``config_cls`` at ``sizes`` and
    runs on guessed inputs, else (reason, detail)."""
    config, kwargs = small_config(config_cls, sizes)
    init = _init_args(cls, config)
    if init is None:
        return "no_signature", "a constructor argument has no known value"
    try:
        module = cls(*[v for _, v in init])
    except Exception as exc:
        return "init_error", f"{type(exc).__name__}: {str(exc)[:200]}"
    parameters = sum(p.numel() for p in module.parameters())
    if parameters > MAX_PARAMETERS:
        return "config_error", f"{parameters} parameters: a part keeps its default size"
    inputs = _forward_inputs(module, config)
    if isinstance(inputs, str):
        return "probe_failed", inputs
    return "", (kwargs, init, inputs)


def _fit(cls: type, config_cls: type) -> tuple[str, Any]:
    """``_probe`` with the small config, then the wide one (sizes derived from the hidden
    size, like ``hidden_size // 64`` heads, that the small config leaves at zero)."""
    reason, found = _probe(cls, config_cls, SMALL)
    if reason in ("init_error", "probe_failed"):
        wide_reason, wide = _probe(cls, config_cls, WIDE)
        if not wide_reason:
            return wide_reason, wide
    return reason, found


def layer_spec(cls: type, family: str, configs: list[type]) -> CatalogSpec:
    base = CatalogSpec(LIBRARY, cls.__name__, "layer", family=family, data_source=LIBRARY)
    reason, detail = "config_error", "no config class in its modeling module"
    for config_cls in configs:
        try:
            reason, found = _fit(cls, config_cls)
        except Exception as exc:
            reason = "config_error"
            detail = f"{config_cls.__name__}: {type(exc).__name__}: {str(exc)[:200]}"
            continue
        if reason:
            detail = found
            continue
        kwargs, init, inputs = found
        try:
            code = _render(cls, config_cls, kwargs, init, inputs)
        except (OSError, TypeError, KeyError) as exc:
            return replace(base, reason="source_unavailable", detail=f"{type(exc).__name__}: {exc}")
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
                "inputs": {name: arg.describe() for name, arg in inputs},
            },
        )
    return replace(base, reason=reason, detail=detail)
