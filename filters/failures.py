"""A check's rejection (``Fail``) and the reason code and detail an exception raised by
candidate code is reported with.

Standard library and torch only: this runs in the sandboxed candidate process.
"""

from __future__ import annotations

import errno
import traceback
from typing import Any

import torch

DETAIL_LIMIT = 2000
# What cuDNN, cuSOLVER and cuBLAS say when they cannot set up a handle, which on a device
# the other workers' candidates have filled is memory: classified ``oom``, so the task runs
# again alone (``filters.retry_alone``) and the verdict it gets there stands.
HANDLE_FAILURES = (
    "CUDNN_STATUS_INTERNAL_ERROR",
    "cusolverDnCreate",
    "CUBLAS_STATUS_NOT_INITIALIZED",
)


class Fail(Exception):
    """A stage's rejection: a reason code, a human detail and the measured values."""

    def __init__(self, reason: str, detail: str = "", **measures: Any) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.measures = measures


def exception_text(exc: BaseException) -> str:
    """``Type: message`` of an exception candidate code raised, whatever its ``__str__`` does
    (one that raises, or returns something else, is the candidate's to get wrong, not the
    harness's)."""
    try:
        name = type(exc).__name__
        message = str(exc)
    except BaseException:  # a __str__ that raises: the message is what the candidate chose
        return "Exception: <a message that cannot be shown>"
    if not isinstance(name, str):
        name = "Exception"
    return f"{name}: {message}"


def classify(exc: BaseException, default: str) -> str:
    """Map an exception raised by candidate code to a reason code."""
    if isinstance(exc, SystemExit):
        return "exited"
    if isinstance(exc, MemoryError | getattr(torch, "OutOfMemoryError", MemoryError)):
        return "oom"
    text = exception_text(exc)
    lowered = text.lower()
    # cuBLAS/cuDNN/cuFFT handles that cannot get their workspace: the device is out of memory
    if "out of memory" in lowered or "can't allocate memory" in lowered or "ALLOC_FAILED" in text:
        return "oom"
    # libraries that report a handle they could not create on a full device in other words
    if any(marker in text for marker in HANDLE_FAILURES):
        return "oom"
    # the process/thread limit (RLIMIT_NPROC) refused a new thread or process
    if "can't start new thread" in lowered or (
        isinstance(exc, BlockingIOError) and exc.errno == errno.EAGAIN
    ):
        return "resource_limit"
    cuda_markers = (
        "CUDA error",
        "illegal memory access",
        "device-side assert",
        "CUBLAS_STATUS_EXECUTION_FAILED",
        "unspecified launch failure",
        "misaligned address",
        "an illegal instruction",
    )
    if type(exc).__name__ == "AcceleratorError" or any(m in text for m in cuda_markers):
        return "cuda_error"
    return default


def describe(exc: BaseException, path: str) -> str:
    """``Type: message (candidate.py:LINE in FUNC)``, capped; the location is the deepest
    frame in the candidate's own file, which is where a task author would look."""
    text = exception_text(exc)
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == path]
    if frames:
        last = frames[-1]
        text += f" (candidate.py:{last.lineno} in {last.name})"
    if len(text) > DETAIL_LIMIT:
        text = text[: DETAIL_LIMIT - 3] + "..."
    return text
