"""Planning re-runs of out-of-memory tasks: the need read from torch's message, and waves."""

from __future__ import annotations

import pytest

from opsynth.filters.failures import classify
from opsynth.filters.retry import memory_need_gib, retry_waves

# torch 2.11's message on an H200, as a worker recorded it
CUDA_OOM = (
    "OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total "
    "capacity of 139.80 GiB of which 3.19 GiB is free. Including non-PyTorch memory, this "
    "process has 25.61 GiB memory in use. Process 93 has 14.00 MiB memory in use."
)


def test_need_is_what_the_process_held_plus_what_it_asked_for() -> None:
    assert memory_need_gib(CUDA_OOM) == pytest.approx(29.61)
    mib = CUDA_OOM.replace("4.00 GiB. GPU", "512.00 MiB. GPU")
    assert memory_need_gib(mib) == pytest.approx(26.11)


def test_a_message_without_both_amounts_has_no_need() -> None:
    cpu = "RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"
    assert memory_need_gib(cpu) is None
    assert memory_need_gib("AcceleratorError: CUDA error: out of memory") is None


def test_waves_pack_largest_first_and_unknown_needs_run_alone() -> None:
    needs = {"a": 60.0, "b": 50.0, "c": 30.0, "d": 20.0, "e": None, "huge": 150.0}
    assert retry_waves(needs, 100.0) == [["huge"], ["a", "c"], ["b", "d"], ["e"]]


def test_without_a_budget_every_task_runs_alone() -> None:
    assert retry_waves({"a": 1.0, "b": None}, None) == [["a"], ["b"]]


def test_library_workspace_failures_are_out_of_memory() -> None:
    """A cuBLAS handle that cannot get its workspace on a full device is memory, not a
    poisoned context: it gets ``oom`` and therefore the re-run."""
    error = RuntimeError(
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
    )
    assert classify(error, "forward_error") == "oom"


@pytest.mark.parametrize(
    "message",
    [
        "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR",
        "cusolver error: CUSOLVER_STATUS_INTERNAL_ERROR, when calling `cusolverDnCreate(handle)`",
        "CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`",
    ],
)
def test_a_handle_a_library_cannot_create_on_a_full_device_is_out_of_memory(message) -> None:
    """What an H100 shared by 16 workers running tasks sized for a 139 GB device raised in
    their forwards (an eager ``forward_error`` each, before): the memory was the
    neighbours', so the task gets ``oom`` and its run alone decides."""
    assert classify(RuntimeError(message), "forward_error") == "oom"
    assert classify(RuntimeError("CUSOLVER_STATUS_INVALID_VALUE"), "forward_error") == (
        "forward_error"
    )
