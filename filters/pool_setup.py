"""What a worker pool is set up from, decided before any worker starts (``filters.pool``): the
device, the GPUs and the worker count, the check settings every candidate gets (and a sizing
probe's), where the GPU locks and compile caches live, and whether untrusted code can run
sandboxed here at all.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from typing import Any

from opsynth.config import FiltersConfig
from opsynth.filters import privilege, reasons, sandbox
from opsynth.filters.verify import (
    EVERY_OUTPUT_DISTINCT,
    INPUT_AS_ANSWER,
    STABLE_INPUTS,
    TIMED_SAMPLE_POSITIONS,
    TIMING_IN_VERIFY,
    VERIFY_EVERY_DEGENERATE_CHECK,
)

# The sizing probe: build and run the model, then time it; nothing else.
MEASURE_STAGES = ("eager", "runtime")
# A sizing probe's check settings: eager and the timed runs only, no window.
MEASURE_OVERRIDES: dict[str, Any] = {"stages": list(MEASURE_STAGES), "window_ms": [0.0, 1e300]}
# The check setting that says whether timed runs hold the GPU alone (``filters.checks.Settings``)
TIMED_EXCLUSIVE = "timed_exclusive"
# A candidate's settings when verify times it (``filters.timing_in_verify``): no runtime stage
# and no timed compiled runs in its process. Named only when on, so that a job's settings
# are what they were before the setting existed when it is off.
TIMED_IN_VERIFY: dict[str, Any] = {
    "stages": [s for s in (*reasons.STAGES, reasons.VERIFY) if s != "runtime"],
    "time_compiled": False,
    TIMING_IN_VERIFY: True,
}


def measure_overrides(warmup_runs: int, timed_runs: int, exclusive: bool = True) -> dict[str, Any]:
    """A sizing probe's check settings with its own run counts: a probe needs far less
    precision than a verdict, and each timed run holds the GPU exclusively, unless not
    ``exclusive`` (``sizing.probe_exclusive``; named only when off, so that a probe's job key
    is what it was before the setting existed)."""
    found = {**MEASURE_OVERRIDES, "warmup_runs": warmup_runs, "timed_runs": timed_runs}
    return found if exclusive else {**found, TIMED_EXCLUSIVE: False}


# Host-wide (per user) dir of per-GPU timing locks, shared by every pool on the host.
LOCK_DIR = os.path.join(tempfile.gettempdir(), f"opsynth-gpu-locks-{os.getuid()}")
UNSAFE_HINT = (
    "install bubblewrap (and libseccomp2), or allow unsandboxed execution with --unsafe "
    "(filters.allow_unsafe = true)"
)


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a GPU, else ``cpu``. Only asks torch whether CUDA is
    available; the orchestrator never creates a context or runs candidate code. The one device
    resolver: the CLI's (``flows.cli_common``) adds only its one-line errors and remote
    clusters."""
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, not {device!r}")
    if device == "cpu":
        return "cpu"
    import torch

    available = torch.cuda.is_available()
    if device == "cuda" and not available:
        raise ValueError("device 'cuda' requested but torch sees no CUDA device; use cpu or auto")
    return "cuda" if available else "cpu"


def isolation_problem(cfg: FiltersConfig) -> str:
    """Why untrusted code could not run sandboxed under ``cfg`` (a one-line refusal naming
    the way out), found without starting anything; "" when it can, or unsafe is allowed.
    The pool's start-up probe has the last word."""
    if cfg.allow_unsafe:
        return ""
    if cfg.sandbox == "rlimits":
        return f"sandbox 'rlimits' runs untrusted code unisolated; {UNSAFE_HINT}"
    why = "bwrap is not installed" if not sandbox.bwrap_available() else ""
    why = why or privilege.seccomp_problem()
    return f"the bwrap sandbox is unusable here: {why}; {UNSAFE_HINT}" if why else ""


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "opsynth")


def host_cores() -> int:
    return len(os.sched_getaffinity(0)) or 1


