"""The declarative part of torch seed derivation: what introspection cannot infer.

Three tables. ``NAMED`` proposes values for a parameter by its name (``kernel_size`` -> 3,
``in_channels`` -> the input's channel count); ``SCREEN`` maps name fragments to the reason an
operator is unsupported here (sparse, quantized, CUDA-only...); ``OVERRIDES`` spells out the
few operators whose argument shapes depend on each other in ways a name cannot say
(``F.linear``'s weight is ``(out, in)``). Shape tokens in overrides (and an integer tensor's
``high``): ``B`` batch, ``C`` dim 1, ``L`` last dim, ``x`` the whole input shape.
``ADDED_OVERRIDES`` and ``UNSCREENED`` came after catalogues were made, for operators of the
released set the first tables missed; ``seeds.added_overrides`` applies them, so a catalogue
made before them is extracted again the same way. ``CONDITION_OVERRIDES`` came later still
(``seeds.condition_overrides``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opsynth.synth.catalog.spec import Code

Shape = tuple[int, ...]

# Input shapes tried per rank: small enough that a CPU run costs milliseconds, with distinct
# sizes per dim so a wrong dim choice fails instead of passing by coincidence.
PROBE_SHAPES: dict[int, Shape] = {
    1: (64,),
    2: (8, 32),
    3: (4, 16, 32),
    4: (4, 8, 16, 16),
    5: (2, 4, 8, 8, 8),
}
# Rank order a seed is tried in; ``1d``/``2d``/``3d`` in a name puts its batched rank first.
RANK_ORDER = (4, 2, 3, 5, 1)
SUFFIX_RANKS = {"1d": (3, 2), "2d": (4, 3), "3d": (5, 4)}
OUT_FEATURES = 16


def _c(shape: Shape) -> int:
    """The channel dim's size (dim 1), or the only dim's for a vector."""
    return shape[1] if len(shape) > 1 else shape[0]


def _spatial(shape: Shape, value: int) -> list[Any]:
    return [value, [value] * max(len(shape) - 2, 1)]


NAMED: dict[str, Callable[[Shape], list[Any]]] = {
    "dim": lambda s: [1, -1],
    "dim0": lambda s: [1],
    "dim1": lambda s: [-1],
    "dims": lambda s: [[1], [0, *reversed(range(1, len(s)))]],
    "start_dim": lambda s: [1],
    "end_dim": lambda s: [-1],
    "source": lambda s: [1],
    "destination": lambda s: [-1],
    "shape": lambda s: [[s[0], -1], list(s)],
    "size": lambda s: [[s[0], -1], list(s), 2],
    "kernel_size": lambda s: [2, 3],
    "stride": lambda s: [2],
    "padding": lambda s: [1],
    "dilation": lambda s: [1],
    "output_size": lambda s: _spatial(s, 4),
    "output_ratio": lambda s: [0.5],
    "upscale_factor": lambda s: [2],
    "downscale_factor": lambda s: [2],
    "groups": lambda s: [2],
    "num_groups": lambda s: [2],
    "normalized_shape": lambda s: [[s[-1]]],
    "pad": lambda s: [[1, 1], [1, 1, 1, 1]],
    "padding_size": lambda s: [1],
    "scale_factor": lambda s: [2.0],
    "p": lambda s: [0.5, 2.0],
    "k": lambda s: [2],
    "chunks": lambda s: [2],
    "split_size": lambda s: [2],
    "split_size_or_sections": lambda s: [2],
    "sections": lambda s: [2],
    "indices_or_sections": lambda s: [2],
    "split_sizes": lambda s: [[_c(s) // 2, _c(s) - _c(s) // 2], [s[0] // 2, s[0] - s[0] // 2]],
    "repeats": lambda s: [2],
    "diagonal": lambda s: [0],
    "offset": lambda s: [0],
    "n": lambda s: [2],
    "n_fft": lambda s: [16],
    "bins": lambda s: [10],
    "q": lambda s: [0.5],
    "lambd": lambda s: [0.5],
    "negative_slope": lambda s: [0.1],
    "threshold": lambda s: [0.1],
    "value": lambda s: [0.5],
    "min": lambda s: [-0.5],
    "max": lambda s: [0.5],
    "alpha": lambda s: [1.0],
    "beta": lambda s: [1.0],
    "eps": lambda s: [1e-5],
    "momentum": lambda s: [0.1],
    "training": lambda s: [False],
    "reduction": lambda s: ["mean"],
    "approximate": lambda s: ["none"],
    "equation": lambda s: ["...ij->...ji"],
    "in_features": lambda s: [s[-1]],
    "in1_features": lambda s: [s[-1]],
    "in2_features": lambda s: [s[-1]],
    "out_features": lambda s: [OUT_FEATURES],
    "in_channels": lambda s: [_c(s)],
    "out_channels": lambda s: [OUT_FEATURES],
    "num_features": lambda s: [_c(s)],
    "num_channels": lambda s: [_c(s)],
    "embed_dim": lambda s: [s[-1]],
    "d_model": lambda s: [s[-1]],
    "num_heads": lambda s: [2],
    "nhead": lambda s: [2],
    "input_size": lambda s: [s[-1]],
    "hidden_size": lambda s: [OUT_FEATURES],
    "num_layers": lambda s: [1],
    "num_embeddings": lambda s: [10],
    "embedding_dim": lambda s: [OUT_FEATURES],
    "num_classes": lambda s: [-1],
    "n_classes": lambda s: [12],
    "cutoffs": lambda s: [[4, 8]],
    "start": lambda s: [0],
    "end": lambda s: [16],
    "steps": lambda s: [16],
    "low": lambda s: [0],
    "high": lambda s: [10],
    "fill_value": lambda s: [0.5],
    "decimals": lambda s: [2],
    "unflattened_size": lambda s: [(2, -1)],
    "sizes": lambda s: [[2, -1]],
    "shifts": lambda s: [1],
}

# Name fragments (lower case) of operators this catalogue cannot run, with the reason code.
SCREEN: tuple[tuple[str, str], ...] = (
    ("sparse", "unsupported_sparse"),
    ("_coo", "unsupported_sparse"),
    ("_csr", "unsupported_sparse"),
    ("_csc", "unsupported_sparse"),
    ("_bsr", "unsupported_sparse"),
    ("_bsc", "unsupported_sparse"),
    ("quantize", "unsupported_quantized"),
    ("quantized", "unsupported_quantized"),
    ("fake_quant", "unsupported_quantized"),
    ("fbgemm", "unsupported_quantized"),
    ("int_repr", "unsupported_quantized"),
    ("q_per_channel", "unsupported_quantized"),
    ("q_scale", "unsupported_quantized"),
    ("q_zero_point", "unsupported_quantized"),
    ("cudnn", "needs_cuda"),
    ("miopen", "needs_cuda"),
    ("cufft", "needs_cuda"),
    ("syncbatchnorm", "unsupported_distributed"),
    ("dataparallel", "unsupported_distributed"),
    ("view_as_real", "unsupported_complex"),
    ("torch.imag", "unsupported_complex"),
)

# Name prefixes of torch callables that configure or query the runtime instead of computing.
NOT_OPERATORS = (
    "torch.is_",
    "torch.get_",
    "torch.set_",
    "torch.sym_",
    "torch.can_cast",
    "torch.promote_types",
    "torch.result_type",
    "torch.autocast_",
    "torch.clear_autocast",
    "torch.use_deterministic",
    "torch.are_deterministic",
    "torch.compile",
    "torch.vmap",
    "torch.cond",
    "torch.while_loop",
    "torch.fork",
    "torch.wait",
    "torch.seed",
    "torch.manual_seed",
    "torch.initial_seed",
    "torch.typename",
    "torch.load",
    "torch.save",
    "torch.from_",
    "torch.to_dlpack",
    "torch.frombuffer",
    "torch.import_ir",
    "torch.parse_",
    "torch.merge_type",
    "torch.unify_type",
    "torch.prepare_multiprocessing",
    "torch.init_num_threads",
    "torch.thread_safe",
    "torch.classproperty",
    "torch.profiler_",
    "torch.compiled_with",
    "torch.broadcast_shapes",
    "torch.numel",
    "torch.lobpcg",  # an iterative eigen-solver: seconds per call, not a kernel
    "F.assert_",
    "F.boolean_dispatch",
    "F.handle_torch_function",
    "F.Optional",
)

# nn classes that hold other modules but have no forward of their own (or none worth a task).
NO_FORWARD = {
    "nn.Module",
    "nn.Container",
    "nn.ModuleList",
    "nn.ModuleDict",
    "nn.ParameterList",
    "nn.ParameterDict",
}


# Everything a derived argument set cannot express; ``args`` lists (name, shape tokens or a
# value, options) and ``init`` named constructor arguments.
def _small_integers(high: int, *names: str) -> list[tuple]:
    """Tensor arguments of the input's shape holding integers in ``[0, high)``."""
    return [(name, "x", {"dtype": "int64", "high": high}) for name in names]


