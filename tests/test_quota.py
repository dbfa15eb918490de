"""A run's target split over data sources, later rounds' plans and the exported order."""

from __future__ import annotations

import pytest

from opsynth.config import OPS6K_MIX
from opsynth.quota import apportion, filled, in_quota_order, round_plan, shortfall
from opsynth.record import Task


def rows(*sources: str) -> list[Task]:
    return [Task(ops=[f"op{i}"], data_source=s, code=f"# {i}") for i, s in enumerate(sources)]


def test_apportion_sums_to_the_total_by_largest_remainder() -> None:
    parts = apportion(6000, OPS6K_MIX)
    assert sum(parts.values()) == 6000
    assert parts["torch#2"] == 5026 and parts["transformers"] == 71 and parts["torch#5"] == 74
    for source, share in OPS6K_MIX.items():
        assert abs(parts[source] - 6000 * share / sum(OPS6K_MIX.values())) < 1
    assert apportion(3, {"a": 0.5, "b": 0.5}) == {"a": 2, "b": 1}  # a tie goes to the first
    assert apportion(2, {"a": 1.0, "b": 0.0}) == {"a": 2, "b": 0}
    with pytest.raises(ValueError):
        apportion(3, {"a": 0.0})


def test_filled_counts_each_source_up_to_its_quota() -> None:
    quota = {"torch#1": 1, "torch#2": 2}
    accepted = rows("torch#2", "torch#2", "torch#2", "torch#3")
    assert filled(accepted, quota) == 2
    assert shortfall(accepted, quota) == {"torch#1": 1}
    assert shortfall(accepted + rows("torch#1"), quota) == {}


def test_round_plan_follows_each_sources_acceptance_so_far() -> None:
    screened = rows(*["torch#1"] * 10, *["torch#3"] * 4)
    accepted = [t for t in screened if t.data_source == "torch#3"][:2] + screened[:2]
    # torch#1 accepted 2 of 10: 5 per task; torch#3 2 of 4, under the floor of 1.3
    plan = round_plan({"torch#1": 3, "torch#3": 10}, screened, accepted, 1.3)
    assert plan == {"torch#1": 15, "torch#3": 20}
    # never screened or never accepted: the configured oversample
    assert round_plan({"torch#4": 10}, screened, accepted, 1.3) == {"torch#4": 13}
    # a source with few seeds left asks for no more than there are; none left, none
    assert round_plan({"transformers": 10}, [], [], 1.3, {"transformers": 4}) == {"transformers": 4}
    assert round_plan({"transformers": 10}, [], [], 1.3, {"transformers": 0}) == {}


def test_in_quota_order_fills_quotas_then_the_rest_in_acceptance_order() -> None:
    accepted = rows("torch#2", "torch#2", "torch#2", "torch#1", "torch#3", "torch#2")
    quota = {"torch#1": 2, "torch#2": 2, "torch#3": 1}
    ordered = in_quota_order(accepted, quota)
    assert [t.data_source for t in ordered[:5]] == [
        "torch#2",
        "torch#2",
        "torch#1",
        "torch#3",
        "torch#2",  # torch#1 is one short: the earliest extra row takes its place
    ]
    assert ordered[:2] == accepted[:2] and ordered[4] == accepted[2]
    assert sorted(t.id for t in ordered) == sorted(t.id for t in accepted)
