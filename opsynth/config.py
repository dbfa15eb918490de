"""All configuration in one typed place. ``configs/default.toml`` mirrors these defaults.

Every number a stage uses lives here with the reason for its default, so a run is fully
described by its config (and its hash, which keys the content-addressed stage outputs).
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

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


class ConfigError(ValueError):
    """A config problem, reported to the user as one line."""


# Marks a setting that changes how fast or where work runs, never what it decides: work files'
# keys (``_Section.work_dump``) hash it at its default, so tuning it reuses the work done.
SPEED_ONLY: dict[str, object] = {"speed_only": True}
# Marks a setting added after runs were made, whose default keeps what they did: left out of
# work keys and config hashes while at its default, so adding it invalidates no work on disk
# and no recorded hash (a release made over several invocations resumes); set otherwise, it is
# hashed like any setting that decides.
ADDED_AT_DEFAULT: dict[str, object] = {"added_at_default": True}


def added_with(earlier: object) -> dict[str, object]:
    """Marks a setting added after runs were made whose default changes what runs do:
    left out of work keys and config hashes while at ``earlier``, what runs did before it
    existed, so a run made then resumes with the setting pinned to ``earlier`` in its config
    (its keys and hash unchanged), and a new run hashes the new default like any setting."""
    return {"added_with": earlier}


def _left_out_of_keys(extra: dict[str, object], value: object, default: object) -> bool:
    if extra == ADDED_AT_DEFAULT:
        return value == default
    return "added_with" in extra and value == extra["added_with"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def work_dump(self) -> dict[str, object]:
        """The section as JSON with every ``SPEED_ONLY`` setting at its default and every
        ``ADDED_AT_DEFAULT`` one left out while at its default (an ``added_with`` one while at
        its earlier value): what a work file's key hashes,
        so a resumed run with more workers, another shard size or process reuse finds the work
        an earlier invocation wrote, and so does one made before a setting was added (at the
        defaults, ``model_dump`` less the added settings)."""
        data = self.model_dump(mode="json")
        defaults = type(self)().model_dump(mode="json")
        for name, field in type(self).model_fields.items():
            extra = field.json_schema_extra or {}
            if extra == SPEED_ONLY:
                data[name] = defaults[name]
            elif _left_out_of_keys(extra, data[name], defaults[name]):
                del data[name]
        return data


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
        default=0.18,
        ge=0,
        le=1,
        description="share of chains that end on an operator returning a tuple (topk, LSTM, "
        "max(dim)) and return all of it; elsewhere such an operator continues on one element. "
        "Above Ops-6K's ~10% because the filters reject tuple-returning tasks more often",
    )
    int_input_share: float = Field(
        default=0.08,
        ge=0,
        le=1,
        description="chance that a chain's first operator is tried with integer or boolean "
        "inputs first (an index, a mask, integer operands), where it takes them",
    )
    multi_input_share: float = Field(
        default=0.2,
        ge=0,
        le=1,
        description="chance that an operator may take another batch-sized input (x + y, "
        "torch.cat([x, y]), a loss's target); otherwise it takes batch-free operands, which "
        "the task holds as parameters, or another operator is drawn. Set so that about 15% "
        "of accepted tasks have several inputs, as in Ops-6K",
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
    refuse_input_answer: bool = Field(
        json_schema_extra=added_with(False),
        default=True,
        description="on the sample run, an output that one of the task's input tensors (of its "
        "shape and dtype) matches within trivial_tolerance is refused, as the filters refuse it "
        "(filters.input_as_answer): a lone clone or identity is no kernel to write; false = "
        "what runs composed before (v1.0.0's config pins it)",
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


# Filter reasons a task can get only because other workers' candidates shared its device (its
# memory, its CUDA contexts, its time slices): the ones ``filters.retry_alone`` may name. Codes
# of ``filters/reasons.py`` (a test keeps the two in step).
NEIGHBOUR_REASONS = ("oom", "resource_limit", "timeout", "cuda_error", "worker_lost")


class FiltersConfig(_Section):
    task_modules: list[str] = Field(
        default=["einops"],
        description="modules a task may import besides torch and a few pure standard ones: the "
        "seed libraries whose operators composed tasks call",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto", description="auto = cuda when available, else cpu"
    )
    workers: int = Field(
        json_schema_extra=SPEED_ONLY,
        default=0,
        ge=0,
        description="sandboxed workers; 0 = from host cores",
    )
    task_timeout_s: float = Field(default=120.0, gt=0, description="wall clock per candidate")
    memory_limit_gb: float = Field(
        default=8.0,
        gt=0,
        description="per-candidate memory cap: RLIMIT_AS on CPU; on CUDA (which reserves huge "
        "virtual ranges) the worker's resident-memory watchdog",
    )
    recycle_after: int = Field(
        json_schema_extra=SPEED_ONLY, default=50, ge=1, description="candidates per worker life"
    )
    candidates_per_process_cuda: int = Field(
        json_schema_extra=SPEED_ONLY,
        default=1,
        ge=1,
        description="on CUDA, candidates one sandboxed process may run in turn. 1 (the default) "
        "= a fresh process per candidate, so no candidate's verdict can depend on another's. "
        "Above 1 a process takes the next candidate after passing the state audit "
        "(filters.state_audit), which runs inside that process and so is the candidate's own "
        "claim: faster (a host creates CUDA contexts one at a time; rates at 1 and 8 in "
        "benchmarks/RESULTS.md), for a candidate that forges a clean audit can bias the next "
        "one's samples",
    )
    candidates_per_process_cpu: int = Field(
        json_schema_extra=SPEED_ONLY,
        default=1,
        ge=1,
        description="the same on CPU, where a process costs a fork of a warm worker but the "
        "audit's baseline costs one small torch.compile (timed in benchmarks/RESULTS.md)",
    )
    judge: bool = Field(
        default=True,
        description="after a candidate's own stages pass, the worker re-derives the decisive "
        "facts outside the candidate's process, from seeds and a clock the candidate cannot "
        "reach (the verify stage, filters.verify); false = the candidate's own rows decide, "
        "which a candidate that patches its process can forge",
    )
    judge_every_degenerate_fact: bool = Field(
        json_schema_extra=added_with(False),
        default=True,
        description="verify also re-derives the two degenerate facts it would otherwise take "
        "from the candidate's own stage (each input's influence on the output, the output's "
        "mean as a trivial answer), so no degenerate verdict rests on the candidate's process; "
        "false = what runs did before (v1.0.0's config pins it)",
    )
    input_as_answer: bool = Field(
        json_schema_extra=added_with(False),
        default=True,
        description="an output equal to one of the task's input tensors (same shape and "
        "dtype, within compile_atol/rtol) is trivial_answer: a kernel that hands back its "
        "input passes the evaluator; checked in the candidate's degenerate stage and again in "
        "verify. false = not checked, as runs did before (v1.0.0's config pins it)",
    )
    nested_inputs: bool = Field(
        json_schema_extra=added_with(False),
        default=True,
        description="tensors inside list or tuple inputs (get_inputs() returning [x, [y, z]]) "
        "are inputs to the checks: each must move the output (input_ignored) and stay "
        "unwritten (input_mutated), in the candidate's stages and in verify; false = only "
        "top-level tensors count, as runs did before (v1.0.0's config pins it)",
    )
    timing_in_verify: bool = Field(
        json_schema_extra=added_with(False),
        default=True,
        description="with the judge on, the runtime window is decided in verify alone: the "
        "eager and compiled forwards are timed there, in one section holding the GPU alone, "
        "by the candidate process's device events, which the worker accepts only within its "
        "own clock's time for the same request; the candidate's runtime stage and compile's "
        "timed runs are skipped. One exclusive section per candidate instead of three. false "
        "= the candidate's own runtime stage applies the window, verify re-checks it by the "
        "worker's clock with edge_tolerance (v1.0.0's config pins it)",
    )
    timed_sample_positions: int = Field(
        json_schema_extra=added_with(2048),
        default=16,
        ge=1,
        le=2048,
        description="values per output in the sample that follows each of verify's timed "
        "runs, whose checksums make the worker's clock include the whole output's work; its "
        "values are compared with nothing, so few suffice; the judge's full count (2048) "
        "charged a forward returning many tensors their samples' JSON, enough to make it "
        "too_slow. 2048 = what runs did before (v1.0.0's config pins it)",
    )
    warmup_runs: int = Field(default=3, ge=0)
    timed_runs: int = Field(default=10, ge=1, description="eager median over this many runs")
    batch_timers: bool = Field(
        json_schema_extra=SPEED_ONLY,
        default=True,
        description="timed sections queued for a GPU all run, one by one, before untimed GPU "
        "work resumes, so the forwards in flight drain once per batch of timers; false = "
        "timers and untimed sections alternate (filters.gpulock)",
    )
    window_ms_cuda: tuple[float, float] = Field(
        default=(1.0, 100.0), description="eager runtime window on a GPU (CUDA Agent's)"
    )
    window_ms_cpu: tuple[float, float] = Field(
        default=(0.1, 1000.0),
        description="eager runtime window on CPU; CPUs are ~100x slower, so it is wider",
    )
    compile_atol: float = Field(default=1e-2, description="evaluator's tolerance")
    compile_rtol: float = Field(default=1e-2, description="evaluator's tolerance")
    input_draws: int = Field(default=3, ge=2, description="independent input draws compared")
    distinct_rtol: float = Field(
        default=1e-3, description="outputs of different inputs must differ by more than this"
    )
    determinism_atol: float = Field(
        default=1e-6, description="repeated runs on the same inputs may differ by at most this"
    )
    shard_size: int = Field(
        json_schema_extra=SPEED_ONLY, default=64, ge=1, description="candidates per Prefect task"
    )
    retry_alone: list[str] = Field(
        default=["oom"],
        description="final reasons that can come from sharing the device with the pool's other "
        "workers (their candidates hold GPU memory); a task that ends with one runs once more "
        "alone after the batch, and that verdict stands. [] = never",
    )
    retry_memory_fraction: float = Field(
        default=0.75,
        gt=0,
        le=1,
        description="retried tasks whose measured needs (held + asked, from the oom message) "
        "sum to at most this share of the device's memory re-run side by side; the rest "
        "covers what the message cannot show (later allocations, other processes' contexts)",
    )
    determinism_rtol: float = Field(
        default=1e-5,
        ge=0,
        description="relative slack for repeated runs: GPU reductions with atomics reorder float "
        "sums (~1e-7 relative); real nondeterminism (torch.empty, races) is far larger",
    )
    device_speed_factor: float = Field(
        default=1.0,
        gt=0,
        description="measured eager ms are multiplied by this before the window check, to "
        "emulate a reference device (Ops-6K was filtered on H20s; a faster GPU needs > 1); "
        "derive it with filters.calibrate",
    )
    sandbox: Literal["auto", "bwrap", "rlimits"] = Field(
        default="auto",
        description="worker isolation: bubblewrap (namespaces, an unprivileged uid, a seccomp "
        "filter), or rlimits only (contains resource use, not file/network/process access); "
        "auto = bwrap, or rlimits when bwrap is unusable and allow_unsafe is set",
    )
    allow_unsafe: bool = Field(
        default=False,
        description="let untrusted candidates and solutions run without the bubblewrap sandbox "
        "(sandbox = rlimits, or auto where bwrap is unusable); off, such a run is refused",
    )
    sandbox_uid: int = Field(
        default=65534,
        ge=1,
        description="host uid and gid the sandbox runs as when opsynth runs as root (65534 is "
        "nobody); the GPU lock dir the sandbox writes is owned by it",
    )
    cache_dir: str = Field(
        json_schema_extra=SPEED_ONLY,
        default="",
        description="where the trusted torch.compile cache layer is kept (built once per host, "
        "device and library versions, read-only to candidates, whose own caches are private); "
        "empty = $XDG_CACHE_HOME/opsynth or ~/.cache/opsynth",
    )
    start_timeout_s: float = Field(
        json_schema_extra=SPEED_ONLY,
        default=300.0,
        gt=0,
        description="a worker must import torch and probe its device within this; cold file "
        "caches on network filesystems make the first torch import slow",
    )
    grace_s: float = Field(
        default=30.0,
        gt=0,
        description="orchestrator slack beyond task_timeout_s before a silent worker counts as "
        "hung; covers the worker's own kill, reap and report",
    )
    max_processes: int = Field(
        default=256,
        ge=8,
        description="processes + threads a candidate may run at once; torch needs a few dozen, "
        "a fork bomb far more; RLIMIT_NPROC does not bind root, so the worker's watchdog counts",
    )
    output_limit_kb: int = Field(
        default=1024,
        ge=1,
        description="stdout/stderr a candidate may write: a task that prints in forward is a "
        "bad benchmark, and a flood must not fill the worker's tmpfs",
    )
    file_size_limit_mb: int = Field(
        default=256,
        ge=1,
        description="RLIMIT_FSIZE: the largest file a candidate may write; compile artefacts "
        "are a few MB",
    )
    tmp_size_mb: int = Field(
        default=1024,
        ge=16,
        description="size of each sandboxed worker's private /tmp and /dev/shm (tmpfs, so RAM)",
    )
    cores_per_worker: int = Field(
        json_schema_extra=SPEED_ONLY,
        default=2,
        ge=1,
        description="on CPU, workers = 0 derives host cores / this: a CPU candidate's forwards "
        "use intra-op threads besides its torch.compile",
    )
    cores_per_gpu_worker: int = Field(
        json_schema_extra=SPEED_ONLY,
        default=1,
        ge=1,
        description="on CUDA, workers = 0 derives host cores / this: a GPU candidate keeps about "
        "one core busy (torch.compile with compile threads = 1, plus a ptxas subprocess now and "
        "then) while its forwards run on the GPU",
    )
    prestart_child: bool = Field(
        json_schema_extra=SPEED_ONLY,
        default=True,
        description="each worker forks its next candidate's process while the current one runs, "
        "so the CUDA context (seconds with many workers per GPU) is ready when the candidate "
        "starts; the waiting process has run no candidate code and is checked before use",
    )
    max_workers_per_gpu: int = Field(
        json_schema_extra=SPEED_ONLY,
        default=16,
        ge=1,
        description="workers = 0 caps workers per GPU here; timing is serialised per GPU (the GPU "
        "lock) and torch.compile is CPU-bound, so workers mostly add compile parallelism "
        "(16 against 20 on one H200: benchmarks/RESULTS.md)",
    )

    def window_ms(self, device: str) -> tuple[float, float]:
        """The runtime window that applies on ``device`` ("cuda" or "cpu")."""
        return self.window_ms_cuda if device == "cuda" else self.window_ms_cpu

    def candidates_per_process(self, device: str) -> int:
        """How many candidates one process may run in turn on ``device``."""
        if device == "cuda":
            return self.candidates_per_process_cuda
        return self.candidates_per_process_cpu

    @model_validator(mode="after")
    def _windows_ordered(self) -> FiltersConfig:
        for name in ("window_ms_cuda", "window_ms_cpu"):
            lo, hi = getattr(self, name)
            if not 0 <= lo < hi:
                raise ValueError(f"{name} must be [lo, hi] with 0 <= lo < hi, got [{lo}, {hi}]")
        unknown = [r for r in self.retry_alone if r not in NEIGHBOUR_REASONS]
        if unknown:
            raise ValueError(
                f"retry_alone: {unknown} cannot come from sharing the device; "
                f"choose from {list(NEIGHBOUR_REASONS)}"
            )
        return self


class SizingConfig(_Section):
    """Measure-and-rescale of each candidate's batch before the filters (``filters.sizing``)."""

    enabled: bool = Field(
        default=True,
        description="probe each candidate's eager runtime in the sandbox and rescale its batch "
        "toward the runtime window's log-middle before filtering",
    )
    constant_names: list[str] = Field(
        default=["batch_size"],
        min_length=1,
        description="module-level constants that size a task (first found wins); its value must "
        "hold exactly one integer literal, which is rewritten",
    )
    band: float = Field(
        default=3.0,
        gt=1,
        description="a task within this factor of the log-middle is left as it is (3 -> "
        "3.3-30 ms for a 1-100 ms window): close enough that device noise cannot push it out",
    )
    max_steps: int = Field(default=3, ge=1, description="rescale-and-measure rounds per task")
    max_step_scale: float = Field(
        default=64.0,
        gt=1,
        description="largest factor one step may change the batch by; small sizes are "
        "launch-bound, so one measurement can overstate how far to go",
    )
    max_value: int = Field(
        default=1 << 28,
        ge=1,
        description="the batch never grows beyond this; high, because a rank-1 task's batch is "
        "its length and a cheap elementwise chain needs hundreds of millions of elements to "
        "fill a millisecond on a large GPU (max_device_gib is the bound that matters there)",
    )
    max_device_gib: float = Field(
        default=8.0,
        ge=0,
        description="cap on a sized task's device-memory peak as its probe measured it (GPU "
        "only): it never grows past the cap, and one over it shrinks. Uncapped, tasks sized to "
        "fill the window on a large GPU can hold tens of GB, more than 16 filter workers can "
        "share and more than a smaller GPU can train or evaluate on. 8 GiB: 16 side by side "
        "fit a 141 GB GPU, one fits any 16 GB GPU; 0 = no cap",
    )
    probe_warmup_runs: int = Field(
        default=1,
        ge=0,
        description="untimed runs before a sizing probe's timed ones; the probe's eager stage "
        "has already run the model once",
    )
    probe_timed_runs: int = Field(
        default=3,
        ge=1,
        description="timed runs of a sizing probe (their median is the measurement). A probe "
        "needs only to land within the band (a factor of 3), not the filters' precision, and "
        "every timed run holds the GPU exclusively, which all workers queue for",
    )
    probe_exclusive: bool = Field(
        json_schema_extra=ADDED_AT_DEFAULT,
        default=True,
        description="time a sizing probe's runs holding the GPU alone, as the runtime stage "
        "times its own; off, they run in the shared section beside the other workers' GPU work. "
        "A probe needs only to land within the band (a factor of 3), and every exclusive "
        "section first drains the device of every worker's work; the runtime stage's window "
        "is timed alone either way",
    )
    pipelined: bool = Field(
        json_schema_extra=SPEED_ONLY,
        default=True,
        description="on the in-process pool (runner.kind local), move each candidate on as its "
        "own probe returns, to its next probe or its filter run, instead of sizing the chunk "
        "in lockstep rounds and filtering after the last; the same decisions either way",
    )
    inline: bool = Field(
        json_schema_extra=SPEED_ONLY,
        default=True,
        description="with pipelined, a candidate's probes run in its own filter process, "
        "before its stages (filters.size_inline): one sandboxed process, and one CUDA context, "
        "per candidate instead of one per probe plus one. The chosen size is then the "
        "candidate's claim (ARCHITECTURE.md's threat model); a candidate whose process dies "
        "before it reports one is sized by separate probes",
    )
    inline_timeout_s: float = Field(
        json_schema_extra=SPEED_ONLY,
        default=60.0,
        gt=0,
        description="wall clock added to filters.task_timeout_s for a job that sizes inline",
    )


