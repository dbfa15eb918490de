"""The trusted side of a judged job: requests to a candidate's process, timed by our clock,
and the comparisons that turn what it hands back into verdicts.

A judged harness (``filters.harness.Harness.judge``) does not take a child's word for its
verdict. The worker (a different process the child cannot write to: non-dumpable, and the
child holds none of its descriptors but its own two pipes) asks the child to draw inputs
from seeds the worker drew, run forwards and hand back a *sample* of each output: values at
positions chosen by a seed the worker sends after the forward returned, plus checksums of
the whole output against random weights from the same seed. Every comparison, tolerance,
timing and verdict is computed here, from those numbers.

Everything a child sends is untrusted: a reply must be one JSON object line, within
``MAX_REPLY_BYTES``, answering the request just made, with fields of the expected types;
anything else is the child's ``protocol_violation``, never an exception in the worker.

Standard library only: the worker imports this module before any candidate runs.
"""

from __future__ import annotations

import json
import math
import os
import select
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

POLL_S = 0.02
# The reason code of a passed row (``filters.reasons.OK``), which no failure may carry.
PASSED = "ok"
# Runner codes (``filters.reasons.INFRA``) only the worker observes: its watchdog, its wait for
# the child's exit, its own checks. A child naming one as its failure would pass its fault off
# as the runner's (a ``filter_error``) or as a neighbour's (``timeout``, retried alone).
RUNNER_ONLY = frozenset(
    {"timeout", "crashed", "worker_lost", "output_flood", "filter_error", "protocol_violation"}
)
# Positions sampled per output tensor (all of them when the output is smaller).
SAMPLE_POSITIONS = 2048
# The most tensors a forward may return (a longer tuple is ``too_many_outputs``): the bound
# that keeps an honest sample reply, and so ``MAX_REPLY_BYTES``, finite. Ops-6K has a task
# unbinding an upsampled dimension into 128 tensors; twice that leaves room for such chains.
MAX_OUTPUTS = 256
# The longest JSON float with its separator ("-2.2250738585072014e-308, "), and room per
# output for its dtype, shape and sums: the largest reply an honest child sends fits.
VALUE_BYTES, OUTPUT_OVERHEAD_BYTES = 26, 4096
OUTPUT_BYTES = SAMPLE_POSITIONS * VALUE_BYTES + OUTPUT_OVERHEAD_BYTES
MAX_REPLY_BYTES = MAX_OUTPUTS * OUTPUT_BYTES + (64 << 10)
# Checksums per output, each against its own weights: a never-computed output slips past one
# with a probability of at most about a tenth (its own scale against the bound), past all four
# with about 1e-4, per call.
CHECKSUMS = 4
# A correct output's checksum gap is normal with at most the tolerance's norm as deviation.
CHECKSUM_Z = 8.0
# Rounding: float32 products summed in float64 differ between two equal outputs by far less.
CHECKSUM_SLACK = 1e-6
DTYPES = frozenset(
    {
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "complex64",
        "complex128",
        "int8",
        "uint8",
        "int16",
        "int32",
        "int64",
        "bool",
    }
)


class PeerFailure(Exception):
    """The child cannot go on: it broke the protocol, died, hit a limit or ran out of time."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


class Refused(Exception):
    """The child answered a request with a failure of its own (a forward that raised, an
    out-of-memory): ``reason`` as it gave it, a code of the harness's rows that the child
    itself can observe (never ``ok`` nor one of ``RUNNER_ONLY``)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


Tick = Callable[[], "tuple[str, str] | None"]


