"""Shared bench plumbing: a bench database, timed worker pools, results as JSON."""

from __future__ import annotations

import json
import os
import platform
import statistics
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def timed_pool(
    workers: int,
    duration_s: float,
    cycle: Callable[[int], bool],
    *,
    setup: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run ``cycle(worker)`` in ``workers`` threads for ``duration_s``; each call is one cycle and
    returns False when there is no more work. Returns cycles/s and latency percentiles (ms)."""
    from django.db import connections

    latencies: list[list[float]] = [[] for _ in range(workers)]
    stop = threading.Event()
    barrier = threading.Barrier(workers + 1)
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            if setup:
                setup()
            barrier.wait()
            while not stop.is_set():
                t0 = time.perf_counter()
                if not cycle(i):
                    break
                latencies[i].append(time.perf_counter() - t0)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    time.sleep(duration_s)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    flat = sorted(x for lat in latencies for x in lat)
    return {
        "workers": workers,
        "cycles": len(flat),
        "seconds": round(elapsed, 3),
        "cycles_per_s": round(len(flat) / elapsed, 1),
        "p50_ms": round(_pct(flat, 50) * 1000, 3) if flat else None,
        "p99_ms": round(_pct(flat, 99) * 1000, 3) if flat else None,
        "mean_ms": round(statistics.fmean(flat) * 1000, 3) if flat else None,
    }


def _pct(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    k = min(len(values) - 1, max(0, round(p / 100 * (len(values) - 1))))
    return values[k]


def write_result(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    data = {
        "bench": name,
        "at": stamp,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        **data,
    }
    path = RESULTS / f"{name}-{stamp}.json"
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    (RESULTS / f"{name}-latest.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path