class EvalConfig(_Section):
    """The bundled evaluator (``evaluator/``): CUDA Agent's correctness, timing and reward."""

    atol: float = Field(default=1e-2, gt=0, description="output tolerance (CUDA Agent's)")
    rtol: float = Field(default=1e-2, gt=0, description="output tolerance (CUDA Agent's)")
    trials: int = Field(default=5, ge=1, description="fresh input draws compared for correctness")
    strict: bool = Field(
        default=True,
        description="block torch.nn.functional and Python-level torch compute inside "
        "ModelNew (CUDA Agent's rule); off only to sanity-check the harness with the reference",
    )
    warmup_runs: int = Field(default=5, ge=0)
    timed_runs: int = Field(default=50, ge=3, description="median over this many timed calls")
    input_sets: int = Field(
        default=4,
        ge=2,
        description="the agent's in-process feedback (trainer.commands profile) cycles its "
        "timed calls through this many prepared input sets; the judged scorer draws a fresh "
        "input for every timed call",
    )
    margin: float = Field(
        default=0.05, ge=0, description="'faster' means more than this fraction faster"
    )
    review_speedup: float = Field(
        default=10.0, gt=1, description="speedups above this are flagged for review"
    )
    time_on_cpu: bool = Field(
        default=False,
        description="time on CPU too; off by default, so CPU scoring is the correctness path "
        "and rewards are -1 or 1",
    )
    timeout_s: float = Field(
        default=900.0,
        gt=0,
        description="per solution, building its extension included (nvcc takes minutes)",
    )