class Peer:
    """One child under request and reply. ``tick`` runs every ``POLL_S`` while we wait (the
    worker's watchdog and exit check) and ends the wait with its failure; ``deadline``
    (``time.monotonic``) bounds the whole conversation."""

    def __init__(
        self,
        request_fd: int,
        reply_fd: int,
        *,
        deadline: float,
        tick: Tick,
        pending: bytes = b"",
        known: Callable[[str], bool] = lambda reason: True,
    ) -> None:
        self.request_fd, self.reply_fd = request_fd, reply_fd
        self.deadline, self.tick = deadline, tick
        self.buffer = bytearray(pending)
        self.known = known  # the reason codes of the harness's rows (``Harness.known``)
        # seconds spent waiting on each kind of request, by our clock: where a judged stage's
        # time goes (the child's forwards, its samples, its input draws)
        self.spent: dict[str, float] = {}

    def request(self, op: str, **fields: Any) -> tuple[dict[str, Any], float]:
        """Send one request; the reply and the seconds from sending to having it whole, by
        our clock."""
        data = (json.dumps({"op": op, **fields}) + "\n").encode()
        start = time.perf_counter()
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self.request_fd, view) :]
        except OSError as exc:
            raise PeerFailure("exited", f"the process stopped taking requests ({exc})") from None
        line = self._line()
        seconds = time.perf_counter() - start
        self.spent[op] = self.spent.get(op, 0.0) + seconds
        try:
            reply = json.loads(line)
        except ValueError:
            raise PeerFailure("protocol_violation", f"{op}: a reply that is not JSON") from None
        if not isinstance(reply, dict) or reply.get("re") != op:
            raise PeerFailure("protocol_violation", f"{op}: a reply to something else")
        if "error" in reply:
            reason, detail = reply.get("error"), reply.get("detail", "")
            if not isinstance(reason, str) or not isinstance(detail, str):
                raise PeerFailure("protocol_violation", f"{op}: a malformed failure")
            if reason == PASSED:  # a refusal is the stage's row: "ok" would pass it unchecked
                raise PeerFailure("protocol_violation", f"{op}: a failure that claims to pass")
            if reason in RUNNER_ONLY or not self.known(reason):
                why = f"{op}: a failure it cannot give ({reason[:64]!r})"
                raise PeerFailure("protocol_violation", why)
            raise Refused(reason, detail[:2000])
        return reply, seconds

    def _line(self) -> bytes:
        while b"\n" not in self.buffer:
            if len(self.buffer) > MAX_REPLY_BYTES:
                raise PeerFailure("protocol_violation", "a reply longer than the protocol allows")
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise PeerFailure("timeout", "the judged run exceeded task_timeout_s")
            if select.select([self.reply_fd], [], [], min(left, POLL_S))[0]:
                chunk = os.read(self.reply_fd, 1 << 16)
                if not chunk:
                    failure = self.tick() or ("exited", "the process ended mid-request")
                    raise PeerFailure(*failure)
                self.buffer.extend(chunk)
                continue
            failure = self.tick()
            if failure:
                raise PeerFailure(*failure)
        line, _, rest = bytes(self.buffer).partition(b"\n")
        self.buffer[:] = rest
        return line


# ------------------------------------------------------------------------------ samples


@dataclass(frozen=True)
class Output:
    """What a child handed over about one output tensor: its structure, the values at the
    sampled positions (all values when the tensor is small), ``CHECKSUMS`` sums
    ``sum(w_j * v)`` over every element with independent standard normal weights ``w_j``
    drawn after the output existed, and ``sum|v|``, ``sum v^2`` for the bound."""

    dtype: str
    shape: tuple[int, ...]
    values: tuple[float, ...]
    checksums: tuple[float, ...]
    abs_sum: float
    square_sum: float

    @property
    def numel(self) -> int:
        per_element = 2 if self.dtype.startswith("complex") else 1
        return math.prod(self.shape) * per_element

    def nothing(self) -> Output:
        """An output of the same structure holding zeros."""
        zeros = (0.0,) * len(self.values)
        return Output(self.dtype, self.shape, zeros, (0.0,) * len(self.checksums), 0.0, 0.0)


def parse_sample(reply: dict[str, Any], limit: int = SAMPLE_POSITIONS) -> list[Output]:
    """The outputs of a ``sample`` reply, every field checked; PeerFailure otherwise."""
    raw = reply.get("outputs")
    if not isinstance(raw, list) or not raw or len(raw) > MAX_OUTPUTS:
        raise PeerFailure("protocol_violation", "sample: outputs is not a short list")
    outputs = []
    for item in raw:
        try:
            outputs.append(_parse_output(item, limit))
        except (TypeError, ValueError, KeyError) as exc:
            raise PeerFailure("protocol_violation", f"sample: {exc}") from None
    return outputs


def _parse_output(item: Any, limit: int) -> Output:
    if not isinstance(item, dict):
        raise TypeError("an output is not an object")
    dtype, shape, values, sums = item["dtype"], item["shape"], item["values"], item["checksums"]
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}")
    if not isinstance(shape, list) or len(shape) > 16 or not all(_count(n) for n in shape):
        raise ValueError("a malformed shape")
    if not isinstance(values, list) or not isinstance(sums, list) or len(sums) != CHECKSUMS:
        raise ValueError("values and checksums must be lists")
    out = Output(
        dtype,
        tuple(shape),
        tuple(_number(v) for v in values),
        tuple(_number(v) for v in sums),
        _number(item["abs_sum"]),
        _number(item["square_sum"]),
    )
    expected = min(out.numel, limit)
    if len(out.values) != expected:
        raise ValueError(f"{len(out.values)} sampled values, expected {expected}")
    return out


