"""The HTTP benches refuse a run whose queue ran dry (``bench.http_bench.supplied``): its
cycles/s would be the todos loaded divided by the run's length, not the server's rate. On
2026-12-02 the baseline at 8 clients read 1,366.1–1,366.4 cycles/s in four runs: the 4,100
todos loaded for 3 s, every time."""

from __future__ import annotations

import pytest

from bench import http_bench


def test_a_run_that_found_the_queue_empty_is_refused() -> None:
    with pytest.raises(
        RuntimeError, match=r"baseline ran out of todos \(7 empty claims after 4100"
    ):
        http_bench.supplied({"cycles": 4100, "empty": 7}, "baseline")


def test_a_run_that_never_ran_dry_is_kept() -> None:
    result = {"cycles": 4100, "empty": 0}
    assert http_bench.supplied(result, "rest") is result


def test_each_run_loads_more_than_this_machine_can_claim() -> None:
    # Over twice the fastest rate measured here (the baseline, ~1,370 cycles/s at 8 clients).
    assert http_bench.todos_for(3) >= 3 * 2 * 1_370
