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