def _count(value: Any) -> bool:
    return type(value) is int and 0 <= value < 1 << 40


def _number(value: Any) -> float:
    if type(value) not in (int, float):
        raise TypeError(f"{type(value).__name__} where a number belongs")
    try:
        return float(value)
    except OverflowError:  # an integer beyond any float
        raise TypeError("an integer too large for a number") from None


class Shaped(Protocol):
    """What ``structure_mismatch`` reads: an ``Output``, or a tensor in the candidate's own
    checks."""

    @property
    def dtype(self) -> Any: ...

    @property
    def shape(self) -> Any: ...


def structure_mismatch(
    expected: Sequence[Shaped], got: Sequence[Shaped], what: str = "output"
) -> str:
    """Why ``got`` is not shaped like ``expected`` ("" when it is); ``what`` names the
    tensors compared (outputs, or input tensors)."""
    if len(expected) != len(got):
        return f"{len(got)} {what}s, expected {len(expected)}"
    for i, (e, g) in enumerate(zip(expected, got, strict=True)):
        if (e.dtype, e.shape) != (g.dtype, g.shape):
            return f"{what} {i} is {g.dtype}{list(g.shape)}, expected {e.dtype}{list(e.shape)}"
    return ""


def mismatch(
    expected: Sequence[Output], got: Sequence[Output], atol: float, rtol: float
) -> tuple[str, float]:
    """Why ``got`` fails ``allclose(got, expected, atol, rtol)`` on what was handed over
    ("" when it passes), and the largest sampled difference. Two tests:

    - every sampled value, by allclose's own rule (NaN never equal): an output wrong in a
      fraction ``f`` of its elements passes ``SAMPLE_POSITIONS`` = k positions with
      probability ``(1 - f)^k`` (f = 0.1%: 13% for k = 2048; f = 1%: 1e-9);
    - each checksum: with the errors ``e`` fixed before the weights were drawn,
      ``sum(w * e)`` is normal with deviation ``|e|``, and allclose everywhere means
      ``|e| <= |t|``, ``t = atol + rtol * |expected|``; so a gap beyond ``CHECKSUM_Z * |t|``
      has probability below 1e-15 for a correct output. An output whose sampled positions
      were computed and the rest not (or that was never computed whole) misses each
      checksum by about ``|e|``, far beyond that bound."""
    structure = structure_mismatch(expected, got)
    if structure:
        return structure, math.inf
    worst = 0.0
    for i, (e, g) in enumerate(zip(expected, got, strict=True)):
        for a, b in zip(g.values, e.values, strict=True):
            diff = abs(a - b)
            if not diff <= atol + rtol * abs(b):  # NaN fails here
                worst = max(worst, diff) if diff == diff else math.inf
                return f"output {i} differs by {diff:.4g} at a sampled position", worst
            worst = max(worst, diff)
        bound = checksum_bound(e, atol, rtol)
        for a, b in zip(g.checksums, e.checksums, strict=True):
            gap = abs(a - b)
            if not gap <= bound:
                return f"output {i}: a checksum is off by {gap:.4g} (allowed {bound:.4g})", worst
    return "", worst


def checksum_bound(e: Output, atol: float, rtol: float) -> float:
    """How far a weighted sum ``sum(w * v)`` over an output within ``atol``/``rtol`` of ``e``
    everywhere may be from ``e``'s own (see ``mismatch``)."""
    bound = CHECKSUM_Z * math.sqrt(_tolerance(e, atol, rtol))
    return bound + CHECKSUM_SLACK * (math.sqrt(max(e.square_sum, 0.0)) + 1e-30)