class DecontamConfig(_Section):
    threshold: float = Field(
        default=0.9, ge=0, le=1, description="drop above this AST similarity (CUDA Agent's)"
    )
    levels: list[int] = Field(default=[1, 2, 3], description="KernelBench levels to compare")
    exact_max: bool = Field(
        default=True,
        description=(
            "report every row's exact max similarity; false only scores pairs whose upper bound "
            "exceeds the threshold (same drops, rows carry the bound; for 100k+ pools)"
        ),
    )
    workers: int = Field(default=0, ge=0, description="processes for large sets; 0 = host cores")


class DedupConfig(_Section):
    exact: bool = Field(default=True, description="drop tasks whose normalised code repeats")
    near: bool = Field(default=True, description="drop near-duplicates (MinHash LSH, verified)")
    near_threshold: float = Field(
        default=0.85,
        gt=0,
        le=1,
        description=(
            "Jaccard of normalised AST shingles for near-duplicates; 0.85 joins tasks that differ "
            "in one size or constant, not tasks that differ in an operator"
        ),
    )
    num_perm: int = Field(
        default=128, ge=16, le=1024, description="MinHash permutations (LSH candidate recall)"
    )
    structural: bool = Field(
        default=True,
        description=(
            "drop tasks whose forward dataflow graph repeats (same operators and wiring, other "
            "sizes), so a regenerated set does not spend its rows on one kernel at many sizes"
        ),
    )
    wl_iterations: int = Field(
        default=3, ge=1, le=10, description="Weisfeiler-Lehman rounds of the structural hash"
    )
    workers: int = Field(default=0, ge=0, description="processes for large sets; 0 = host cores")


