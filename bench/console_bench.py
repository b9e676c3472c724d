"""Console bench: the operator's pages on a large fleet (``bench.fleet``: 100 queue identities,
10,000 todos, 20,000 ledger rows).

- board: server time of ``GET /`` (the whole Django request, in process), median and p90 of
  ``BOARD_RUNS`` renders after a warm-up, and its query count;
- ledger: the same for ``GET /ledger``;
- live: from the commit of a change to the live board's ``swap`` event arriving at an
  EventSource-like client of a real uvicorn process, ``LIVE_RUNS`` times (p50 and max).

Targets (issue 16): board ≤ 150 ms, ledger page ≤ 100 ms, live update p50 ≤ 1 s.
"""

from __future__ import annotations

import queue
import statistics
import threading
import time
from typing import Any

BOARD_RUNS = 15
LIVE_RUNS = 8
TARGETS_MS = {"board": 150.0, "ledger": 100.0, "live_p50": 1000.0}


def _page(client: Any, url: str, runs: int) -> dict[str, Any]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for _ in range(2):
        assert client.get(url).status_code == 200, url
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - t0) * 1000)
        assert response.status_code == 200, url
    with CaptureQueriesContext(connection) as queries:
        client.get(url)
    times.sort()
    return {
        "url": url,
        "median_ms": round(statistics.median(times), 1),
        "p90_ms": round(times[int(0.9 * (len(times) - 1))], 1),
        "queries": len(queries),
        "bytes": len(response.content),
    }


def _verify_ms() -> float:
    """The ledger page's chain badge verifies the whole chain; its share of the page time."""
    from switchboard.ledger import chain as ledger

    t0 = time.perf_counter()
    ledger.verify()
    return round((time.perf_counter() - t0) * 1000, 1)


def _live(fleet: Any, session_cookie: str) -> dict[str, Any]:
    import httpx

    from queues import services
    from queues.access import AgentActor
    from switchboard.liveserver import live_server

    events: queue.Queue[tuple[float, str]] = queue.Queue()
    healthy = [
        pair for pair in fleet.identities if not any(pair in v for v in fleet.trouble.values())
    ]
    latencies: list[float] = []
    with live_server() as base:
        stop = threading.Event()

        def read() -> None:
            with httpx.stream(
                "GET",
                f"{base}/live?here=/",
                cookies={"sessionid": session_cookie},
                timeout=httpx.Timeout(5.0, read=None),
            ) as response:
                for line in response.iter_lines():
                    if stop.is_set():
                        return
                    if line.startswith("event: "):
                        events.put((time.perf_counter(), line[7:]))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        time.sleep(3.0)  # connected, baseline rendered
        for i in range(LIVE_RUNS):
            while not events.empty():
                events.get_nowait()
            endpoint, name = healthy[i % len(healthy)]
            agent = AgentActor(endpoint, via="bench")
            t0 = time.perf_counter()
            services.claim_next(actor=agent, queue=name, claimant="bench-live")  # commits
            while True:
                at, kind = events.get(timeout=15)
                if kind == "swap":
                    latencies.append((at - t0) * 1000)
                    break
            time.sleep(1.2)
        stop.set()
    latencies.sort()
    return {
        "runs": len(latencies),
        "p50_ms": round(statistics.median(latencies), 1),
        "max_ms": round(latencies[-1], 1),
    }


def run(duration_s: float = 5.0) -> dict[str, Any]:
    from django.test import Client

    from bench.fleet import seed

    t0 = time.perf_counter()
    fleet = seed(identities=100, todos=10_000, ledger_rows=20_000, prefix="bench")
    seeded = round(time.perf_counter() - t0, 1)
    client = Client(HTTP_HOST="127.0.0.1")  # a host ALLOWED_HOSTS admits by default
    client.force_login(fleet.owner)
    board = _page(client, "/", BOARD_RUNS)
    ledger = _page(client, "/ledger", BOARD_RUNS)
    ledger["verify_ms"] = _verify_ms()
    live = _live(fleet, client.cookies["sessionid"].value)
    figures = {
        "board": board["median_ms"],
        "ledger": ledger["median_ms"],
        "live_p50": live["p50_ms"],
    }
    return {
        "fleet": {"identities": 100, "todos": 10_000, "ledger_rows": 20_000, "seed_s": seeded},
        "board": board,
        "ledger": ledger,
        "live": live,
        "targets_ms": TARGETS_MS,
        "met": {k: figures[k] <= TARGETS_MS[k] for k in TARGETS_MS},
    }