def norms_apart(e: Output, g: Output, atol: float, rtol: float) -> bool:
    """Whether ``g`` cannot be within ``atol``/``rtol`` of ``e`` everywhere, by their sums
    alone: allclose everywhere bounds ``|g - e|`` (the 2-norm) by ``|atol + rtol * |e||``,
    and ``|g - e| >= ||g| - |e||``. A check that would compare ``g`` with a fresh sample of
    ``e`` can skip that sample when this holds; it never holds for a ``g`` that passes."""
    if (g.dtype, g.shape) != (e.dtype, e.shape):
        return True
    e_norm, g_norm = math.sqrt(max(e.square_sum, 0.0)), math.sqrt(max(g.square_sum, 0.0))
    allowed = math.sqrt(_tolerance(e, atol, rtol)) + CHECKSUM_SLACK * (e_norm + g_norm)
    return abs(g_norm - e_norm) > allowed


def _tolerance(e: Output, atol: float, rtol: float) -> float:
    """``|atol + rtol * |e||^2`` over every element of ``e``, from its sums."""
    tolerance = e.numel * atol**2 + 2 * atol * rtol * e.abs_sum + rtol**2 * e.square_sum
    return max(tolerance, 0.0)


def parse_proof(reply: dict[str, Any]) -> list[float]:
    """The per-output weighted sums a timed ``run`` reply carries; PeerFailure otherwise."""
    raw = reply.get("proof")
    if not isinstance(raw, list) or not raw or len(raw) > MAX_OUTPUTS:
        raise PeerFailure("protocol_violation", "run: proof is not a short list")
    try:
        return [_number(v) for v in raw]
    except TypeError as exc:
        raise PeerFailure("protocol_violation", f"run: {exc}") from None


def parse_ms(reply: dict[str, Any]) -> float:
    """The milliseconds a timed ``run`` reply claims for its forward; PeerFailure unless a
    finite number >= 0."""
    raw = reply.get("ms")
    try:
        ms = _number(raw)
    except TypeError:
        ms = math.nan
    if not 0.0 <= ms < math.inf:
        raise PeerFailure("protocol_violation", "run: ms is not a finite number >= 0")
    return ms


def proof_mismatch(
    expected: Sequence[Output],
    proof: Sequence[float],
    reference: Sequence[float],
    atol: float,
    rtol: float,
) -> str:
    """Why a timed forward's ``proof`` (``filters.serve.proof_sum`` per output) is not what an
    output within tolerance of ``expected`` gives against the reference's ``reference`` for the
    same seed: the reply came before the output was whole, or with part of it."""
    if len(proof) != len(expected):
        return f"{len(proof)} proofs for {len(expected)} outputs"
    for i, (e, got, want) in enumerate(zip(expected, proof, reference, strict=True)):
        gap = abs(got - want)
        if not gap <= checksum_bound(e, atol, rtol):
            return f"output {i}: the forward's proof is off by {gap:.4g}"
    return ""


def rel_diff(a: Sequence[Output], b: Sequence[Output]) -> float:
    """Largest sampled difference relative to the larger sampled magnitude, over all outputs
    (the filters' ``rel_diff``, on the sample); a structure change is infinitely different."""
    if structure_mismatch(a, b):
        return math.inf
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        scale = max((abs(v) for v in (*x.values, *y.values)), default=0.0)
        diff = max((abs(p - q) for p, q in zip(x.values, y.values, strict=True)), default=0.0)
        if diff > 0:
            worst = max(worst, diff / scale if scale > 0 else math.inf)
    return worst


def least_moved(a: Sequence[Output], b: Sequence[Output]) -> tuple[int, float]:
    """(output, change) of the output that moved least between two samples of the same
    structure (the filters' ``compare.least_moved``, on the sample). An output's change is the
    larger of its sampled values' (as ``rel_diff``) and its checksums' relative to its norm:
    ``sum(w * (x - y))`` is of the order of ``|x - y|``, so a sparse output whose sampled
    positions all hold zeros still shows a change anywhere in it. A structure change is
    infinitely different."""
    if structure_mismatch(a, b):
        return 0, math.inf
    least, index = math.inf, 0
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        change = rel_diff([x], [y])
        norm = math.sqrt(max(x.square_sum, y.square_sum, 0.0))
        for p, q in zip(x.checksums, y.checksums, strict=True):
            if p != q:
                change = max(change, abs(p - q) / norm if norm > 0 else math.inf)
        if change < least:
            least, index = change, i
    return index, least


def nonfinite(outputs: Sequence[Output]) -> int:
    """The first output with a NaN or Inf among its sampled values or in its checksum, or -1."""
    for i, out in enumerate(outputs):
        if not all(math.isfinite(v) for v in (*out.values, *out.checksums)):
            return i
    return -1


