"""Workload sizing: measure a task's eager runtime on the filtering device and rescale its batch
until the runtime sits near the middle of the runtime window (on a log scale).

The composer's cost model only guesses CPU time; what the runtime filter keeps depends on the
filtering device, which may be a GPU 100x faster. So the sizing loop measures (in the sandboxed
workers, through the ``measure`` callable the caller passes) and rescales: runtime grows about
linearly with the batch once the device is busy, so each step multiplies the batch by
``target / measured``, clamped. A task already within ``band`` of the target is left alone;
a rescaled variant that fails to run (too big for memory, say) is never chosen over one that
ran. The knob is one module-level constant (``batch_size`` by default) whose right-hand side
holds exactly one integer literal (``batch_size = 512`` or ``batch_size = 512 * scale``); that
literal is rewritten in place, so the rest of the code is untouched. Tasks without such a
constant pass through unchanged, and the reason is recorded.

With ``max_device_gib`` set, the probe's device-memory peak (on a GPU) caps the size too: a
task never grows past the batch its measured memory allows (a power of two, or 1.5 times one
when that still fits), one already over the cap shrinks, and the chosen size is one that
measured within the cap when any did. Memory is a fixed part (weights, the L2 flush buffer)
plus a part linear in the batch, so scaling the reading of the largest batch measured so far
in proportion errs on the safe side for any larger batch, and is the tightest such estimate:
the small first probe is mostly the fixed part, and a limit kept from it stopped tasks at a
quarter of the cap. Sized to fill the window on a large GPU, tasks otherwise hold tens of GB
each, and a GPU shared by many filter (or evaluation) workers runs out of memory.

``Search`` is one task's search over its knob's values, the rule itself; ``Sizer`` runs many
searches over ``Task`` variants for the orchestrator's drivers, and ``filters.size_inline``
runs one inside a candidate's own filter process. Standard library only at run time: the
sandboxed child imports this module.
"""

from __future__ import annotations

import ast
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from opsynth.filters import reasons

if TYPE_CHECKING:  # the sandboxed child imports this module: standard library only at run time
    from opsynth.record import Task, Verdict


@dataclass(frozen=True)
class Probe:
    """One measurement: scaled eager ms on ``device``, or why there is none."""

    ms: float | None
    device: str = ""
    reason: str = ""
    device_gib: float | None = None  # device-memory peak (GPU only)


Measure = Callable[[list["Task"]], dict[str, "Probe"]]
# A batch limit that never binds (no memory reading, or no cap).
NO_LIMIT = 1 << 62


def probe_of(rows: list[Verdict]) -> Probe:
    """A sizing measurement from the verdict rows of ``WorkerPool.measure``: the runtime row's
    scaled ms, else why there is none."""
    last = rows[-1] if rows else None
    if last is not None and last.stage == "runtime" and last.passed:
        return measured(last.measures, last.device)
    return Probe(None, device=last.device if last else "", reason=last.reason if last else "")


def measured(measures: Mapping[str, Any], device: str = "") -> Probe:
    """The measurement in a passed ``runtime`` stage's measures: scaled ms, memory peak."""
    peak = measures.get("device_peak_gib")
    return Probe(
        float(measures["scaled_ms"]),
        device=device,
        device_gib=float(peak) if peak is not None else None,
    )


@dataclass(frozen=True)
class Knob:
    """Where the size lives: ``name``'s assignment, the integer literal at ``line``/``col``."""

    name: str
    value: int
    line: int
    col: int
    end_col: int


def find_knob(code: str, names: Sequence[str]) -> Knob | None:
    """The first of ``names`` assigned at module level with exactly one positive int literal."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    found: dict[str, Knob] = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        target = node.targets[0]
        if not isinstance(target, ast.Name) or target.id not in names:
            continue
        ints = [
            n
            for n in ast.walk(node.value)
            if isinstance(n, ast.Constant) and type(n.value) is int and n.value > 0
        ]
        if len(ints) == 1 and ints[0].lineno == ints[0].end_lineno:
            lit = ints[0]
            found[target.id] = Knob(
                target.id, lit.value, lit.lineno, lit.col_offset, lit.end_col_offset or 0
            )
    return next((found[n] for n in names if n in found), None)


def set_knob(code: str, knob: Knob, value: int) -> str:
    """``code`` with the knob's literal replaced by ``value``; nothing else changes."""
    lines = code.splitlines(keepends=True)
    raw = lines[knob.line - 1].encode()
    if raw[knob.col : knob.end_col] != str(knob.value).encode():
        raise ValueError(f"{knob.name}'s literal is not where it was parsed")
    lines[knob.line - 1] = (raw[: knob.col] + str(value).encode() + raw[knob.end_col :]).decode()
    return "".join(lines)


