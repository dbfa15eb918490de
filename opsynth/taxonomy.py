"""Operator categories: which kind of kernel an operator name stands for.

A task set's mix of categories says more about the kernels it asks for than its operator
names do (``nn.Conv2d`` and ``F.conv3d`` are one kind of work), so the fidelity report compares
category shares between a run and a reference set. Classification reads the name only, never
torch: it must work on names from any torch version, from a profile file, and on a machine
without torch.

A name is ``prefix.base`` (``nn.``, ``F.``, ``torch.``, ``torch.nn.functional.``,
``einops.``...) or bare: a Python operator symbol (``+``), a Tensor method (``add``), or a
transformers class (``HieraLayer_0``). The base is reduced to a spelling-free key (lower case,
no underscores, no ``1d/2d/3d``, no ``lazy``/``native``/backend prefixes, no in-place ``_``),
so ``nn.LogSoftmax``, ``F.log_softmax`` and ``torch.log_softmax`` meet in one table entry.
The key is looked up in ``EXACT``; unseen keys fall through ``KEYWORDS`` in order, so a torch
operator added later still lands in a sensible category. Names that are no computation
(containers, parameters, tensor factories, random sampling, spectral transforms, settings
and queries) and transformers classes are ``other``: a transformers class is a whole block
of several kinds, and guessing one category from its name would distort the shares.

Where a name could sit in two categories, the choice is made once here:

* ``matmul`` is every dense product: matmul/mm/bmm/linear/einsum and the fused ``addmm``
  family, attention (it is two products around a softmax), recurrent layers (LSTM/GRU/RNN
  are gate matmuls), transformer layers, ``EmbeddingBag`` (a sparse one-hot matrix times the
  table) and pairwise distances (``cdist``/``pdist``, a product per pair).
* ``indexing`` is data-dependent addressing and selection: index/gather/scatter/masked ops,
  ``where``, ``take``, ``isin``, ``bucketize``/``searchsorted``, ``nonzero``, embedding
  lookups, ``one_hot``, and sort-like selection (``sort``, ``argsort``, ``topk``,
  ``kthvalue``, ``argmax``/``argmin``, ``unique``): their cost is in where they read, not in
  arithmetic.
* ``reduction`` is every op that folds a dimension: sum/mean/prod/std/var/median/mode,
  min/max (``torch.max``; ``torch.maximum`` is elementwise), norms and distances to one
  value, ``all``/``any``/``equal``, histograms, and scans (``cumsum``, ``cummax``...).
* ``activation`` takes the nonlinearities in every spelling, ``torch.sigmoid`` and
  ``torch.tanh`` included, and softmax/log_softmax/softmin (row-wise, but used as
  activations).
* ``norm`` is normalisation layers and ``F.normalize``; ``torch.norm`` (a vector norm) is a
  reduction.
* ``layout`` moves data without arithmetic: views, reshapes, permutes, concatenation and
  splitting, flips and rolls, padding, resampling (``interpolate``, ``Upsample``,
  ``grid_sample``), pixel/channel shuffles, ``unfold``/``fold``, ``tril``/``triu``/``diag``,
  copies (``clone``, ``detach``).
* ``elementwise`` is pointwise math: arithmetic (also ``+``, ``add``, ``*``...), exp/log/
  pow/trig/rounding, clamp, comparisons and logical/bitwise ops, ``nan_to_num``, and dropout
  (a pointwise mask).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

CATEGORIES: tuple[str, ...] = (
    "conv",
    "matmul",
    "norm",
    "activation",
    "reduction",
    "pooling",
    "indexing",
    "elementwise",
    "layout",
    "loss",
)
OTHER = "other"

# Prefixes that only say where an operator lives; the base after them is what is classified.
PREFIXES = (
    "torch.nn.functional.",
    "torch.nn.modules.",
    "torch.nn.",
    "torch.Tensor.",
    "torch.special.",
    "torch.linalg.",
    "torch.",
    "nn.functional.",
    "nn.",
    "F.",
    "Tensor.",
    "einops.layers.torch.",
    "einops.",
)
# Namespaces whose members are always ``other``: spectral transforms, sampling, device plumbing.
OTHER_NAMESPACES = ("torch.fft.", "torch.distributions.", "torch.random.", "torch.cuda.")

SYMBOLS = {
    "+": "elementwise",
    "-": "elementwise",
    "*": "elementwise",
    "/": "elementwise",
    "//": "elementwise",
    "%": "elementwise",
    "**": "elementwise",
    "@": "matmul",
}

# Bases (raw, before normalisation) that are no computation: settings, queries, symbolic
# shape helpers, serialisation, quantisation plumbing, tensor construction.
META_PREFIXES = (
    "get_",
    "set_",
    "is_",
    "are_",
    "sym_",
    "q_",
    "quantize_",
    "fake_quantize",
    "from_",
    "to_",
    "parse_",
    "import_",
    "sparse_",
    "autocast",
    "clear_autocast",
    "choose_qparams",
    "use_deterministic",
    "profiler_",
    "init_num_threads",
    "prepare_multiprocessing",
    "fused_moving_avg",
)

_DIMS = re.compile(r"(?<=[a-z])[123]d(?=_|$)")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z][a-z])|(?<=[a-z])(?=[A-Z])")
_STRIPPED_PREFIXES = ("lazy", "native", "cudnn", "miopen", "mkldnn", "quantized", "unsafe")
_TRANSFORMERS_CLASS = re.compile(r"^[A-Z][A-Za-z0-9]*(_\d+)?$")


def _table(**groups: str) -> dict[str, str]:
    """``category="key key ..."`` groups as one key -> category dict."""
    return {key: cat for cat, keys in groups.items() for key in keys.split()}


# Exact keys (normalised: lower case, no underscores, no 1d/2d/3d). Listed where the keyword
# fallback would be wrong or ambiguous, and for most names the released Ops-6K uses (the rest,
# such as the ``nn.*Loss`` classes, reach their category by keyword).
EXACT: dict[str, str] = _table(
    conv="conv convtranspose convolution convtbc depthwiseconvolution",
    matmul=(
        "linear bilinear matmul mm bmm baddbmm addmm addbmm addmv addr mv dot vdot inner outer "
        "ger kron einsum tensordot chainmatmul multidot einmix embeddingbag lstm lstmcell gru "
        "grucell rnn rnncell rnnbase rnncellbase rnnrelu rnntanh rnnrelucell rnntanhcell "
        "multiheadattention multiheadattentionforward scaleddotproductattention transformer "
        "transformerencoder transformerdecoder transformerencoderlayer "
        "transformerdecoderlayer cdist pdist spmm smm dsmm hsmm hspmm saddmm sspaddmm "
        "groupedmm scaledmm scaledgroupedmm"
    ),
    norm=(
        "batchnorm syncbatchnorm layernorm groupnorm instancenorm rmsnorm localresponsenorm "
        "crossmaplrn normalize renorm batchnormelemt batchnormstats batchnormgatherstats "
        "batchnormgatherstatswithcounts batchnormupdatestats batchnormbackwardelemt "
        "batchnormbackwardreduce embeddingrenorm"
    ),
    activation=(
        "relu relu6 leakyrelu prelu rrelu elu selu celu gelu silu mish sigmoid logsigmoid "
        "hardsigmoid tanh hardtanh tanhshrink softshrink hardshrink softplus softsign softmax "
        "softmin logsoftmax glu threshold hardswish gumbelsoftmax"
    ),
    reduction=(
        "sum mean prod max min amax amin aminmax std var stdmean varmean median nanmedian "
        "nansum nanmean mode logsumexp norm normexceptdim frobeniusnorm nuclearnorm vectornorm "
        "matrixnorm dist all "
        "any countnonzero cumsum cumprod cummax cummin logcumsumexp cumulativetrapezoid trapz "
        "trapezoid histc histogram histogramdd bincount equal allclose cosinesimilarity "
        "pairwisedistance quantile nanquantile trace cov corrcoef segmentreduce reduce"
    ),
    pooling=(
        "maxpool avgpool adaptivemaxpool adaptiveavgpool lppool fractionalmaxpool maxunpool "
        "maxpoolwithindices adaptivemaxpoolwithindices fractionalmaxpoolwithindices"
    ),
    indexing=(
        "indexselect indexadd indexcopy indexfill indexput indexreduce gather scatter "
        "scatteradd scatterreduce maskedselect maskedfill maskedscatter where take "
        "takealongdim put isin bucketize searchsorted nonzero nonzerostatic argwhere "
        "embedding onehot topk sort argsort msort kthvalue argmax argmin unique "
        "uniqueconsecutive select selectscatter slicescatter diagonalscatter asstridedscatter "
        "trilindices triuindices unravelindex"
    ),
    elementwise=(
        "add sub mul div truedivide floordivide divide multiply subtract rsub pow floatpower "
        "exp exp2 expm1 log log2 log10 log1p logaddexp logaddexp2 sqrt rsqrt square abs "
        "absolute neg negative positive sign sgn signbit sin cos tan asin acos atan arcsin "
        "arccos arctan sinh cosh asinh acosh atanh arcsinh arccosh arctanh atan2 arctan2 "
        "sinc erf erfc erfinv floor ceil round trunc fix frac fmod remainder clamp clampmin "
        "clampmax clip minimum maximum fmin fmax lerp addcmul addcdiv reciprocal logit xlogy "
        "hypot lgamma digamma polygamma mvlgamma igamma igammac i0 deg2rad rad2deg nantonum "
        "isnan isinf isfinite isneginf isposinf isreal isclose logicaland logicalor logicalnot "
        "logicalxor bitwiseand bitwiseor bitwisexor bitwisenot bitwiseleftshift "
        "bitwiserightshift eq ne gt ge lt le greater greaterequal less lessequal notequal "
        "heaviside copysign nextafter ldexp frexp gcd lcm polar complex conj conjphysical "
        "real imag angle cross diff gradient fill zero dropout alphadropout "
        "featurealphadropout featuredropout erfcx"
    ),
    layout=(
        "view reshape permute transpose t adjoint cat concat concatenate stack hstack vstack "
        "dstack columnstack rowstack split splitwithsizes tensorsplit hsplit vsplit dsplit "
        "chunk unbind flip fliplr flipud roll rot90 pad constantpadnd reflectionpad "
        "replicationpad zeropad constantpad circularpad interpolate upsample upsamplebilinear "
        "upsamplenearest upsamplingbilinear upsamplingnearest pixelshuffle pixelunshuffle "
        "channelshuffle unfold fold tril triu diag diagonal diagembed diagflat blockdiag "
        "squeeze unsqueeze flatten unflatten expand expandas repeat repeatinterleave tile "
        "broadcastto broadcasttensors movedim moveaxis swapaxes swapdims narrow viewascomplex "
        "viewasreal clone detach contiguous meshgrid atleast ravel asstrided gridsample "
        "gridsampler affinegrid affinegridgenerator alias rearrange pack unpack resizeas "
        "resolveconj resolveneg vander combinations cartesianprod"
    ),
    loss=(
        "kldiv crossentropy binarycrossentropy binarycrossentropywithlogits nllloss ctcloss "
        "l1loss mseloss smoothl1loss huberloss adaptivelogsoftmaxwithloss"
    ),
    other=(
        "sequential moduledict modulelist parameterdict parameterlist parameter buffer "
        "uninitializedbuffer uninitializedparameter container module functional identity "
        "dataparallel arange linspace logspace range zeros ones full empty eye zeroslike "
        "oneslike fulllike emptylike emptystrided emptypermuted emptyquantized rand randn "
        "randint randlike randnlike randintlike randperm normal bernoulli multinomial poisson "
        "binomial scalartensor tensor astensor asarray stft istft numel intrepr dequantize "
        "optional assertintorpair booleandispatch handletorchfunction compile vmap cond "
        "whileloop fork wait load save seed manualseed initialseed typename cancast "
        "promotetypes resulttype unifytypelist mergetypefromtypecomment classproperty "
        "threadsafegenerator hashtensor broadcastshapes frombuffer fromfile "
        "bartlettwindow blackmanwindow hammingwindow hannwindow kaiserwindow parseshape "
        "asnumpy det logdet slogdet inverse pinverse cholesky choleskyinverse choleskysolve "
        "qr svd svdlowrank pcalowrank eig symeig lu lusolve luunpack lstsq solve "
        "triangularsolve geqrf orgqr ormqr lobpcg matrixexp matrixpower matrixrank "
        "linearcrossentropyoptions"
    ),
)

# Fallbacks for keys not in EXACT, tried in order: the first match wins. Order matters where
# names carry two words (``cudnn_convolution_relu`` is a conv, ``rnn_relu`` a matmul,
# ``linear_cross_entropy`` a loss, ``adaptive_max_pool`` a pool, ``count_nonzero`` a reduction).
KEYWORDS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), cat)
    for pattern, cat in (
        (r"loss|crossentropy|kldiv", "loss"),
        (r"conv(?!ert)", "conv"),
        (r"pool", "pooling"),
        (
            r"attention|lstm|gru|rnn|linear|matmul|einsum|tensordot|transformer|bmm|addmm|"
            r"addmv|^mm|^mv$|dot$|outer|kron|spmm|gemm|cdist|pdist|embeddingbag",
            "matmul",
        ),
        (r"norm(?!al)|lrn", "norm"),
        (
            r"relu|elu$|gelu|silu|mish|sigmoid|^tanh|hardtanh|shrink|softplus|softsign|"
            r"softmax|softmin|hardswish|glu$|threshold",
            "activation",
        ),
        (
            r"^cum|cumsum|cumprod|logsumexp|countnonzero|hist|quantile|median|^nan(sum|mean)",
            "reduction",
        ),
        (
            r"index|gather|scatter|masked|where|take|select|isin$|bucketize|searchsorted|"
            r"nonzero|embedding|onehot|topk|sort|argmax|argmin|kthvalue|unique",
            "indexing",
        ),
        (
            r"pad|interpolate|upsampl|shuffle|flip|roll|rot90|split|chunk|stack|concat|"
            r"transpose|permute|reshape|view|squeeze|flatten|expand|repeat|tile|fold|tril|triu|"
            r"diag|movedim|moveaxis|swap|narrow|meshgrid|atleast|broadcast|ravel|gridsampl|"
            r"affinegrid|clone|detach|contiguous|strided|slice|unbind|resize|alias|rearrange",
            "layout",
        ),
        (r"^(sum|mean|prod|std|var|amax|amin|max|min|all|any)$|(std|var)mean$", "reduction"),
        (
            r"^(log|exp|sqrt|rsqrt|pow|abs|neg|sin|cos|tan|asin|acos|atan|arc|erf|floor|ceil|"
            r"round|trunc|clamp|clip|add|sub|mul|div|true|logical|bitwise|sign|remainder|fmod|"
            r"lerp|hypot|isnan|isinf|isfinite|square|reciprocal|frac|xlogy|rad|deg|copysign|"
            r"heaviside|ldexp|frexp|logit|polar|conj|real|imag|angle|sgn|greater|less|"
            r"notequal|special)|gamma|dropout|nantonum|bessel|zeta|entr|ndtr|expit|xlog1py",
            "elementwise",
        ),
    )
)


def split_name(op_name: str) -> tuple[str, str]:
    """``(prefix, base)``: ``("nn.", "Conv2d")``, ``("", "add")``, ``("", "+")``."""
    name = op_name.strip()
    for prefix in PREFIXES:
        if name.startswith(prefix) and len(name) > len(prefix):
            return prefix, name[len(prefix) :]
    return "", name


def normal_key(base: str) -> str:
    """The spelling-free key of a base name: ``ConvTranspose2d`` and ``conv_transpose2d`` both
    give ``convtranspose``; ``LazyBatchNorm1d`` and ``native_batch_norm`` give ``batchnorm``."""
    snake = _CAMEL.sub("_", base).lower()
    snake = _DIMS.sub("", snake)
    parts = [p for p in snake.split("_") if p]
    while len(parts) > 1 and parts[0] in _STRIPPED_PREFIXES:
        parts = parts[1:]
    return "".join(parts)


def category(op_name: str) -> str:
    """The category of one operator name: one of ``CATEGORIES``, or ``other`` for names that
    are no computation, transformers classes, and names no rule recognises."""
    name = op_name.strip()
    if name in SYMBOLS:
        return SYMBOLS[name]
    if name.startswith(OTHER_NAMESPACES):
        return OTHER
    prefix, base = split_name(name)
    if not prefix and _TRANSFORMERS_CLASS.match(base):
        return OTHER  # a bare CamelCase name is a transformers block, not a torch operator
    raw = base.rstrip("_").lower()
    if not raw or raw.startswith(META_PREFIXES):
        return OTHER
    key = normal_key(base.rstrip("_"))
    found = EXACT.get(key)
    if found is None and raw.endswith("_copy"):  # permute_copy is a permute; index_copy is not
        key = normal_key(base.rstrip("_")[: -len("_copy")])
        found = EXACT.get(key)
    if found is not None:
        return found
    for pattern, cat in KEYWORDS:
        if pattern.search(key):
            return cat
    return OTHER


def task_categories(ops: Sequence[str]) -> frozenset[str]:
    """The categories a task's operators fall in (``other`` included when one does)."""
    return frozenset(category(op) for op in ops)
