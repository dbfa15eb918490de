"""The transformers seed library on a handful of named classes: walk order under the cap,
small configs, input guessing (lists of feature maps, literal sizes, masks, overrides) and the
rendered task running as recorded. The full extraction is tests/test_seeds_catalog.py's.
"""

from __future__ import annotations

import inspect
import sys
import textwrap

import pytest
import torch

from opsynth.config import TRANSFORMERS_FAMILIES, SeedsConfig
from opsynth.refdata import OPS6K, shared_file
from opsynth.synth.catalog import inline
from opsynth.synth.catalog import transformers_library as tl
from opsynth.synth.catalog.coverage import reference_names
from opsynth.synth.catalog.probe import tensors_of
from opsynth.synth.catalog.validate import validate

REFERENCE = shared_file(OPS6K)
needs_reference = pytest.mark.skipif(
    REFERENCE is None, reason="the released Ops-6K parquet (shared/ops6k) is absent"
)
# Released classes the installed transformers no longer defines (Swin's self-attention was
# folded into SwinAttention).
ABSENT = {"SwinSelfAttention"}


def layer_class(family: str, name: str) -> type:
    for module in tl._modeling_modules(family):
        cls = vars(module).get(name)
        if cls is not None and cls.__module__ == module.__name__:
            return cls
    raise LookupError(f"{name} is not in transformers.models.{family}")


def spec_of(family: str, name: str):
    cls = layer_class(family, name)
    return tl.layer_spec(cls, family, tl._configs(sys.modules[cls.__module__]))


def run_task(code: str):
    namespace: dict = {}
    exec(compile(code, "<seed>", "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["Model"](*namespace["get_init_inputs"]())
    with torch.no_grad():
        return model(*namespace["get_inputs"]())


def test_released_classes_come_first_under_the_cap():
    catalog = tl.TransformersCatalog(
        SeedsConfig(transformers_families=["hiera"], transformers_max_per_family=3)
    )
    names = [spec.name for spec in catalog.specs()]
    assert names == ["HieraMaskUnitAttention", "HieraLayer", "HieraStage"]


def test_a_class_two_families_define_is_walked_once():
    catalog = tl.TransformersCatalog(
        SeedsConfig(transformers_families=["xlm", "flaubert"], transformers_max_per_family=1)
    )
    names = [spec.name for spec in catalog.specs()]
    assert names[0] == "MultiHeadAttention" and len(names) == len(set(names)) == 2


def test_small_config_follows_attribute_maps_and_per_stage_lists():
    from transformers import GPT2Config, Wav2Vec2Config

    _, gpt2 = tl.small_config(GPT2Config)
    assert gpt2["n_embd"] == 32 and "hidden_size" not in gpt2
    _, wav2vec2 = tl.small_config(Wav2Vec2Config)
    assert wav2vec2["tdnn_dim"] == [32] * len(Wav2Vec2Config().tdnn_dim)


@pytest.mark.parametrize(
    ("family", "name", "inputs"),
    [
        # an unannotated list of feature maps, halving in size
        (
            "dpt",
            "DPTFeatureFusionStage",
            {"hidden_states": [[2, 32, 32 >> i, 32 >> i] for i in range(4)]},
        ),
        # a literal output size after the tensor
        (
            "data2vec",
            "Data2VecVisionPyramidPoolingBlock",
            {"input": [2, 32, 32, 32], "size": "(32, 32)"},
        ),
        # a required mask: all ones
        ("xlm", "MultiHeadAttention", {"input": [2, 16, 32], "mask": [2, 16]}),
        # an override: query-major outputs and a target size
        ("mask2former", "Mask2FormerMaskPredictor", None),
        # list-typed constructor arguments, one per layer
        ("hiera", "HieraStage", None),
        # needs the wide config (a sinusoid width derived from hidden_size is zero at the small one)
        ("bros", "BrosBboxEmbeddings", {"bbox": [2, 16, 8]}),
    ],
)
def test_guessed_layers_validate_and_run_as_recorded(family, name, inputs):
    spec = spec_of(family, name)
    assert not spec.reason, spec.detail
    if inputs is not None:
        assert spec.evidence["inputs"] == inputs
    task, verdict = validate(spec, 20.0)
    assert verdict.passed, verdict.detail
    out = run_task(task.code)
    assert [list(t.shape) for t in tensors_of(out)] == task.meta["seed"]["output_shapes"]


def test_same_class_same_task():
    assert (
        spec_of("dpt", "DPTFeatureFusionStage").code == spec_of("dpt", "DPTFeatureFusionStage").code
    )


def test_cached_sources_match_inspect():
    module = sys.modules[layer_class("resnet", "ResNetShortCut").__module__]
    for name, obj in vars(module).items():
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and obj.__module__ == module.__name__:
            assert inline._source(obj, name) == textwrap.dedent(inspect.getsource(obj)), name


@needs_reference
def test_released_class_names_are_the_walked_priority():
    _, classes = reference_names(REFERENCE)
    assert classes == tl.RELEASED_CLASSES


@needs_reference
def test_default_families_define_every_released_class():
    _, classes = reference_names(REFERENCE)
    defined = {
        cls.__name__
        for family in TRANSFORMERS_FAMILIES
        for _, cls in tl._walk_order(tl._modeling_modules(family))
    }
    assert classes - defined == ABSENT