def target_ms(window: tuple[float, float]) -> float:
    """The window's middle on a log scale (10 ms for 1-100 ms)."""
    lo, hi = window
    return math.sqrt(max(lo, hi * 1e-4) * hi)


def too_fast_below_ms(share: float, window: tuple[float, float]) -> float:
    """The probe reading below which a sized task is ``too_fast`` unfiltered: ``share`` of
    the window's lower edge (0: the rule is off)."""
    return share * window[0]


def chosen_too_fast(record: Mapping[str, Any], below_ms: float) -> str:
    """Why a sized task is ``too_fast`` without its filters (``sizing.too_fast_share``): its
    chosen size's probe read below ``below_ms``, so the search could not grow it into the
    window and the filters would time it below the edge again. "" when the probe read more,
    when no probe of the chosen size has a reading, or when the rule is off (0). ``record`` is
    a sizing record or an inline claim: both hold ``steps`` and ``chosen``."""
    chosen = record.get("chosen")
    steps = record.get("steps")
    if below_ms <= 0 or chosen is None or not isinstance(steps, list):
        return ""
    for step in steps:
        if not isinstance(step, dict) or step.get("value") != chosen:
            continue
        ms = step.get("ms")
        if isinstance(ms, (int, float)) and not isinstance(ms, bool) and 0 < ms < below_ms:
            return (
                f"the sizing probe at the chosen size ({chosen}) read {ms:.4g} ms "
                f"< {below_ms:.4g} ms; the search could not grow it into the window"
            )
    return ""


class Rule(Protocol):
    """The settings a search follows: ``opsynth.config.SizingConfig`` on the orchestrator,
    ``RuleSettings`` from a job's JSON in the sandbox."""

    band: float
    max_steps: int
    max_step_scale: float
    max_value: int
    max_device_gib: float


@dataclass(frozen=True)
class RuleSettings:
    """A ``Rule`` as plain data, to send with a job (``to_json``/``from_json``)."""

    band: float
    max_steps: int
    max_step_scale: float
    max_value: int
    max_device_gib: float

    @classmethod
    def of(cls, rule: Rule) -> RuleSettings:
        return cls(*(getattr(rule, f.name) for f in dataclasses.fields(cls)))

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RuleSettings:
        return cls(*(data[f.name] for f in dataclasses.fields(cls)))


def inline_settings(cfg: Any, window: tuple[float, float]) -> dict[str, Any]:
    """The ``sizing`` entry of a filter job's settings that asks the candidate's own process
    to size it first (``filters.size_inline``), under ``cfg`` (``SizingConfig``)."""
    spec = {
        "constant_names": list(cfg.constant_names),
        "target_ms": target_ms(window),
        "rule": RuleSettings.of(cfg).to_json(),
        "warmup_runs": cfg.probe_warmup_runs,
        "timed_runs": cfg.probe_timed_runs,
    }
    below_ms = too_fast_below_ms(cfg.too_fast_share, window)
    if below_ms > 0:  # named only when on: else a job's key is what it was before
        spec["too_fast_below_ms"] = below_ms
    # named only when off: a job's key (its settings) is then what it was before the setting
    return spec if cfg.probe_exclusive else {**spec, "exclusive": False}


def next_value(value: int, ms: float, target: float, cfg: Rule) -> int:
    """The batch that should take ``target`` ms, as the nearest power of two: KernelBench-like
    sizes, and two runs whose measurements differ only by noise pick the same one (the band
    spans more than a factor of two, so a power of two always fits)."""
    ratio = min(max(target / ms, 1.0 / cfg.max_step_scale), cfg.max_step_scale)
    wanted = min(max(1.0, value * ratio), float(cfg.max_value))
    return int(min(2 ** round(math.log2(wanted)), cfg.max_value))