OVERRIDES: dict[str, dict[str, Any]] = {
    "nn.Sequential": {"init": [("layer", Code("nn.Linear(32, 32)"))], "ranks": (2,)},
    "nn.RNN": {"init": [("input_size", "L"), ("hidden_size", OUT_FEATURES)], "ranks": (3,)},
    "nn.LSTM": {"init": [("input_size", "L"), ("hidden_size", OUT_FEATURES)], "ranks": (3,)},
    "nn.GRU": {"init": [("input_size", "L"), ("hidden_size", OUT_FEATURES)], "ranks": (3,)},
    "nn.Transformer": {
        "init": [("d_model", "L"), ("nhead", 2), ("num_encoder_layers", 1)],
        "init_kwargs": [("num_decoder_layers", 1), ("dim_feedforward", 64)],
        "args": [("src", "x"), ("tgt", "x")],
        "ranks": (3,),
    },
    "nn.TransformerEncoder": {
        "init": [
            ("encoder_layer", Code("nn.TransformerEncoderLayer(32, 2, 64)")),
            ("num_layers", 1),
        ],
        "ranks": (3,),
    },
    "nn.TransformerDecoder": {
        "init": [
            ("decoder_layer", Code("nn.TransformerDecoderLayer(32, 2, 64)")),
            ("num_layers", 1),
        ],
        "args": [("tgt", "x"), ("memory", "x")],
        "ranks": (3,),
    },
    "nn.Fold": {
        "init": [("output_size", (4, 4)), ("kernel_size", 2)],
        "args": [("input", ("B", 32, 9))],
        "ranks": (3,),
    },
    "F.fold": {
        "args": [("input", ("B", 32, 9)), ("output_size", [4, 4]), ("kernel_size", 2)],
        "ranks": (3,),
    },
    "nn.GaussianNLLLoss": {
        "args": [("input", "x"), ("target", "x"), ("var", "x", {"uniform": (0.5, 1.5)})]
    },
    "F.gaussian_nll_loss": {
        "args": [("input", "x"), ("target", "x"), ("var", "x", {"uniform": (0.5, 1.5)})]
    },
    "torch.addmm": {
        "args": [("input", "x"), ("mat1", ("B", "L")), ("mat2", ("L", "L"))],
        "ranks": (2,),
    },
    "torch.addbmm": {
        "args": [("input", ("C", "L")), ("batch1", "x"), ("batch2", ("B", "L", "L"))],
        "ranks": (3,),
    },
    "torch.baddbmm": {
        "args": [("input", "x"), ("batch1", "x"), ("batch2", ("B", "L", "L"))],
        "ranks": (3,),
    },
    "torch.addmv": {"args": [("input", ("B",)), ("mat", "x"), ("vec", ("L",))], "ranks": (2,)},
    "torch.cross": {"args": [("input", ("B", 3)), ("other", ("B", 3))], "ranks": (2,)},
    "torch.convolution": {
        "args": [
            ("input", "x"),
            ("weight", (OUT_FEATURES, "C", 3, 3)),
            ("bias", None),
            ("stride", [1, 1]),
            ("padding", [0, 0]),
            ("dilation", [1, 1]),
            ("transposed", False),
            ("output_padding", [0, 0]),
            ("groups", 1),
        ],
        "ranks": (4,),
    },
    "F.linear": {
        "args": [("input", "x"), ("weight", (OUT_FEATURES, "L")), ("bias", (OUT_FEATURES,))]
    },
    "F.bilinear": {
        "args": [("input1", "x"), ("input2", "x"), ("weight", (OUT_FEATURES, "L", "L"))],
        "ranks": (2,),
    },
    "F.conv1d": {"args": [("input", "x"), ("weight", (OUT_FEATURES, "C", 3))], "ranks": (3,)},
    "F.conv2d": {"args": [("input", "x"), ("weight", (OUT_FEATURES, "C", 3, 3))], "ranks": (4,)},
    "F.conv3d": {
        "args": [("input", "x"), ("weight", (OUT_FEATURES, "C", 3, 3, 3))],
        "ranks": (5,),
    },
    "F.conv_transpose1d": {
        "args": [("input", "x"), ("weight", ("C", OUT_FEATURES, 3))],
        "ranks": (3,),
    },
    "F.conv_transpose2d": {
        "args": [("input", "x"), ("weight", ("C", OUT_FEATURES, 3, 3))],
        "ranks": (4,),
    },
    "F.conv_transpose3d": {
        "args": [("input", "x"), ("weight", ("C", OUT_FEATURES, 3, 3, 3))],
        "ranks": (5,),
    },
    "F.conv_tbc": {
        "args": [
            ("input", "x"),
            ("weight", (3, "L", OUT_FEATURES)),
            ("bias", (OUT_FEATURES,)),
            ("pad", 1),
        ],
        "ranks": (3,),
    },
    "F.embedding": {
        "args": [("input", "x", {"dtype": "int64", "high": 10}), ("weight", (10, OUT_FEATURES))],
        "ranks": (2,),
    },
    "F.embedding_bag": {
        "args": [("input", "x", {"dtype": "int64", "high": 10}), ("weight", (10, OUT_FEATURES))],
        "ranks": (2,),
    },
    "F.one_hot": {
        "args": [("tensor", "x", {"dtype": "int64", "high": 10}), ("num_classes", 10)],
        "ranks": (2,),
    },
    # Comparisons of random floats are constant (never equal; never zero for logical ops):
    # small integer inputs make the result depend on them.
    "torch.eq": {"args": _small_integers(3, "input", "other")},
    "torch.ne": {"args": _small_integers(3, "input", "other")},
    "torch.logical_not": {"args": _small_integers(2, "input")},
    "torch.count_nonzero": {"args": [*_small_integers(2, "input"), ("dim", -1)]},
    "torch.logical_and": {"args": _small_integers(2, "input", "other")},
    "torch.logical_or": {"args": _small_integers(2, "input", "other")},
    "torch.split": {"args": [("tensor", "x"), ("split_size_or_sections", 16), ("dim", -1)]},
    "F.grid_sample": {
        "args": [("input", "x"), ("grid", ("B", 8, 8, 2), {"uniform": (-1.0, 1.0)})],
        "ranks": (4,),
    },
    "F.ctc_loss": {
        "args": [
            ("log_probs", (16, 4, 6)),
            ("targets", (4, 5), {"dtype": "int64", "high": 5, "low": 1}),
            ("input_lengths", [16, 16, 16, 16]),
            ("target_lengths", [5, 5, 5, 5]),
        ],
    },
    "nn.CTCLoss": {
        "args": [
            ("log_probs", (16, 4, 6)),
            ("targets", (4, 5), {"dtype": "int64", "high": 5, "low": 1}),
            ("input_lengths", [16, 16, 16, 16]),
            ("target_lengths", [5, 5, 5, 5]),
        ],
    },
    "nn.AdaptiveLogSoftmaxWithLoss": {
        "args": [("input", "x"), ("target", ("B",), {"dtype": "int64", "high": 12})],
        "ranks": (2,),
    },
    "F.multi_head_attention_forward": {
        "args": [
            ("query", "x"),
            ("key", "x"),
            ("value", "x"),
            ("embed_dim_to_check", "L"),
            ("num_heads", 2),
            ("in_proj_weight", ("3L", "L")),
            ("in_proj_bias", ("3L",)),
            ("bias_k", None),
            ("bias_v", None),
            ("add_zero_attn", False),
            ("dropout_p", 0.0),
            ("out_proj_weight", ("L", "L")),
            ("out_proj_bias", ("L",)),
        ],
        "ranks": (3,),
    },
    "torch.bucketize": {"args": [("input", "x"), ("boundaries", Code("torch.linspace(-2, 2, 9)"))]},
    "torch.searchsorted": {
        "args": [("sorted_sequence", Code("torch.linspace(-2, 2, 9)")), ("input", "x")]
    },
    "torch.stft": {
        "args": [("input", (4, 256)), ("n_fft", 16), ("return_complex", True, {"keyword": True})]
    },
    "torch.affine_grid_generator": {
        "args": [("theta", ("B", 2, 3)), ("size", [4, 8, 16, 16]), ("align_corners", False)],
    },
    "F.affine_grid": {"args": [("theta", ("B", 2, 3)), ("size", [4, 8, 16, 16])]},
    "torch.native_batch_norm": {
        "args": [
            ("input", "x"),
            ("weight", ("C",)),
            ("bias", ("C",)),
            ("running_mean", ("C",)),
            ("running_var", ("C",), {"uniform": (0.5, 1.5)}),
            ("training", True),
            ("momentum", 0.1),
            ("eps", 1e-5),
        ],
    },
    "torch.polar": {"args": [("abs", "x", {"uniform": (0.1, 1.0)}), ("angle", "x")]},
    "torch.view_as_complex": {"args": [("input", ("B", 16, 2))]},
    "torch.scalar_tensor": {"args": [("s", 0.5)]},
    "torch.meshgrid": {
        "args": [("tensors", ("L",), {"count": 2}), ("indexing", "ij", {"keyword": True})]
    },
    "torch.einsum": {
        "args": [("equation", "bij,bjk->bik"), ("operands", ("B", "L", "L"), {"count": 2})],
        "ranks": (3,),
    },
}