class PublishConfig(_Section):
    """Publishing a finished run as a Hugging Face Hub dataset (``opsynth publish``, and the
    ``publish`` stage of ``opsynth run`` when ``repo_id`` is set). The token is never stored
    here: huggingface_hub reads HF_TOKEN or the login saved by ``hf auth login``."""

    repo_id: str = Field(
        default="",
        pattern=r"^([A-Za-z0-9][\w.-]*/[\w.-]+)?$",
        description="dataset repo ORG/NAME; empty = `opsynth run` does not publish",
    )
    version: str = Field(
        default="1.0.0",
        pattern=r"^\d+\.\d+\.\d+$",
        description="version X.Y.Z, tagged v<version>; the same content again is a no-op, other "
        "content needs a new version (old ones stay loadable by revision)",
    )
    private: bool = Field(default=False, description="create the repo private (kept if it exists)")
    license: str = Field(default="mit", description="licence id in the dataset card's metadata")
    include_rejected: bool = Field(
        default=True,
        description="also push the `rejected` (every rejected task and why) and `verdicts` (every "
        "stage's judgement) configs, which the audit report and notebook read",
    )
    pretty_name: str = Field(default="", description="dataset card title; empty = the repo name")


class RunnerConfig(_Section):
    """Where the sandboxed filter shards run. ``local`` keeps one warm pool in this process;
    ``dask`` submits every shard to the Dask cluster's workers at once, each worker
    running its own warm pool, so a cluster of GPU hosts filters in parallel. Not part of the
    config hash: where a shard ran never changes its verdicts."""

    kind: Literal["local", "dask"] = Field(
        default="local",
        description="local = one in-process worker pool; dask (prefect-dask, the `dask` "
        "extra) = shards submitted concurrently to a Dask cluster",
    )
    address: str = Field(
        default="",
        description="an existing Dask cluster (tcp://host:8786); empty = start a local "
        "cluster on this host for the run",
    )
    workers: int = Field(
        default=0,
        ge=0,
        description="workers of a local cluster (address empty), each given an equal share "
        "of the host's cores; 0 = visible GPUs / gpus_per_worker on cuda, else 2",
    )
    gpus_per_worker: int = Field(
        default=1,
        ge=1,
        description="GPUs each cluster worker gets on cuda (CUDA_VISIBLE_DEVICES of a local "
        "Dask worker)",
    )
    shards_per_worker: int = Field(
        default=2,
        ge=1,
        description="shards a local Dask worker runs at once (its threads); they share its "
        "warm pool, so the next shard's candidates start on the workers the current shard's "
        "slowest candidates leave idle; 1 = one shard at a time, each ending in a tail",
    )