def on_ladder(value: int) -> bool:
    """Whether ``value`` is a size the search may choose besides the composed one: a power of
    two, or three times one (the rung under the memory cap)."""
    odd = value // (value & -value) if value > 0 else 0
    return odd in (1, 3)


def memory_limit(value: int, device_gib: float, cap_gib: float) -> int:
    """The largest power of two, or three times one, whose memory, scaled linearly from
    ``value``'s measured ``device_gib``, stays within ``cap_gib`` (at least 1). The 1.5x rung:
    a cheap memory-bound chain stopped at the power of two below the cap can run just under
    the window's lower edge, where 1.5 times its batch would be inside it."""
    if device_gib <= 0:
        return NO_LIMIT
    allowed = value * cap_gib / device_gib
    if allowed < 1:
        return 1
    power = 2 ** math.floor(math.log2(allowed))
    return power * 3 // 2 if power >= 2 and power * 3 // 2 <= allowed else power


def _memory_limit(steps: list[dict[str, Any]], cap_gib: float) -> int:
    """The batch limit from the largest batch measured with a memory reading (see the module
    doc: its proportional estimate is the tightest safe one); no limit without a cap or one."""
    read = [st for st in steps if st.get("device_gib") is not None]
    if cap_gib <= 0 or not read:
        return NO_LIMIT
    largest = max(read, key=lambda st: st["value"])
    return memory_limit(largest["value"], largest["device_gib"], cap_gib)


def _distance(ms: float, target: float) -> float:
    return abs(math.log(ms / target))


class Search:
    """One task's measure-and-rescale search over its knob's values: ``current`` is the value
    to measure, ``observe`` takes its measurement and names the next one (None: done), and
    ``chosen`` is the measured value closest to the target."""

    def __init__(self, value: int, target: float, rule: Rule) -> None:
        self.rule, self.target = rule, target
        self.current = value
        self.steps: list[dict[str, Any]] = []
        self.tried = {value}
        self.device = ""

    def observe(self, probe: Probe) -> int | None:
        rule, target = self.rule, self.target
        self.device = self.device or probe.device
        step: dict[str, Any] = {"value": self.current, "ms": probe.ms, "reason": probe.reason}
        gib = probe.device_gib
        if gib is not None:
            step["device_gib"] = gib
        self.steps.append(step)
        if probe.ms is None or probe.ms <= 0:
            return None
        over = rule.max_device_gib > 0 and gib is not None and gib > rule.max_device_gib
        if not over and target / rule.band <= probe.ms <= target * rule.band:
            return None
        limit = _memory_limit(self.steps, rule.max_device_gib)
        value: int | None = min(next_value(self.current, probe.ms, target, rule), limit)
        if value in self.tried:
            value = _bisect(self.steps, target)
            value = None if value is None else min(value, limit)
        if value is None or value in self.tried or len(self.steps) > rule.max_steps:
            return None
        self.current = value
        self.tried.add(value)
        return value

    def chosen(self) -> int | None:
        """The measured value closest to the target, preferring those within the memory cap;
        None when no measurement succeeded."""
        measured = [step for step in self.steps if step["ms"]]
        if self.rule.max_device_gib > 0:
            cap = self.rule.max_device_gib
            measured = [st for st in measured if st.get("device_gib", 0.0) <= cap] or measured
        best = min(measured, key=lambda step: _distance(step["ms"], self.target), default=None)
        return best["value"] if best else None


@dataclass
class _Sizing:
    task: Task
    knob: Knob | None
    search: Search | None = None
    variants: dict[int, Task] = dataclasses.field(default_factory=dict)
    done: bool = False
    note: str = ""


