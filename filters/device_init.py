"""The CUDA context of a candidate's process: created on a thread ahead of the candidate,
with the math libraries warmed, and the device described for the worker's start-up probe.

Imported in the sandboxed child: torch and the standard library only.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import torch


def device_info(device: str) -> dict[str, Any]:
    """Initialise the device, prove a kernel runs, and describe it (name, versions, L2)."""
    info: dict[str, Any] = {
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda or "",
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        x = torch.randn(64, 64, device="cuda")
        (x @ x).sum().item()
        info.update(
            device_name=props.name,
            device_uuid=str(getattr(props, "uuid", "")),
            l2_bytes=int(getattr(props, "L2_cache_size", 0)),
            memory_bytes=int(props.total_memory),
            capability=f"{props.major}.{props.minor}",
        )
    else:
        x = torch.randn(64, 64)
        (x @ x).sum().item()
        info.update(device_name=cpu_name(), threads=torch.get_num_threads())
    return info


def cpu_name() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "cpu"


class DeviceInit:
    """Creates the CUDA context, and warms cuBLAS and cuDNN, on a thread. Every candidate is a
    fresh process, so each needs a context of its own (4.6-6.4 s median on an H200 with 16
    workers creating theirs at the same time), and its first matmul or convolution would create
    the library's handle and load its kernels (there, a candidate's first forward took 223 ms
    median without a convolution and 547 ms with one, where its later runs take a few ms; 134
    and 150 ms with the libraries warmed here). The worker starts this in its prestarted child
    while the previous candidate still runs (``start_device_init``), so a candidate usually
    finds it done; otherwise the candidate starts it, where it overlaps importing and building
    the model on the CPU. Either way it happens before, not inside, the GPU lock's shared
    sections (a queued timer waits for every shared section in flight)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds = 0.0
        self.warm_seconds = 0.0
        self.failed = False
        # Candidates that used this context: more than one in a reused process, where only
        # the first paid for it.
        self.candidates = 0
        self._thread: threading.Thread | None = None
        if device.type == "cuda":
            self._thread = threading.Thread(target=self._run, args=(device,), daemon=True)
            self._thread.start()

    def _run(self, device: torch.device) -> None:
        start = time.perf_counter()
        try:
            torch.zeros(1, device=device)
        except BaseException:
            # the failure resurfaces, with its message, at the candidate's first CUDA call
            self.failed = True
        self.seconds = time.perf_counter() - start
        if self.failed:
            return
        start = time.perf_counter()
        with contextlib.suppress(BaseException):  # a library that fails here fails the candidate
            warm_libraries(device)
        self.warm_seconds = time.perf_counter() - start

    @property
    def done(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def wait(self) -> float:
        """Seconds spent waiting here (0 when the context was ready)."""
        start = time.perf_counter()
        if self._thread is not None:
            self._thread.join()
        return time.perf_counter() - start


def warm_libraries(device: torch.device) -> None:
    """One tiny matmul, linear and convolution: the libraries load and create their handles.
    Handles are per thread, but a finished thread returns them to torch's pool, where the
    candidate's thread takes them up. No random draws: they would move the CUDA generator a
    constructor that draws on the GPU starts from. The kernels take microseconds, so running
    them outside the GPU lock does not disturb a timer."""
    x = torch.ones(8, 16, device=device)
    w = torch.ones(16, 16, device=device)
    x @ w
    torch.nn.functional.linear(x, w, torch.ones(16, device=device))  # cuBLASLt, with bias
    image = torch.ones(1, 4, 8, 8, device=device)
    kernel = torch.ones(4, 4, 3, 3, device=device)
    torch.nn.functional.conv2d(image, kernel)
    torch.nn.functional.conv_transpose2d(image, kernel)
    torch.cuda.synchronize(device)


_early_init: DeviceInit | None = None


def start_device_init(device: str) -> DeviceInit:
    """Start creating the CUDA context now, in a child forked ahead of its candidate; the
    candidate's ``Candidate`` then takes this one over instead of starting its own."""
    global _early_init
    _early_init = DeviceInit(torch.device(device))
    return _early_init


def device_init_for(device: torch.device) -> DeviceInit:
    if _early_init is not None and _early_init.device == device:
        return _early_init
    return DeviceInit(device)
