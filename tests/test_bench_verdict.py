"""The HTTP bench's verdict (``bench.http_bench._verdict``): the targets' ratios, and beside
them what tells a slow server from a wide tail. Figures from the bench of record on 2026-12-02
(bench/results/http-20261202T203515Z.json on a 2-core machine)."""

from __future__ import annotations

from typing import Any

import pytest

from bench import http_bench


def _table(
    rest_cycles: float = 388.3, rest_p50: float = 19.82, rest_p99: float = 38.59
) -> dict[str, Any]:
    def run(cycles: float, p50: float, p99: float) -> dict[str, float]:
        return {"cycles_per_s": cycles, "p50_ms": p50, "p99_ms": p99}

    return {
        "baseline": {1: run(279.1, 3.31, 8.41), 8: run(874.7, 8.47, 19.96)},
        "rest": {1: run(176.1, 5.18, 15.33), 8: run(rest_cycles, rest_p50, rest_p99)},
        "mcp": {1: run(145.6, 6.35, 15.07), 8: run(322.9, 24.11, 43.17)},
    }


def test_the_verdict_gives_the_ratios_and_the_tail_shape() -> None:
    rest = http_bench._verdict(_table())["rest"]
    assert rest["cycles_ratio_at_8"] == 0.444
    assert rest["p99_at_8_over_baseline_p50"] == 4.56
    assert rest["p50_at_1_over_baseline_p50"] == 1.56
    assert rest["met"] == {"cycles_ratio_at_8": False, "p99_at_8": False, "p50_at_1": True}
    assert not rest["all_met"]
    # Its own tail is narrower than the yardstick's: the p99 misses because the rate does.
    assert rest["own_p99_over_p50_at_8"] == 1.95
    assert rest["yardstick_p99_over_p50_at_8"] == 2.36
    # At this tail shape the p99 target needs 0.674 of the yardstick's rate, not 0.5.
    assert rest["cycles_ratio_for_p99_at_8"] == 0.674


def test_at_the_ratio_it_names_with_the_same_tail_the_p99_target_is_just_met() -> None:
    needed = http_bench._verdict(_table())["rest"]["cycles_ratio_for_p99_at_8"]
    # Latency scales as 1 / cycles/s in a closed loop: the same run (the same tail shape), sped
    # up to the named ratio.
    speedup = needed / (388.3 / 874.7)
    faster = http_bench._verdict(_table(388.3 * speedup, 19.82 / speedup, 38.59 / speedup))["rest"]
    assert faster["own_p99_over_p50_at_8"] == 1.95
    assert faster["p99_at_8_over_baseline_p50"] == pytest.approx(3.0, abs=0.01)
    assert faster["cycles_ratio_for_p99_at_8"] == pytest.approx(needed, abs=0.001)


def _runs(base8: list[float], rest8: list[float]) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """Rounds of runs as ``side_by_side`` keeps them: the yardstick's and the protocols', one
    each per round, at 1 and 8 clients; at 8, (cycles/s) and a closed loop's p50 (8 ÷ rate)
    with a p99 twice that."""

    def run(cycles: float) -> dict[str, float]:
        p50 = 8000 / cycles
        return {"cycles_per_s": cycles, "p50_ms": p50, "p99_ms": 2 * p50}

    def at_one(p50: float) -> dict[str, float]:
        return {"cycles_per_s": 1000 / p50, "p50_ms": p50, "p99_ms": 2 * p50}

    return {
        "baseline": {1: [at_one(2.0)] * len(base8), 8: [run(c) for c in base8]},
        "rest": {1: [at_one(2.8)] * len(rest8), 8: [run(c) for c in rest8]},
        "mcp": {1: [at_one(4.2)] * len(rest8), 8: [run(c) for c in rest8]},
    }


def test_the_paired_verdict_divides_each_round_by_the_yardstick_s_run_of_that_round() -> None:
    # The host slowed everything by a fifth in the last round: each round's ratio is 0.6.
    runs = _runs([1500.0, 1500.0, 1200.0], [900.0, 900.0, 720.0])
    rest = http_bench._paired_verdict(runs)["rest"]
    assert rest["rounds"]["cycles_ratio_at_8"] == [0.6, 0.6, 0.6]
    assert rest["cycles_ratio_at_8"] == 0.6
    # p99 = 2 × its p50 = 2 × 8 / rate: ÷ the baseline's p50 (8 / its rate) = 2 ÷ 0.6 each round.
    assert rest["rounds"]["p99_at_8_over_baseline_p50"] == [3.333] * 3
    assert rest["p50_at_1_over_baseline_p50"] == 1.4
    assert rest["met"] == {"cycles_ratio_at_8": True, "p99_at_8": False, "p50_at_1": True}
    assert not rest["all_met"]
    assert http_bench._paired_verdict(runs)["mcp"]["met"]["p50_at_1"] is False  # 2.1 > 2


def test_the_paired_verdict_takes_each_ratio_s_median_over_the_rounds() -> None:
    # One round where the protocol alone ran in a slow spell: the median of the rounds' ratios
    # (0.667, that round left out) is not the ratio of the two median runs (``_verdict``'s,
    # 980 ÷ 1450).
    runs = _runs([1500.0, 1400.0, 1450.0], [1000.0, 700.0, 980.0])
    paired = http_bench._paired_verdict(runs)["rest"]
    assert paired["rounds"]["cycles_ratio_at_8"] == [0.667, 0.5, 0.676]
    assert paired["cycles_ratio_at_8"] == 0.667
    assert paired["p99_at_8_over_baseline_p50"] == 3.0
    assert paired["met"]["p99_at_8"]  # exactly at the bound: met, as in _verdict
    table = {k: {c: http_bench._median_run(r) for c, r in by.items()} for k, by in runs.items()}
    assert http_bench._verdict(table)["rest"]["cycles_ratio_at_8"] == 0.676  # 980 ÷ 1450