class Sizer:
    """Sizing as a state machine over many tasks, so a driver can move each task on as soon
    as its own probe returns instead of waiting for a whole round (``size_tasks`` is the
    lockstep driver). ``start`` names the first variants to measure; ``observe`` takes one
    measurement and names what to measure next and which tasks (by input index) are done;
    ``sized`` is a done task's chosen variant."""

    def __init__(self, tasks: Sequence[Task], window: tuple[float, float], cfg: Any):
        self.cfg = cfg  # opsynth.config.SizingConfig: a Rule with constant_names
        self.target = target_ms(window)
        self._states: list[_Sizing] = []
        # variant id -> indices of the tasks waiting for its measurement
        self._waiting: dict[str, list[int]] = {}
        for task in tasks:
            knob = find_knob(task.code, cfg.constant_names)
            state = _Sizing(task, knob)
            if knob is None:
                state.done, state.note = True, f"no {'/'.join(cfg.constant_names)} constant"
            else:
                state.search = Search(knob.value, self.target, cfg)
                state.variants[knob.value] = task
            self._states.append(state)

    def start(self) -> tuple[list[Task], list[int]]:
        """The first variants to measure (each task as composed), and the tasks that need no
        measurement (no size constant): done already."""
        probes = []
        for index, state in enumerate(self._states):
            if not state.done:
                probes += self._wait_for(index)
        return probes, [i for i, s in enumerate(self._states) if s.done]

    def observe(self, variant_id: str, probe: Probe) -> tuple[list[Task], list[int]]:
        """Record ``probe`` for every task waiting on ``variant_id``: the variants to measure
        next, and the tasks this measurement finished. A measurement nobody waits for (the
        same variant measured twice) changes nothing."""
        probes: list[Task] = []
        finished: list[int] = []
        for index in self._waiting.pop(variant_id, []):
            state = self._states[index]
            assert state.search is not None
            value = state.search.observe(probe)
            if value is None:
                state.done = True
                finished.append(index)
            else:
                state.variants[value] = _variant(state.task, state.knob, value)
                probes += self._wait_for(index)
        return probes, finished

    def take(self, variant_id: str) -> list[int]:
        """The tasks waiting on ``variant_id``, for a driver that sized them another way
        (``filters.size_inline``): done here, and never measured."""
        indices = self._waiting.pop(variant_id, [])
        for index in indices:
            self._states[index].done = True
        return indices

    def sized(self, index: int) -> Task:
        """Task ``index`` (a done one) as chosen, with ``meta["sizing"]``."""
        return _chosen(self._states[index], self.target, self.cfg)

    def result(self) -> list[Task]:
        return [self.sized(i) for i in range(len(self._states))]

    def _wait_for(self, index: int) -> list[Task]:
        state = self._states[index]
        assert state.search is not None
        variant = state.variants[state.search.current]
        first = variant.id not in self._waiting
        self._waiting.setdefault(variant.id, []).append(index)
        return [variant] if first else []


def size_tasks(
    tasks: Sequence[Task], measure: Measure, window: tuple[float, float], cfg: Any
) -> list[Task]:
    """Each task, or its rescaled variant closest to the window's log-middle, with
    ``meta["sizing"]`` recording the device, the target and every step. All tasks move in
    lockstep, so each round is one parallel ``measure`` call (for runners that take whole
    batches; ``Sizer`` lets a driver move each task on by itself)."""
    sizer = Sizer(tasks, window, cfg)
    pending, _ = sizer.start()
    while pending:
        probes = measure(pending)
        following: list[Task] = []
        for variant in pending:
            probe = probes.get(variant.id, Probe(None, reason="not measured"))
            following += sizer.observe(variant.id, probe)[0]
        pending = following
    return sizer.result()


def _bisect(steps: list[dict[str, Any]], target: float) -> int | None:
    """The power of two halfway (in log space) between the largest size measured below the
    target and the smallest measured above it: runtime is not linear across cache sizes, so
    the linear step can jump back and forth between two sizes that straddle the target."""
    below = [st["value"] for st in steps if st["ms"] and st["ms"] < target]
    above = [st["value"] for st in steps if st["ms"] and st["ms"] > target]
    if not below or not above:
        return None
    lo, hi = max(below), min(above)
    return 2 ** round((math.log2(lo) + math.log2(hi)) / 2) if lo < hi else None


