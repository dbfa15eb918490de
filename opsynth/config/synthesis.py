"""Settings of the seed catalogue and the composers (``[seeds]``, ``[compose]``,
``[compose.llm]``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from opsynth.config.base import _Section, added_with

# CUDA Agent, Table 3: the released Ops-6K composition.
OPS6K_MIX: dict[str, float] = {
    "torch#1": 0.0340,
    "torch#2": 0.8377,
    "torch#3": 0.0762,
    "torch#4": 0.0280,
    "torch#5": 0.0123,
    "transformers": 0.0118,
}


# Model families the transformers seeds come from: every family of the released set's 50
# transformers classes, plus common language and vision families.
TRANSFORMERS_FAMILIES: list[str] = [
    "audio_spectrogram_transformer",
    "bert",
    "blip",
    "bridgetower",
    "bros",
    "conditional_detr",
    "convnext",
    "data2vec",
    "depth_anything",
    "dpt",
    "encodec",
    "ernie",
    "flava",
    "fnet",
    "glpn",
    "gpt2",
    "hiera",
    "levit",
    "llama",
    "mask2former",
    "maskformer",
    "megatron_bert",
    "mistral",
    "mobilebert",
    "mpnet",
    "nystromformer",
    "oneformer",
    "poolformer",
    "resnet",
    "seggpt",
    "speecht5",
    "swin",
    "swin2sr",
    "t5",
    "vit",
    "vitdet",
    "vitmatte",
    "wav2vec2",
    "xlm",
    "zoedepth",
]


class SeedsConfig(_Section):
    libraries: list[str] = Field(
        default=["torch", "transformers", "einops"],
        description="seed libraries whose operators are discovered, run and written as the seed "
        "catalogue (`opsynth seeds extract`), and which the composers draw from",
    )
    operators: list[str] = Field(
        default=[],
        description="only these operator names (Ops-6K spelling, e.g. nn.Conv2d); [] = all",
    )
    cache_dir: str = Field(
        default="",
        description="where extracted catalogues are kept across runs, keyed by the seeds config "
        "and the library versions; empty = $OPSYNTH_CACHE, else ~/.cache/opsynth; 'none' = "
        "extract into each run only",
    )
    plugins: dict[str, str] = Field(
        default={},
        description='more seed libraries, name = "module:attr" of an adapter (a class or '
        "factory whose specs() yields synth.catalog.spec.CatalogSpec)",
    )
    library_timeout_s: float = Field(
        default=240.0,
        gt=0,
        description="wall clock per library's extraction subprocess; a library still running "
        "then is killed, keeping the seeds it finished (full torch extraction takes ~1 min)",
    )
    seed_timeout_s: float = Field(
        default=20.0, gt=0, description="wall clock to validate one seed (meta + CPU runs)"
    )
    workers: int = Field(default=0, ge=0, description="libraries extracted at once; 0 = host cores")
    fill_uninitialized: bool = Field(
        json_schema_extra=added_with(False),
        default=True,
        description="validate seeds with memory torch leaves uninitialized filled with NaN, so "
        "an operator whose output is such memory (torch.empty and kin) is rejected every time; "
        "false = what catalogues were made with before (it passed or not by what the allocator "
        "held; v1.0.0's config pins it)",
    )
    added_overrides: bool = Field(
        json_schema_extra=added_with(False),
        default=True,
        description="derive the released set's operators the first argument tables missed "
        "from tables of their own (nn.Embedding with integer indices, torch.index_select with "
        "a vector index, torch.index_copy with distinct indices, torch.bitwise_xor on "
        "integers, torch.diagonal_scatter) and unscreen nn.SyncBatchNorm (batch_norm without a "
        "process group); false = what catalogues were made with before (v1.0.0's config pins "
        "it)",
    )
    condition_overrides: bool = Field(
        json_schema_extra=added_with(False),
        default=True,
        description="derive torch.where in its three-argument form (a bool condition of the "
        "input's shape, the input and another operand), as Ops-6K calls it, instead of the "
        "one-argument form the derivation finds; false = what catalogues were made with "
        "before (v1.0.0's config pins it)",
    )
    transformers_families: list[str] = Field(
        default=TRANSFORMERS_FAMILIES,
        description="transformers model families walked for layer classes (the released "
        "set's families and a few common ones); empty = every family, much slower",
    )
    transformers_max_per_family: int = Field(
        default=12, ge=1, description="layer classes tried per transformers family"
    )


class LlmConfig(_Section):
    """Where and how the LLM composer asks; the API key itself is never stored here."""

    base_url: str = Field(
        default="",
        pattern=r"^(https?://[^\s]+)?$",
        description="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 (vLLM, SGLang, "
        "llama.cpp); empty = $OPENAI_BASE_URL, else OpenAI's API",
    )
    model: str = Field(default="", description="model name the server knows; required for llm")
    api_key_env: str = Field(
        default="OPENAI_API_KEY",
        description="environment variable holding the API key (local servers accept any)",
    )
    temperature: float = Field(default=0.7, ge=0, le=2, description="sampling temperature")
    max_tokens: int = Field(
        default=2048, ge=16, description="completion cap; a 5-op task is ~600 tokens of code"
    )
    concurrency: int = Field(default=4, ge=1, description="requests in flight at once")
    max_retries: int = Field(
        default=4, ge=0, description="retries of a request after 429, 5xx, a timeout or no answer"
    )
    backoff_s: float = Field(
        default=1.0, ge=0, description="first retry delay, doubled per retry (Retry-After wins)"
    )
    backoff_max_s: float = Field(default=30.0, ge=0, description="longest retry delay")
    timeout_s: float = Field(default=300.0, gt=0, description="wall clock per request")
    cache_dir: str = Field(
        default="",
        description="on-disk reply cache keyed by (prompt, model, params), so a resumed run "
        "pays nothing twice; empty = <run>/llm-cache",
    )


class ComposeConfig(_Section):
    seed: int = Field(default=0, description="RNG seed: same seed, same candidates")
    composer: Literal["offline", "llm"] = Field(
        default="offline",
        description="offline = the shape-solving composer (no network); llm = an "
        "OpenAI-compatible server writes each task (see [compose.llm])",
    )
    mix: dict[str, float] = Field(
        default=OPS6K_MIX,
        description="data_source -> share of candidates (torch#k = k chained seed ops; "
        "transformers = a transformers seed as is); CUDA Agent's Table 3, re-normalised over "
        "the sources the seed set can supply",
    )
    profile: str = Field(
        default="ops6k",
        description="operator frequencies the composers aim for: ops6k = the released set's "
        "(data/profiles/ops6k.json), uniform = every catalogue operator alike, or a path to a "
        "profile JSON file of the same format",
    )
    profile_floor: float = Field(
        default=1.0,
        ge=0,
        description="weight (in released-task counts) of catalogue operators the profile does "
        "not name, so every operator of the catalogue can be drawn",
    )
    profile_min_weight: float = Field(
        default=8.0,
        ge=0,
        description="least weight of an operator the profile names, so the released set's rare "
        "operators are drawn often enough to appear in a run of thousands",
    )
    op_weights: dict[str, float] = Field(
        default={},
        description="seed op name -> multiplier of its profile weight; 0 never draws it",
    )
    oversample: float = Field(
        default=1.3,
        ge=1.0,
        description="candidates drawn per wanted task; the offline composer loses ~10% to filters",
    )
    max_attempts: int = Field(
        default=200,
        ge=1,
        description="op draws per wanted task before compose gives up (most succeed in a few)",
    )
    novelty_attempts: int = Field(
        default=20,
        ge=0,
        description="draws spent looking for an op sequence not yet drawn in this call before "
        "a repeat with new shapes is accepted (1-op sequences run out fast)",
    )
    feature_sizes: tuple[int, ...] = Field(
        default=(64, 128, 256, 512, 1024),
        description="last-dim sizes of 2-D and 3-D inputs, and sizes for Linear out_features, "
        "hidden sizes and embedding dims",
    )
    seq_lens: tuple[int, ...] = Field(
        default=(16, 32, 64, 128), description="middle-dim sizes of 3-D inputs"
    )
    channel_sizes: tuple[int, ...] = Field(
        default=(3, 8, 16, 32, 64), description="channels of 4-D/5-D inputs and conv out_channels"
    )
    spatial_sizes: tuple[int, ...] = Field(
        default=(16, 32, 64), description="height/width of 4-D inputs"
    )
    volume_sizes: tuple[int, ...] = Field(
        default=(8, 16), description="depth/height/width of 5-D inputs"
    )
    rank_weights: dict[int, float] = Field(
        default={1: 0.1, 2: 0.25, 3: 0.29, 4: 0.54, 5: 0.015},
        description="input rank -> relative weight, among the ranks a chain's first operator "
        "accepts; set so that accepted tasks' input ranks come near Ops-6K's (the filters "
        "reject rank-2 tasks more often, and rank-5 inputs also come from operators validated "
        "at rank 5)",
    )
    probe_rank_bonus: float = Field(
        default=2.0,
        ge=1,
        description="rank_weights multiplier for the rank a seed was validated at (a Conv2d's "
        "4-D input rather than its unbatched 3-D one)",
    )
    rebind_limit: int = Field(
        default=64,
        ge=1,
        description="argument sets derived per operator and input shape, among which "
        "solve_attempts are run on meta, those of the validated form first; each derived set "
        "costs compose time, and sizes and attributes vary separately (synth.solve.VARIED)",
    )
    max_vector_length: int = Field(
        default=1 << 24, ge=2, description="longest rank-1 input the cost model may pick"
    )
    solve_attempts: int = Field(
        default=4, ge=1, description="argument sets tried per operator before the chain is redrawn"
    )
    chunk_size: int = Field(
        default=250,
        ge=1,
        description="candidates composed per chunk; each chunk has its own RNG, so the "
        "candidates do not depend on how many processes composed them",
    )
    workers: int = Field(default=0, ge=0, description="compose processes; 0 = host cores")
    link_draws: int = Field(
        default=6,
        ge=1,
        description="operators drawn for each later position of a chain (among those whose "
        "recorded ranks and input dtype fit the running tensor) before the chain is redrawn",
    )
    variation_attempts: int = Field(
        default=1,
        ge=0,
        description="random variations of free sizes and attributes (out_features, kernel_size, "
        "dim, reduction...) tried before an operator's derived values",
    )
    tuple_output_share: float = Field(
        default=0.16,
        ge=0,
        le=1,
        description="share of chains that end on an operator returning a tuple (topk, LSTM, "
        "max(dim)) and return all of it; elsewhere such an operator continues on one element. "
        "Set so that about 11.5% of composed tasks return a tuple, above Ops-6K's ~10% "
        "because the filters reject tuple-returning tasks more often (0.18 before "
        "seeds.condition_overrides; v1.0.0's config pins it)",
    )
    int_input_share: float = Field(
        default=0.08,
        ge=0,
        le=1,
        description="chance that a chain's first operator is tried with integer or boolean "
        "inputs first (an index, a mask, integer operands), where it takes them",
    )
    multi_input_share: float = Field(
        default=0.3,
        ge=0,
        le=1,
        description="chance that an operator may take another batch-sized input (x + y, "
        "torch.cat([x, y]), a loss's target); otherwise it takes batch-free operands, which "
        "the task holds as parameters, or a value the chain has (reuse_share), or another "
        "operator is drawn. Set so that about 15% of composed tasks have several inputs, as "
        "in Ops-6K, with reuse_share at its default (0.2 before that setting; v1.0.0's "
        "config pins it)",
    )
    container_share: float = Field(
        json_schema_extra=added_with(0.0),
        default=0.04,
        ge=0,
        le=1,
        description="share of chains of two or more operators written with a container "
        "(nn.Sequential, nn.ModuleDict, nn.ParameterList, nn.ParameterDict, nn.Parameter) "
        "holding their modules or parameters, which counts as one of the chain's operators as "
        "Ops-6K counts it (its share: benchmarks/RESULTS.md; the profile's counts pick which "
        "container); 0 = none, and the profile's container counts go to the catalogue's "
        "uncategorised operators, what runs composed before (v1.0.0's config pins it)",
    )
    constant_operands: bool = Field(
        json_schema_extra=added_with(False),
        default=True,
        description="tensor constructors that take no tensor (torch.arange, torch.linspace, "
        "torch.scalar_tensor) are composed after the first operator as a constant operand: "
        "sized to the running tensor's last dim, built in forward on its device and "
        "multiplied or added to it, as Ops-6K combines them with its input; false = they are "
        "never composed (no input to compute from), what runs composed before (v1.0.0's "
        "config pins it)",
    )
    hold_integer_operands: bool = Field(
        json_schema_extra=added_with(False),
        default=True,
        description="an integer or bool tensor operand that does not follow the batch (an "
        "index_select index, a gather index, a small mask) is held by the model as a buffer "
        "drawn in __init__, as Ops-6K mostly holds them (an init input, a buffer, an "
        "attribute), instead of being a get_inputs input; false = every such operand is a "
        "task input, what runs composed before (v1.0.0's config pins it)",
    )
    reuse_share: float = Field(
        json_schema_extra=added_with(0.0),
        default=1.0,
        ge=0,
        le=1,
        description="chance that an operator whose arguments ask for another batch-sized "
        "operand, where the chain adds no input (1 - multi_input_share), takes a value the "
        "chain already has instead of not being taken there: the chain's input or an earlier "
        "operator's result of that operand's shape (a residual add, torch.cat((x, attn))), "
        "else one transposed to it (torch.bmm(x, x.transpose(-2, -1))), for an attention its "
        "running tensor (self.attn(x, x, x)), and for a bool operand such a value compared "
        "with zero (torch.where(x > 0, x, y)), as Ops-6K's tasks often do (synth/reuse.py); "
        "0 = no operand is taken from the chain, what runs composed before (v1.0.0's config "
        "pins it)",
    )
    batch_range: tuple[int, int] = Field(
        default=(2, 65536),
        description="batch sizes the cost model may pick (for a rank-1 input, its length); 2+ "
        "keeps BatchNorm's training-mode statistics defined",
    )
    target_forward_ms: float = Field(
        default=5.0,
        gt=0,
        description="estimated CPU eager forward the batch size is fitted to; near the log-middle "
        "of forward_window_ms so a 3x cost-model error stays inside it",
    )
    forward_window_ms: tuple[float, float] = Field(
        default=(1.0, 50.0),
        description="estimated CPU eager forward a composed task must fall in, else shapes are "
        "redrawn (GPU runtime is fitted later by measuring and rewriting `scale`)",
    )
    cpu_ms_per_melem: float = Field(
        default=0.3,
        gt=0,
        description="cost model: ms per million elements of a cheap elementwise op, for "
        "tensors under max_tensor_melems (measured: benchmarks/RESULTS.md)",
    )
    max_tensor_melems: float = Field(
        default=8.0,
        gt=0,
        description="largest tensor an op creates in forward, in millions of elements (32 MB "
        "fp32); above ~32 MB every fresh CPU output is mmapped and page-faulted, making eager "
        "time jump ~5x",
    )
    max_input_melems: float = Field(
        default=32.0,
        gt=0,
        description="largest input, in millions of elements (128 MB fp32); made once by "
        "get_inputs, not per forward, so it may exceed max_tensor_melems (a reduction's input)",
    )
    cpu_ms_per_gmac: float = Field(
        default=6.0,
        gt=0,
        description="cost model: ms per 1e9 multiply-adds of nn.Linear, fp32 (measured: "
        "benchmarks/RESULTS.md), for every matmul and convolution the chain calls",
    )
    distinct_rtol: float = Field(
        default=1e-3,
        gt=0,
        description="on the composer's sample run, outputs of two input draws (and of each "
        "input changed alone) must differ by more than this, relative (filters.distinct_rtol)",
    )
    trivial_tolerance: float = Field(
        default=1e-2,
        gt=0,
        description="on the sample run, an output that all zeros or its mean match within this "
        "atol and rtol is refused (the evaluator's tolerance, filters.compile_atol)",
    )
    full_reduction_share: float = Field(
        json_schema_extra=added_with(1.0),
        default=0.1,
        ge=0.0,
        le=1.0,
        description="share of the operators that would reduce their running tensor to a scalar "
        "(std, norm, a mean over everything) kept that way; the others are tried along dim 1 "
        "first, as Ops-6K mostly reduces (its share of whole-tensor calls: benchmarks/RESULTS.md); "
        "a statistic over a whole sized tensor also barely differs between input draws, which "
        "the filters reject as indistinguishable; "
        "1 = what runs composed before (v1.0.0's config pins it)",
    )
    refuse_input_answer: bool = Field(
        json_schema_extra=added_with(False),
        default=True,
        description="on the sample run, an output that one of the task's input tensors (of its "
        "shape and dtype) matches within trivial_tolerance is refused, as the filters refuse it "
        "(filters.input_as_answer): a lone clone or identity is no kernel to write; false = "
        "what runs composed before (v1.0.0's config pins it)",
    )
    every_output_distinct: bool = Field(
        json_schema_extra=added_with(False),
        default=True,
        description="on the sample run, a task returning several tensors is refused as "
        "indistinguishable when any one of them is the same for two input draws, as the filters "
        "refuse it (filters.every_output_distinct); false = only the outputs together, what runs "
        "composed before (v1.0.0's config pins it)",
    )
    stable_sort: bool = Field(
        json_schema_extra=added_with(False),
        default=True,
        description="torch.sort and torch.argsort are composed with stable=True: at the "
        "filters' sizes rows hold tied values, whose unstable order eager and torch.compile "
        "choose differently (compile_mismatch, whatever a kernel would do); false = the "
        "call as the catalogue has it, what runs composed before (v1.0.0's config pins it)",
    )
    explicit_dim: bool = Field(
        json_schema_extra=added_with(False),
        default=True,
        description="softmax, log_softmax and softmin (functions and modules) are composed "
        "with their dim, as Ops-6K writes them: without one torch picks it from the input's "
        "rank (across the batch of a 3-d input); false = the catalogue's form first, what "
        "runs composed before (v1.0.0's config pins it)",
    )
    optional_arguments: bool = Field(
        json_schema_extra=added_with(False),
        default=True,
        description="optional keyword arguments (a transposed convolution's stride, padding and "
        "output_padding, a reduction's keepdim, an LSTM's batch_first) are drawn as often and "
        "with the values the profile's set passes them (its 'arguments'; none for uniform); "
        "a set torch refuses falls back to the catalogue's arguments; false = required "
        "arguments only, what runs composed before (v1.0.0's config pins it)",
    )
    optional_draws: int = Field(
        json_schema_extra=added_with(1),
        default=3,
        ge=1,
        le=16,
        description="keyword sets drawn for an operator's call (with its catalogue sizes) "
        "before it falls back to the catalogue's arguments, when "
        "compose.optional_arguments is on: a value torch refuses at the chain's shape "
        "(F.interpolate's 'bilinear' on a 3-d tensor) is drawn again instead of dropping every "
        "keyword, so the shares come near the profile's among the calls torch accepts; "
        "1 = one draw, what runs composed before (v1.0.0's config pins it)",
    )
    sampled_shapes: bool = Field(
        json_schema_extra=added_with(False),
        default=True,
        description="an operator meta tensors cannot run (one whose output size follows its "
        "input's values: torch.masked_select, torch.nonzero, nn.AdaptiveLogSoftmaxWithLoss, "
        "which calls nonzero inside) is solved on two small CPU samples instead; where their "
        "output shapes differ it may only end a chain; false = such operators are never "
        "composed, what runs composed before (v1.0.0's config pins it)",
    )
    max_rms: float = Field(
        default=1e4,
        gt=0,
        description="largest estimated activation rms allowed along a chain; stacked sums grow "
        "fast and huge magnitudes make eager-vs-kernel comparisons brittle",
    )
    llm: LlmConfig = LlmConfig()

    @model_validator(mode="after")
    def _ranges_ordered(self) -> ComposeConfig:
        for name in ("batch_range", "forward_window_ms"):
            lo, hi = getattr(self, name)
            if not 0 < lo <= hi:
                raise ValueError(f"{name} must be [lo, hi] with 0 < lo <= hi, got [{lo}, {hi}]")
        if not self.forward_window_ms[0] <= self.target_forward_ms <= self.forward_window_ms[1]:
            raise ValueError("target_forward_ms must lie inside forward_window_ms")
        for name, weight in {**self.mix, **self.op_weights}.items():
            if weight < 0:
                raise ValueError(f"weight of {name!r} is negative ({weight})")
        if self.composer == "llm" and not self.llm.model:
            raise ValueError("composer 'llm' needs compose.llm.model (the server's model name)")
        return self