# seeds.added_overrides: released-set operators the tables above missed, each written the way
# the released set calls it. Embedding's indices are the input; meta accepts float indices,
# so the derived float input passed there and failed on CPU.
ADDED_OVERRIDES: dict[str, dict[str, Any]] = {
    "nn.Embedding": {
        "init": [("num_embeddings", 10), ("embedding_dim", OUT_FEATURES)],
        "args": [("input", "x", {"dtype": "int64", "high": 10})],
        "ranks": (2,),
    },
    # A vector index in range of the selected dim (a derived index took the input's shape).
    "torch.index_select": {
        "args": [("input", "x"), ("dim", 1), ("index", (6,), {"dtype": "int64", "high": "C"})],
    },
    # Distinct indices: where two name one slot, which source row lands there is unspecified
    # on CUDA, so the task would have no single right answer.
    "torch.index_copy": {
        "args": [
            ("input", "x"),
            ("dim", 1),
            ("index", Code("torch.arange(0, 12, 2)")),
            ("source", ("B", 6, "L")),
        ],
        "ranks": (3,),
    },
    # Bitwise kernels take integers only; meta accepts floats, so the float set passed there.
    "torch.bitwise_xor": {"args": _small_integers(8, "input", "other")},
    # ``accepts``: the only ranks recorded, where meta cannot tell (its diagonal_scatter
    # checks neither the dims nor src's shape, so every rank would pass there).
    "torch.diagonal_scatter": {
        "args": [
            ("input", "x"),
            ("src", ("B", "C")),
            ("offset", 0, {"keyword": True}),
            ("dim1", 1, {"keyword": True}),
            ("dim2", 2, {"keyword": True}),
        ],
        "ranks": (3,),
        "accepts": (3,),
    },
}

# seeds.condition_overrides: torch.where in its three-argument form, a bool condition of the
# input's shape choosing between two operands, as the released set calls it (mostly
# ``torch.where(x > 0, x, other)``); the derived set was the one-argument form, an index
# tuple whose size is data, since the derivation gives a lone ``condition`` a float.
CONDITION_OVERRIDES: dict[str, dict[str, Any]] = {
    "torch.where": {
        "args": [("condition", "x", {"dtype": "bool"}), ("input", "x"), ("other", "x")],
    },
}

# Operators a SCREEN fragment names that run here all the same (seeds.added_overrides):
# SyncBatchNorm without an initialised process group is batch_norm, on any device.
UNSCREENED = frozenset({"nn.SyncBatchNorm"})