def _variant(task: Task, knob: Knob | None, value: int) -> Task:
    assert knob is not None
    return dataclasses.replace(task, code=set_knob(task.code, knob, value), id="")


def _record(
    knob: Knob | None, steps: list[dict[str, Any]], device: str, target: float, cfg: Rule
) -> dict[str, Any]:
    return {
        "device": device,
        "target_ms": round(target, 4),
        "band": cfg.band,
        "max_device_gib": cfg.max_device_gib,
        "constant": knob.name if knob else None,
        "steps": steps,
    }


def _with_sizing(task: Task, base: Task, record: dict[str, Any]) -> Task:
    if base is not task:
        record["from_id"] = task.id
    return dataclasses.replace(base, meta={**base.meta, "sizing": record}, id="")


def _chosen(s: _Sizing, target: float, cfg: Rule) -> Task:
    value = s.search.chosen() if s.search else None
    if value is None and s.knob is not None:
        value = s.knob.value
    steps, device = (s.search.steps, s.search.device) if s.search else ([], "")
    record = {**_record(s.knob, steps, device, target, cfg), "chosen": value}
    if s.note:
        record["note"] = s.note
    base = s.variants.get(value, s.task) if value is not None else s.task
    return _with_sizing(s.task, base, record)


def claimed(task: Task, claim: Any, device: str, window: tuple[float, float], cfg: Any) -> Task:
    """``task``'s variant that its own filter process says it chose (``filters.size_inline``),
    with ``meta["sizing"]`` as ``Sizer`` writes it plus ``"measured": "in_filter_process"``.
    The claim is untrusted: only its chosen value is used, to rewrite the literal here, and it
    must be a value the search could have chosen (the composed one, or a measured power of two
    or three times one within ``max_value``); the steps are kept as the candidate reported
    them, their known fields only. ValueError, with the reason, for anything else."""
    knob = find_knob(task.code, cfg.constant_names)
    if knob is None:
        raise ValueError("a sizing claim for a task without a size constant")
    if not isinstance(claim, dict):
        raise ValueError("the sizing claim is not an object")
    steps, value = claim.get("steps"), claim.get("chosen")
    if not isinstance(steps, list) or not 0 < len(steps) <= cfg.max_steps + 1:
        raise ValueError(f"the sizing claim has no list of 1 to {cfg.max_steps + 1} steps")
    steps = [_clean_step(step) for step in steps]
    values = [step["value"] for step in steps]
    if values[0] != knob.value:
        raise ValueError("the sizing claim's first step is not the composed size")
    if type(value) is not int or value not in values:
        raise ValueError(f"the sizing claim chose {value!r}, which it did not measure")
    if value != knob.value and not (0 < value <= cfg.max_value and on_ladder(value)):
        raise ValueError(
            f"the sizing claim chose {value}, not a power of two (or three times one) within "
            "max_value"
        )
    record = {**_record(knob, steps, device, target_ms(window), cfg), "chosen": value}
    record["measured"] = "in_filter_process"
    base = task if value == knob.value else _variant(task, knob, value)
    return _with_sizing(task, base, record)


def _clean_step(step: Any) -> dict[str, Any]:
    """A claimed step as ``Search`` writes one, rebuilt from checked fields only: nothing
    else a candidate put in it reaches the published record."""
    if not isinstance(step, dict) or type(step.get("value")) is not int or step["value"] < 1:
        raise ValueError("a sizing step without a positive integer value")
    clean: dict[str, Any] = {"value": step["value"]}
    for key in ("ms", "device_gib"):
        number = step.get(key)
        if number is not None and not (
            isinstance(number, (int, float))
            and not isinstance(number, bool)
            and math.isfinite(number)
            and number >= 0
        ):
            raise ValueError(f"a sizing step whose {key} is not a finite number")
        if key == "ms" or number is not None:
            clean[key] = None if number is None else float(number)
    reason = step.get("reason", "")
    if reason != "" and reason not in reasons.ALL:
        raise ValueError(f"a sizing step with an unknown reason {str(reason)[:40]!r}")
    clean["reason"] = reason
    return {k: clean[k] for k in ("value", "ms", "reason", "device_gib") if k in clean}