class TrainerConfig(_Section):
    """The bundled trainer (``trainer/``): the agent environment, rollouts, RFT and TRL
    training. Not part of the config hash: training never changes the dataset's rows."""

    max_turns: int = Field(default=40, ge=1, description="assistant turns per episode")
    max_tokens: int = Field(
        default=200_000,
        ge=1,
        description="prompt + completion tokens per episode (the server's usage counts)",
    )
    wall_time_s: float = Field(default=1800.0, gt=0, description="wall clock per episode")
    completion_tokens: int = Field(
        default=4096, ge=1, description="max_tokens asked of the server for each assistant turn"
    )
    temperature: float = Field(default=0.7, ge=0, description="sampling temperature of rollouts")
    request_timeout_s: float = Field(
        default=600.0, gt=0, description="one chat-completions request, incl. the server's queue"
    )
    max_tool_errors: int = Field(
        default=8,
        ge=1,
        description="consecutive failed tool calls (unknown tool, broken JSON arguments) before "
        "the episode ends with reason tool_errors",
    )
    tool_timeout_s: float = Field(
        default=300.0, gt=0, description="one bash command (incl. compile/verify/profile)"
    )
    tool_output_chars: int = Field(
        default=16_000,
        ge=256,
        description="a tool observation longer than this is cut in the middle (head and tail "
        "kept), so one noisy build log cannot fill the context",
    )
    file_bytes: int = Field(
        default=1 << 20, ge=1024, description="largest file the write/edit tools create"
    )
    concurrency: int = Field(default=4, ge=1, description="episodes running at once")
    episodes_per_task: int = Field(default=1, ge=1, description="rollouts per dataset row")
    rft_min_reward: int = Field(
        default=2, ge=-1, le=3, description="RFT keeps trajectories with at least this reward"
    )
    rft_per_task: int = Field(default=1, ge=1, description="best trajectories kept per task")


