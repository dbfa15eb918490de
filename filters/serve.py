"""The candidate's side of a judged job: answer the worker's requests, one JSON line each.

Nothing here decides anything: the worker (``filters.judge``) draws the seeds, times the
requests with its own clock and compares what comes back. This side draws inputs from the
seeds it is given, runs the forwards it is asked for and hands over a *sample* of each output
(``sample``): the values at positions drawn from a seed that arrives only after the forward
returned, and checksums of every element against random weights from that seed. Large
outputs never cross the pipe. A timed forward's reply also carries a weighted sum of every
output element (``proof_sum``, weights from a seed sent with the request), so it cannot be
sent before the output is whole: work deferred past the reply to look fast is caught.

Standard library and torch only (the worker's child imports it).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from opsynth.filters import fused_sums
from opsynth.filters.candidate_load import input_tensors, with_input_tensor
from opsynth.filters.failures import exception_text
from opsynth.filters.judge import CHECKSUMS, MAX_OUTPUTS, SAMPLE_POSITIONS

Emit = Callable[[dict[str, Any]], None]
Handler = Callable[[dict[str, Any]], dict[str, Any]]
CHUNK = 1 << 24  # elements per checksum step: bounds the extra device memory a sample takes


class Refusal(Exception):
    """A request this process fails for a reason of its harness's vocabulary."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


def serve(
    fd: int, emit: Emit, handlers: dict[str, Handler], classify: Callable[[BaseException], str]
) -> None:
    """Answer requests from ``fd`` until ``end`` or the worker closes it. A handler that
    raises answers with its reason (``Refusal``) or ``classify``'s, and serving goes on: the
    worker decides what a failure means."""
    reader = os.fdopen(fd, "rb", buffering=0, closefd=False)
    pending = b""
    while True:
        while b"\n" not in pending:
            chunk = reader.read(1 << 16)
            if not chunk:
                return
            pending += chunk
        line, _, pending = pending.partition(b"\n")
        request = json.loads(line)
        op = request.get("op")
        if op == "end":
            emit({"re": "end"})
            return
        try:
            handler = handlers[op]
            emit({"re": op, **handler(request)})
        except Refusal as refusal:
            emit({"re": op, "error": refusal.reason, "detail": refusal.detail[:2000]})
        except BaseException as exc:  # the candidate's code may raise anything
            emit({"re": op, "error": classify(exc), "detail": exception_text(exc)})