def constant(outputs: Sequence[Output], rtol: float) -> tuple[int, float, float]:
    """(output, spread, magnitude) of the first output of more than one element whose sampled
    values spread by at most ``rtol`` of their magnitude and whose magnitudes over every
    element are those of a constant, else (-1, 0, 0).

    The second test is for what a sample misses: a sparse output (a mask with a few thousand
    True among millions) samples as all zeros. Over all ``n`` elements, ``n * sum(v^2) >=
    sum(|v|)^2``, with equality exactly when every ``|v|`` is the same; a relative excess over
    ``rtol^2`` (what values within ``rtol`` of each other reach) means the output varies."""
    for i, out in enumerate(outputs):
        if len(out.values) > 1:
            lo, hi = min(out.values), max(out.values)
            scale = max(abs(lo), abs(hi))
            if hi - lo <= rtol * scale and not _magnitudes_vary(out, rtol):
                return i, hi - lo, scale
    return -1, 0.0, 0.0


def mean_answer(out: Output, atol: float, rtol: float) -> float | None:
    """The constant an answer that ignores the input could return in place of ``out`` (the
    filters' ``trivial_answer``: the output's mean) when it passes ``allclose`` against
    ``out``, else None. On the sample: every sampled value is within tolerance of the sampled
    values' mean ``c``. Over every element, what a sample misses (a few outliers): allclose
    everywhere puts each value within ``t = (atol + rtol |c|) / (1 - rtol)`` of ``c``, so the
    magnitudes' spread, ``sqrt(sum(v^2)/n - (sum|v|/n)^2)``, is at most ``t``; beyond it, some
    element is not answered by ``c``."""
    if len(out.values) < 2:
        return None
    c = sum(out.values) / len(out.values)
    if not all(abs(c - v) <= atol + rtol * abs(v) for v in out.values):
        return None
    n = out.numel
    mean_square, mean_abs = out.square_sum / n, out.abs_sum / n
    spread_sq = mean_square - mean_abs * mean_abs
    t = (atol + rtol * abs(c)) / (1 - rtol)
    if spread_sq > t * t + CHECKSUM_SLACK * mean_square:
        return None
    return c


def _magnitudes_vary(out: Output, rtol: float) -> bool:
    squared = out.abs_sum * out.abs_sum
    if not squared > 0.0:
        return False  # all zeros (or a report that says so, or one too small to square)
    excess = out.numel * out.square_sum / squared - 1.0
    return excess > rtol * rtol + CHECKSUM_SLACK


def finite(value: float) -> float | None:
    """``value`` for a measure (measures hold finite numbers only), or None."""
    return value if math.isfinite(value) else None


def seed() -> int:
    """A seed the child cannot predict: from the kernel's random source, 62 bits."""
    return int.from_bytes(os.urandom(8), "little") >> 2


class JudgeContext:
    """What a harness's judge works with, in the worker: ``peer``, the child that ran the
    harness's entry and now serves requests; the job's ``settings``; ``spawn(**overrides)``,
    another child of the same job (its entry run with the overridden settings) that serves
    requests too; and ``stage``/``verdict`` to report the judged stages, the only rows of those
    stages the worker accepts."""

    def __init__(
        self,
        peer: Peer,
        settings: dict[str, Any],
        spawn: Callable[..., Peer],
        on_event: Callable[..., None],
    ) -> None:
        self.peer, self.settings = peer, settings
        self._spawn, self._on_event = spawn, on_event
        self._ended: set[int] = set()
        self._began = time.perf_counter()

    def spawn(self, **overrides: Any) -> Peer:
        return self._spawn(**overrides)

    def end(self, peer: Peer) -> None:
        """Tell ``peer`` to stop serving (once): its process finishes as after any job."""
        if id(peer) not in self._ended:
            self._ended.add(id(peer))
            peer.request("end")

    def stage(self, name: str) -> None:
        self._began = time.perf_counter()
        self._on_event({"event": "stage", "stage": name}, True)

    def verdict(
        self,
        stage: str,
        reason: str = "ok",
        detail: str = "",
        measures: dict[str, Any] | None = None,
    ) -> bool:
        """Report ``stage``'s row; whether it passed."""
        row = {
            "stage": stage,
            "passed": reason == "ok",
            "reason": reason,
            "detail": detail[:2000],
            "measures": measures or {},
            "elapsed_s": round(time.perf_counter() - self._began, 6),
        }
        self._on_event({"event": "verdict", "verdict": row}, True)
        return reason == "ok"