class RunConfig(_Section):
    target: int = Field(default=24, ge=1, description="accepted tasks wanted")
    max_rounds: int = Field(default=4, ge=1, description="compose-filter rounds to reach target")
    chunk_size: int = Field(
        default=512,
        ge=1,
        description="candidates of a round sized and filtered together before the next ones are "
        "sized: what a stopped run (or audit) resumes from, and how far past its target a round "
        "may go",
    )
    seeds: SeedsConfig = SeedsConfig()
    compose: ComposeConfig = ComposeConfig()
    sizing: SizingConfig = SizingConfig()
    filters: FiltersConfig = FiltersConfig()
    eval: EvalConfig = EvalConfig()
    decontam: DecontamConfig = DecontamConfig()
    dedup: DedupConfig = DedupConfig()
    publish: PublishConfig = PublishConfig()
    runner: RunnerConfig = RunnerConfig()
    trainer: TrainerConfig = TrainerConfig()

    def config_hash(self) -> str:
        """Hash of what decides the data; ``publish`` only says where it goes, ``runner``
        where it is computed and ``trainer`` what is done with it afterwards, so they are left
        out and none changes a run's hash, and neither does a speed-only setting."""
        data = self.model_dump(mode="json", exclude={"publish", "runner", "trainer"})
        for name in data:  # speed-only settings at their defaults (``work_dump``)
            section = getattr(self, name)
            if isinstance(section, _Section):
                data[name] = section.work_dump()
        blob = json.dumps(data, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def with_overrides(self, **top_level: object) -> RunConfig:
        data = self.model_dump(mode="json")
        data.update({k: v for k, v in top_level.items() if v is not None})
        return RunConfig.model_validate(data)

    def with_section(self, section: str, **values: object) -> RunConfig:
        data = self.model_dump(mode="json")
        data[section].update({k: v for k, v in values.items() if v is not None})
        return RunConfig.model_validate(data)


def load_config(path: Path | None) -> RunConfig:
    """Load a TOML config; every problem becomes one ConfigError line naming the fix."""
    if path is None:
        return RunConfig()
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; pass an existing TOML file")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML ({exc}); fix the syntax") from exc
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ConfigError(
            f"config file {path}: {where}: {first['msg']}; see configs/default.toml"
        ) from exc


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict) and not value:
        return "{}"
    if isinstance(value, dict):
        return "{ " + ", ".join(f'"{k}" = {_toml_value(v)}' for k, v in value.items()) + " }"
    raise TypeError(f"cannot render {value!r} as TOML")


