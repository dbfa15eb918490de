"""benchmarks/request_latency.py: every request is timed, with and without neighbours."""

from __future__ import annotations

from benchmarks.request_latency import REQUESTS, main


def test_each_request_is_timed_beside_each_neighbour_count(capsys) -> None:
    found = main(
        ["--device", "cpu", "--neighbours", "0", "1", "--elements", "4096"] + ["--rounds", "3"]
    )
    assert set(found) == {0, 1}
    for times in found.values():
        assert set(times) == set(REQUESTS)
        assert all(len(values) == 3 and min(values) > 0 for values in times.values())
    printed = capsys.readouterr().out
    assert printed.count("| 1 | ") == len(REQUESTS) and "| 0 | run_and_sample |" in printed
