"""What the orchestrator accepts from a sandboxed process: every malformed field is named."""

from __future__ import annotations

import json
import math

import pytest

from opsynth.filters import protocol, reasons

GOOD_ROW = {
    "stage": "eager",
    "passed": True,
    "reason": "ok",
    "detail": "",
    "elapsed_s": 0.25,
    "measures": {"eager_ms": 1.5, "shapes": [[2, 3], [4]], "note": None, "fused": True},
}


def test_a_well_formed_row_passes() -> None:
    assert protocol.row_problem(GOOD_ROW, "eager") == ""
    failed = {**GOOD_ROW, "passed": False, "reason": "constant_output"}
    assert protocol.row_problem(failed, "eager") == ""


def test_a_task_with_a_thousand_outputs_is_not_a_violation() -> None:
    """``torch.unbind`` of a 1024-row batch returns 1024 tensors, each described in the eager
    row's measures: an honest candidate, which must get its verdict on its merits."""
    outputs = [{"shape": [3, 32, 32], "dtype": "float32"} for _ in range(1024)]
    row = {**GOOD_ROW, "measures": {**GOOD_ROW["measures"], "outputs": outputs}}
    assert protocol.row_problem(row, "eager") == ""


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"stage": "compile"}, "expected 'eager'"),
        ({"passed": 1}, "'passed'"),
        ({"reason": "totally_fine"}, "unknown reason"),
        ({"reason": "constant_output"}, "contradicts"),
        ({"passed": False}, "contradicts"),
        ({"detail": 7}, "'detail'"),
        ({"detail": "x" * (protocol.MAX_DETAIL_CHARS + 1)}, "'detail'"),
        ({"elapsed_s": "fast"}, "'elapsed_s'"),
        ({"elapsed_s": math.nan}, "'elapsed_s'"),
        ({"elapsed_s": -1.0}, "'elapsed_s'"),
        ({"elapsed_s": True}, "'elapsed_s'"),
        ({"measures": [1, 2]}, "'measures' must be an object"),
        ({"measures": {"eager_ms": math.inf}}, "eager_ms"),
        ({"measures": {"deep": [[[[[[[[1]]]]]]]]}}, "deep"),
        ({"measures": {"big": list(range(protocol.MAX_ITEMS + 1))}}, "big"),
        ({"measures": {str(i): i for i in range(protocol.MAX_MEASURES + 1)}}, "entries"),
        ({"measures": {"k" * 100: 1}}, "not a short string"),
        ({"measures": {"obj": object()}}, "unexpected form"),
        # integers no float or 64-bit column holds (``math.isfinite`` raises on the first)
        ({"measures": {"n": 10**400}}, "unexpected form"),
        ({"measures": {"n": 1 << 63}}, "unexpected form"),
        ({"elapsed_s": 10**400}, "'elapsed_s'"),
    ],
)
def test_each_malformed_field_is_named(change: dict, says: str) -> None:
    assert says in protocol.row_problem({**GOOD_ROW, **change}, "eager")


def test_a_line_with_lone_surrogates_decodes_to_writable_text() -> None:
    """``"\\ud800"`` in a JSON line decodes to a string the parquet writer refuses; a line
    from a sandboxed process gets its escape text instead, and a real pair stays a character."""
    line = json.dumps({"detail": "bad \ud800", "measures": {"k\udfff": ["\U0001f600"]}})
    event = protocol.decode_line(line.encode())
    assert event == {"detail": "bad \\ud800", "measures": {"k\\udfff": ["\U0001f600"]}}
    json.dumps(event).encode("utf-8")
    "".join([event["detail"], *event["measures"]]).encode("utf-8")
    with pytest.raises(ValueError):
        protocol.decode_line(b"{not json")


@pytest.mark.parametrize("row", [None, [], "ok", 3, ["eager", True]])
def test_a_row_that_is_not_an_object_is_refused(row: object) -> None:
    assert "must be an object" in protocol.row_problem(row, "eager")


def test_a_row_after_the_last_stage_is_refused() -> None:
    assert "after the last stage" in protocol.row_problem(GOOD_ROW, None)


def test_the_reason_code_is_documented() -> None:
    assert "protocol_violation" in reasons.INFRA


@pytest.mark.parametrize("pid", [10**400, 1 << 40, 0, -1, True, "12"])
def test_a_started_line_names_a_real_process_id_or_is_a_violation(pid: object) -> None:
    """The pool kills a candidate's process group by the pid its worker reports: a number
    no kernel gives is refused before anything uses it."""
    from types import SimpleNamespace

    from opsynth.filters.pool_events import event_problem

    worker = SimpleNamespace(task=SimpleNamespace(id="t"), verdicts=[], stages=("eager",))
    assert event_problem(worker, {"event": "started", "task_id": "t", "pid": pid})
    assert not event_problem(worker, {"event": "started", "task_id": "t", "pid": 4242})