def render_default_toml() -> str:
    """The documented default config, generated from the models so the two cannot drift."""
    header = [
        "# opsynth default configuration (generated by `python -m opsynth.config`).",
        "# Every key is optional; omitted keys take these values.",
    ]
    return render_toml(RunConfig(), header)


def render_toml(default: RunConfig, header: list[str]) -> str:
    """``default`` as a documented TOML file (also how a published run's config is shipped)."""
    lines = [*header, ""]

    def emit(model: BaseModel) -> None:
        for name, info in type(model).model_fields.items():
            value = getattr(model, name)
            if isinstance(value, BaseModel):
                continue
            speed = " (speed only: work files are reused across its values)"
            note = speed if info.json_schema_extra == SPEED_ONLY else ""
            if info.description or note:
                lines.append(f"# {info.description or ''}{note}")
            lines.append(f"{name} = {_toml_value(value)}")

    def sections(model: BaseModel, prefix: str) -> None:
        for name in type(model).model_fields:
            section = getattr(model, name)
            if isinstance(section, BaseModel):
                lines.extend(["", f"[{prefix}{name}]"])
                emit(section)
                sections(section, f"{prefix}{name}.")

    emit(default)
    sections(default, "")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    out = Path(__file__).resolve().parents[1] / "configs" / "default.toml"
    out.write_text(render_default_toml())
    print(f"wrote {out}")
