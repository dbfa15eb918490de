"""Settings of the stages after filtering and of where work runs (``[eval]``,
``[decontam]``, ``[dedup]``, ``[publish]``, ``[runner]``, ``[trainer]``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from opsynth.config.base import _Section


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