def worker_count(
    cfg: FiltersConfig, device: str, cores: int, gpus: int, gpu_gib: float | None = None
) -> int:
    """``cfg.workers``, or derived: host cores / cores_per_worker (cores_per_gpu_worker on
    CUDA), and on CUDA at most ``max_workers_per_gpu`` per GPU and as many as the GPU's memory
    (``gpu_gib``, the smallest GPU's, when known) holds at ``gib_per_gpu_worker`` each, but at
    least one per GPU."""
    if cfg.workers:
        return cfg.workers
    if device == "cuda" and gpus:
        by_cores = max(1, cores // cfg.cores_per_gpu_worker)
        per_gpu = min(cfg.max_workers_per_gpu, by_cores // gpus)
        if gpu_gib and cfg.gib_per_gpu_worker:
            per_gpu = min(per_gpu, int(gpu_gib // cfg.gib_per_gpu_worker))
        return gpus * max(1, per_gpu)
    return max(1, cores // cfg.cores_per_worker)


def gpu_memory_gib(ids: list[str]) -> float | None:
    """The smallest total memory, in GiB, among the GPUs ``ids`` (as ``CUDA_VISIBLE_DEVICES``
    names them: indices or UUIDs), read with nvidia-smi, which creates no CUDA context in the
    orchestrator; None where nvidia-smi is missing or fails (the count then ignores memory)."""
    query = ["nvidia-smi", "--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits"]
    try:
        done = subprocess.run(query, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return smallest_memory_gib(done.stdout, ids) if done.returncode == 0 else None


def smallest_memory_gib(table: str, ids: list[str]) -> float | None:
    """From nvidia-smi's ``index, uuid, memory.total [MiB]`` lines: the smallest memory among
    ``ids``. nvidia-smi numbers GPUs in PCI bus order, CUDA only with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``: an index is trusted then, a UUID always; otherwise, or
    for an id not listed, the smallest GPU on the host stands in (never more workers than the
    smallest holds)."""
    by_index: dict[str, float] = {}
    by_uuid: dict[str, float] = {}
    for line in table.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 3:
            continue
        try:
            mib = float(parts[2])
        except ValueError:
            continue
        by_index[parts[0]], by_uuid[parts[1]] = mib, mib
    if not by_index:
        return None
    pci_order = os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
    found = [by_uuid.get(i) or (by_index.get(i) if pci_order else None) for i in ids]
    chosen = found if ids and all(found) else list(by_index.values())
    return min(m for m in chosen if m) / 1024


def visible_gpus() -> list[str]:
    """GPU ids this process may use, in CUDA order (honours CUDA_VISIBLE_DEVICES)."""
    import torch

    count = torch.cuda.device_count()
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None and env.strip():
        ids = [x.strip() for x in env.split(",") if x.strip()]
        return ids[:count]
    return [str(i) for i in range(count)]


def job_stages(cfg: FiltersConfig) -> tuple[str, ...]:
    """The stages a candidate's job runs under ``cfg``, in order: the candidate's own, then
    ``verify`` with the judge on (without the candidate's ``runtime`` stage where verify times
    it)."""
    if not cfg.judge:
        return reasons.STAGES
    if cfg.timing_in_verify:
        return tuple(TIMED_IN_VERIFY["stages"])
    return (*reasons.STAGES, reasons.VERIFY)


def check_settings(
    cfg: FiltersConfig, device: str, *, threads: int, lock_dir: str
) -> dict[str, Any]:
    """The JSON settings a worker and its checks get for every candidate."""
    window = cfg.window_ms(device)
    return {
        "device": device,
        "task_timeout_s": cfg.task_timeout_s,
        "memory_limit_bytes": int(cfg.memory_limit_gb * 2**30),
        "max_processes": cfg.max_processes,
        "output_limit_bytes": cfg.output_limit_kb * 1024,
        "file_size_limit_bytes": cfg.file_size_limit_mb << 20,
        "threads": threads,
        "warmup_runs": cfg.warmup_runs,
        "timed_runs": cfg.timed_runs,
        "window_ms": list(window),
        "speed_factor": cfg.device_speed_factor,
        "compile_atol": cfg.compile_atol,
        "compile_rtol": cfg.compile_rtol,
        "input_draws": cfg.input_draws,
        "distinct_rtol": cfg.distinct_rtol,
        "determinism_atol": cfg.determinism_atol,
        "determinism_rtol": cfg.determinism_rtol,
        "lock_dir": lock_dir,
        "batch_timers": cfg.batch_timers,
        "candidates_per_process": cfg.candidates_per_process(device),
        **({} if cfg.judge else {"stages": list(reasons.STAGES)}),
        **(TIMED_IN_VERIFY if cfg.judge and cfg.timing_in_verify else {}),
        VERIFY_EVERY_DEGENERATE_CHECK: cfg.judge_every_degenerate_fact,
        INPUT_AS_ANSWER: cfg.input_as_answer,
        "nested_inputs": cfg.nested_inputs,
        EVERY_OUTPUT_DISTINCT: cfg.every_output_distinct,
        STABLE_INPUTS: cfg.stable_inputs,
        "fused_sums": cfg.fused_sums,
        TIMED_SAMPLE_POSITIONS: cfg.timed_sample_positions,
    }