class Runner:
    """The requests every judged harness serves: ``ping``; ``draw`` (inputs from a seed, one
    of them perhaps from another);
    ``run`` (one of ``forwards`` on the drawn inputs, its outputs kept); ``sample`` (of the
    kept outputs, or of the inputs); ``lock``/``unlock`` (the GPU exclusively, for timed
    runs); ``flush`` (the L2, before a timed run)."""

    def __init__(
        self,
        device: torch.device,
        get_inputs: Callable[[int], list[Any]],
        forwards: dict[str, Callable[[list[Any], int | None], list[torch.Tensor]]],
        lock: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
        nested: bool = False,
        fused: bool = True,
    ) -> None:
        self.device = device
        self.nested = nested  # input tensors inside list inputs count (``input_tensors``)
        self.fused = fused  # a sample's sums in one pass where it can (``filters.fused_sums``)
        self.get_inputs = get_inputs
        self.forwards = forwards
        self.lock = lock
        self.inputs: list[Any] = []
        self.outputs: list[torch.Tensor] = []
        self._held: contextlib.ExitStack | None = None
        self._l2: torch.Tensor | None = None

    def handlers(self) -> dict[str, Handler]:
        return {
            "ping": lambda request: {},
            "draw": self.draw,
            "run": self.run,
            "sample": self.sample,
            "lock": self.take_lock,
            "unlock": self.release_lock,
            "flush": self.flush,
        }

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def draw(self, request: dict[str, Any]) -> dict[str, Any]:
        """The inputs of ``seed``; with ``replace`` ``{"seed", "input": k}``, the ``k``-th
        input tensor taken from that seed's draw instead (how much one input moves the
        output: ``filters.verify``)."""
        inputs = self.get_inputs(int(request["seed"]))
        replace = request.get("replace")
        if replace is not None:
            k = int(replace["input"])
            others = input_tensors(self.get_inputs(int(replace["seed"])), self.nested)
            if not 0 <= k < min(len(others), len(input_tensors(inputs, self.nested))):
                raise Refusal("bad_output", f"no input tensor {k} to replace")
            inputs = with_input_tensor(inputs, k, others[k], self.nested)
        self.inputs = inputs
        self.outputs = []
        self.sync()
        return {}

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        """The forward; with a ``proof`` seed, the reply carries one weighted sum of every
        output element (``proof_sum``), so it cannot come before the output is whole; with
        ``time``, its milliseconds by this process's clock (``timed_forward``), which the
        worker accepts only within its own clock's time for the request."""
        forward = self.forwards[str(request["which"])]
        self.outputs = []
        timed: dict[str, Any] = {}
        with torch.no_grad():
            rng = None if request.get("rng") is None else int(request["rng"])
            if request.get("time"):
                self.outputs, timed["ms"] = timed_forward(self.device, forward, self.inputs)
            else:
                self.outputs = forward(self.inputs, rng)
            seed = request.get("proof")
            proof = (
                None
                if seed is None
                else [
                    proof_sum(t, int(seed) + i, fused=self.fused)
                    for i, t in enumerate(self.outputs)
                ]
            )
        self.sync()
        return timed if proof is None else {**timed, "proof": proof}

    def sample(self, request: dict[str, Any]) -> dict[str, Any]:
        tensors = self.outputs
        if request.get("of") == "inputs":
            tensors = input_tensors(self.inputs, self.nested)
        if not tensors:
            raise Refusal("bad_output", "nothing to sample")
        if len(tensors) > MAX_OUTPUTS:
            raise Refusal("too_many_outputs", f"{len(tensors)} tensors; at most {MAX_OUTPUTS}")
        seed = int(request["seed"])
        # fewer positions where the worker asks (the sample after a timed run, which counts
        # for its time alone), never more than the judge parses
        k = min(max(1, int(request.get("positions", SAMPLE_POSITIONS))), SAMPLE_POSITIONS)
        with torch.no_grad():
            samples = [
                sample_tensor(t, seed + i, k, fused=self.fused) for i, t in enumerate(tensors)
            ]
            return {"outputs": samples}

    def take_lock(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.lock is not None and self._held is None:
            self._held = contextlib.ExitStack()
            self._held.enter_context(self.lock())
        return {}

    def release_lock(self, request: dict[str, Any]) -> dict[str, Any]:
        held, self._held = self._held, None
        if held is not None:
            held.close()
        return {}

    def flush(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.device.type == "cuda":
            self._l2 = flush_l2(self._l2, self.device)
            self.sync()
        return {}


def timed_forward(
    device: torch.device,
    forward: Callable[[list[Any], int | None], list[torch.Tensor]],
    inputs: list[Any],
) -> tuple[list[torch.Tensor], float]:
    """One forward (no RNG seeding, which would inflate it) and its milliseconds: between two
    CUDA events around it on a GPU, as the filters' own timed runs measure, by the wall clock
    on CPU."""
    if device.type != "cuda":
        start = time.perf_counter()
        outputs = forward(inputs, None)
        return outputs, (time.perf_counter() - start) * 1e3
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    outputs = forward(inputs, None)
    end.record()
    end.synchronize()
    return outputs, float(begin.elapsed_time(end))


def flush_l2(buffer: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """Zero a buffer twice the GPU's L2 (at least 64 MB), made on first use and returned for
    the next call, so the next timed run starts with a cold cache."""
    if buffer is None:
        l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0))
        buffer = torch.empty(max(2 * l2, 64 << 20) // 4, dtype=torch.int32, device=device)
    buffer.zero_()
    return buffer


def sample_tensor(
    t: torch.Tensor, seed: int, k: int = SAMPLE_POSITIONS, *, fused: bool = True
) -> dict[str, Any]:
    """``t``'s sample for the judge (``filters.judge.Output``): dtype, shape, the values at
    ``k`` positions drawn from ``seed`` (every value when there are at most ``k``),
    ``CHECKSUMS`` sums ``sum(w * v)`` over all elements with standard normal weights ``w``
    from the same seed, and ``sum|v|``, ``sum v^2``. Complex tensors count as pairs of reals."""
    flat, generator = _flat(t), _generator(t, seed)
    n = flat.numel()
    if n <= k:
        values = flat.double().cpu().tolist()
    else:
        positions = torch.randint(n, (k,), generator=generator, device=flat.device)
        values = flat[positions].double().cpu().tolist()
    found = _sums(flat, generator, seed, CHECKSUMS, magnitudes=True, fused=fused).cpu().tolist()
    return {
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "values": values,
        "checksums": found[:CHECKSUMS],
        "abs_sum": found[CHECKSUMS],
        "square_sum": found[CHECKSUMS + 1],
    }


def proof_sum(t: torch.Tensor, seed: int, *, fused: bool = True) -> float:
    """``sum(w * v)`` over every element of ``t`` with standard normal weights ``w`` from
    ``seed``: what a timed forward's reply carries. The worker compares it with the
    reference's on the same inputs and seed (the bound of ``filters.judge.checksum_bound``), so
    a reply sent before the output was whole, or with a part of it, is caught."""
    sums = _sums(_flat(t), _generator(t, seed), seed, 1, magnitudes=False, fused=fused)
    return float(sums[0].item())


def _flat(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    return torch.view_as_real(t).reshape(-1) if t.is_complex() else t.reshape(-1)


def _generator(t: torch.Tensor, seed: int) -> torch.Generator:
    generator = torch.Generator(device=t.device)
    generator.manual_seed(seed)
    return generator


def _sums(
    flat: torch.Tensor,
    generator: torch.Generator,
    seed: int,
    weighted: int,
    *,
    magnitudes: bool,
    fused: bool,
) -> torch.Tensor:
    """``weighted`` sums ``sum(w_j * v)`` with fresh standard normal weights each, then (with
    ``magnitudes``) ``sum|v|`` and ``sum v^2``, in float64 on ``flat``'s device: with
    ``fused`` on a CUDA device in one pass (``fused_sums_of``), else with torch operations
    (``torch_sums``). Every process of a job is asked for the same path, so its samples
    compare."""
    if fused and fused_sums.available(flat.device):
        return fused_sums_of(flat, seed, weighted, magnitudes=magnitudes)
    return torch_sums(flat, generator, weighted, magnitudes=magnitudes)


def fused_sums_of(
    flat: torch.Tensor, seed: int, weighted: int, *, magnitudes: bool
) -> torch.Tensor:
    """``_sums`` by ``filters.fused_sums``, weights from ``seed``, ``CHUNK`` elements a launch."""
    total = torch.zeros(fused_sums.SUMS, dtype=torch.float64, device=flat.device)
    for begin in range(0, flat.numel(), CHUNK):
        total += fused_sums.sums(flat[begin : begin + CHUNK], seed, begin // CHUNK)
    magnitude_sums = total[fused_sums.WEIGHTED :] if magnitudes else total[:0]
    return torch.cat([total[:weighted], magnitude_sums])


def torch_sums(
    flat: torch.Tensor, generator: torch.Generator, weighted: int, *, magnitudes: bool
) -> torch.Tensor:
    """``_sums`` by torch operations, weights from ``generator``, ``CHUNK`` elements at a time."""
    f64 = torch.float64
    sums = torch.zeros(weighted + 2 * magnitudes, dtype=f64, device=flat.device)
    for begin in range(0, flat.numel(), CHUNK):
        part = flat[begin : begin + CHUNK].float()
        for j in range(weighted):
            w = torch.randn(part.numel(), generator=generator, device=flat.device)
            sums[j] += (w * part).sum(dtype=f64)
        if magnitudes:
            sums[weighted] += part.abs().sum(dtype=f64)
            sums[weighted + 1] += part.square().sum(dtype=f64)
    return sums
