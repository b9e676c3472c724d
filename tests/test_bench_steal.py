"""The benches record the hypervisor's steal over each timed window (``bench.common.host_cpu``,
``steal_share``): on a shared host another guest's load moves every rate a bench reports."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bench import common, core_bench

# A /proc/stat first line: user nice system idle iowait irq softirq steal guest guest_nice.
BEFORE = "cpu  1000 10 200 5000 40 0 15 100 0 0\ncpu0 1 2 3\n"
# 1,000 ticks later: 600 user, 100 system, 150 idle, 50 iowait, 100 steal.
AFTER = "cpu  1600 10 300 5150 90 0 15 200 0 0\ncpu0 1 2 3\n"


def _stat(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_the_steal_share_is_the_stolen_ticks_over_every_tick_in_between(tmp_path: Path) -> None:
    before = common.host_cpu(_stat(tmp_path, "a", BEFORE))
    after = common.host_cpu(_stat(tmp_path, "b", AFTER))
    assert before == (1000, 10, 200, 5000, 40, 0, 15, 100)
    assert common.steal_share(before, after) == 0.1


def test_no_reading_or_no_tick_gives_no_share(tmp_path: Path) -> None:
    reading = common.host_cpu(_stat(tmp_path, "a", BEFORE))
    assert common.host_cpu(str(tmp_path / "missing")) == ()
    assert common.host_cpu(_stat(tmp_path, "short", "cpu 1 2 3\n")) == ()
    assert common.host_cpu(_stat(tmp_path, "other", "intr 1 2 3 4 5 6 7 8 9\n")) == ()
    assert common.steal_share((), reading) is None
    assert common.steal_share(reading, ()) is None
    assert common.steal_share(reading, reading) is None


def test_this_machine_reports_its_cpu_time() -> None:
    # CI and the benches run on Linux: a missing reading here would leave every result without
    # its steal share.
    first = common.host_cpu()
    assert len(first) == 8
    deadline = time.monotonic() + 5
    while (later := common.host_cpu()) == first and time.monotonic() < deadline:
        sum(range(10_000))
    assert sum(later) > sum(first)


@contextmanager
def busy_loop(i: int) -> Iterator[Callable[[], bool]]:
    """A workload that needs no database: a few microseconds of CPU per cycle."""

    def cycle() -> bool:
        sum(range(200))
        return True

    yield cycle


def test_a_timed_pool_run_carries_its_window_s_steal_share() -> None:
    result = common.timed_pool(2, 0.3, f"{__name__}:busy_loop")
    assert result["cycles"] > 0
    share = result["cpu_steal_share"]
    assert isinstance(share, float) and 0.0 <= share <= 1.0


def test_the_core_bench_summarises_the_steal_of_every_loop_s_window() -> None:
    def loop(cycles: float, steal: float | None) -> dict[str, float | None]:
        return {"cycles_per_s": cycles, "cpu_steal_share": steal}

    runs = [
        {
            "workers": 4,
            "raw": loop(1000, 0.05),
            "raw_same_table": loop(800, 0.10),
            "switchboard": loop(700, None),
        },
        {
            "workers": 4,
            "raw": loop(1000, 0.20),
            "raw_same_table": loop(800, 0.0),
            "switchboard": loop(700, 0.15),
        },
    ]
    judged = core_bench._judge(runs)
    assert judged["cpu_steal_share"] == {
        "median": 0.1,
        "min": 0.0,
        "max": 0.2,
        "runs": [0.05, 0.1, 0.2, 0.0, 0.15],
    }
    assert judged["ratio_vs_raw"]["4"]["median"] == pytest.approx(0.7)
    no_reading = [{**r, **{k: loop(700, None) for k in core_bench.LOOPS}} for r in runs]
    assert core_bench._judge(no_reading)["cpu_steal_share"] is None
