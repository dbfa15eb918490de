"""A run's outcome from its verdicts (opsynth.verdicts): pure, no flow."""

from __future__ import annotations

from opsynth.record import Task, Verdict
from opsynth.verdicts import group_by_task, outcome, passed_all


def tasks(n: int) -> list[Task]:
    return [Task(ops=[f"op{i}"], data_source="torch#1", code=f"# {i}\n") for i in range(n)]


def test_tasks_past_the_target_get_their_own_verdict_and_are_rejected() -> None:
    candidates = tasks(4)
    verdicts = [Verdict(t.id, "runtime", True, "ok", "", {"eager_ms": 2.0}) for t in candidates]
    verdicts.append(Verdict(candidates[3].id, "dedup", False, "near_duplicate"))
    accepted = candidates[:3]
    result = outcome(candidates, verdicts, accepted, cap=2)
    assert [t.id for t in result.exported] == [t.id for t in accepted[:2]]
    assert {t.id for t in result.rejected} == {candidates[2].id, candidates[3].id}
    over = [v for v in result.verdicts if v.reason == "over_target"]
    assert [v.task_id for v in over] == [candidates[2].id] and result.complete
    assert result.exported[0].meta["filters"]["runtime"] == {"eager_ms": 2.0}
    short = outcome(candidates, verdicts, accepted, cap=5)
    assert not short.complete and len(short.exported) == 3
    assert outcome(candidates, verdicts, accepted, cap=None).complete


def test_a_task_passes_only_with_rows_all_passed() -> None:
    a, b = tasks(2)
    rows = [Verdict(a.id, "eager", True, "ok"), Verdict(a.id, "runtime", False, "too_slow")]
    by_task = group_by_task([*rows, Verdict(b.id, "eager", True, "ok")])
    assert [v.stage for v in by_task[a.id]] == ["eager", "runtime"]
    assert not passed_all(a.id, by_task) and passed_all(b.id, by_task)
    assert not passed_all("missing", by_task)
