"""Settings of sizing and the sandboxed filters (``[sizing]``, ``[filters]``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from opsynth.config.base import (
    ADDED_AT_DEFAULT,
    SPEED_ONLY,
    SPEED_ONLY_ADDED,
    _Section,
    added_with,
)

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
    fused_sums: bool = Field(
        json_schema_extra=SPEED_ONLY_ADDED,
        default=True,
        description="on a CUDA device, the judge's samples sum each output in one Triton pass "
        "(filters.fused_sums) instead of some twenty torch passes; the weights come from "
        "another generator, with the same statistics. false = torch operations, the baseline "
        "of benchmarks/request_latency.py and timing_cost.py",
    )
    every_output_distinct: bool = Field(
        json_schema_extra=added_with(False),
        default=True,
        description="every output must move for another input draw (by more than "
        "distinct_rtol), not only the outputs together: a constant scalar returned beside a "
        "real output is indistinguishable; checked in the candidate's degenerate stage and "
        "again in verify. false = only the outputs together, as runs did before (v1.0.0's "
        "config pins it)",
    )
    stable_inputs: bool = Field(
        json_schema_extra=added_with(False),
        default=True,
        description="every input draw must hold the same number of input tensors, of the "
        "same shapes and dtypes (unstable_inputs): an input whose shape changes between draws "
        "cannot be swapped for another draw's to see whether it moves the output, so an "
        "ignored one passed, and a task whose sizes are drawn at random has no fixed size to "
        "time; checked in the candidate's degenerate stage and again in verify. false = not "
        "checked, as runs did before (v1.0.0's config pins it)",
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
    gib_per_gpu_worker: float = Field(
        json_schema_extra=SPEED_ONLY_ADDED,
        default=8.5,
        ge=0,
        description="workers = 0 also caps workers per GPU at its memory / this, so that their "
        "candidates fit side by side: a sized task may hold up to sizing.max_device_gib (8 GiB) "
        "on the device and each process a CUDA context besides; more workers than fit turn "
        "most verdicts into oom retries on a smaller GPU. 0 = no memory cap",
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
    too_fast_share: float = Field(
        json_schema_extra=added_with(0.0),
        default=0.8,
        ge=0,
        lt=1,
        description="a candidate whose sizing probe at the chosen size read below this share "
        "of the runtime window's lower edge is too_fast at stage sizing, and never filtered: "
        "the search could not grow it into the window (memory cap, max_value or its steps), "
        "and its filters would time it below the edge again. The share leaves room for a "
        "probe's few timed runs to read low; 0 = every sized candidate is filtered",
    )
