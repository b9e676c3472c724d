"""Live board: the fleet poll alone against the poll plus doorbell rings (issue 14, item 2).

Both modes run side by side in one process tree, alternating per repeat, each on a fresh uvicorn
process (``SWITCHBOARD_LIVE_BOARD_RINGS`` 0 or 1) with ``BOARDS`` live boards open on it:

- ``create_ms``: from the commit of a todo_create (a change that rings) to the ``swap`` event
  arriving at the first board, p50 over ``RUNS`` creates;
- ``claim_ms``: the same for a claim (a change that rings nothing: the poll must see it);
- ``idle``: with the boards open and nothing changing, the server's CPU (percent of one core)
  and the database's transactions per second (``pg_stat_database``, every session's);
- ``busy``: the same while a todo is created every ``BUSY_EVERY_S`` (a steady stream of rings).

The fleet is ``bench.fleet`` at 40 identities and 2,000 todos (the board's render cost is the
console bench's concern; this compares how a change reaches it).
"""

from __future__ import annotations

import os
import queue
import statistics
import time
from typing import Any

BOARDS = 10
RUNS = 6
BUSY_EVERY_S = 0.1
MODES = {"poll": "0", "poll+rings": "1"}


def _db_transactions() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        )
        return int(cursor.fetchone()[0])


def _load(server: Any, seconds: float, during: Any = None) -> dict[str, float]:
    """Server CPU and database transactions per second over ``seconds`` (``during`` runs on
    this thread meanwhile, called until the time is up)."""
    time.sleep(1.5)  # let the statistics flush what came before
    cpu0, tx0, t0 = server.cpu_times(), _db_transactions(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        if during is None:
            time.sleep(0.1)
        else:
            during()
    time.sleep(1.5)  # the statistics collector flushes about once a second
    cpu1, tx1 = server.cpu_times(), _db_transactions()
    elapsed = time.perf_counter() - t0
    busy = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    return {
        "server_cpu_percent_of_one_core": round(100 * busy / elapsed, 1),
        "db_transactions_per_s": round((tx1 - tx0) / (elapsed + 1.5), 1),
    }


def _mode(fleet: Any, session_cookie: str, rings: str, duration: float) -> dict[str, Any]:
    import httpx

    from bench.common import StreamReader
    from bench.doorbell_bench import _server_process
    from queues import services
    from queues.access import AgentActor
    from switchboard.liveserver import live_server

    healthy = [
        pair for pair in fleet.identities if not any(pair in v for v in fleet.trouble.values())
    ]
    events: queue.Queue[tuple[float, str]] = queue.Queue()
    with live_server(env={"SWITCHBOARD_LIVE_BOARD_RINGS": rings}) as base:
        server = _server_process(base)

        def on_line(line: str) -> None:
            if line.startswith("event: "):
                events.put((time.perf_counter(), line[7:]))

        # Ten boards; the first one's events are timed.
        readers = [
            StreamReader(
                f"{base}/live?here=/",
                on_line if i == 0 else lambda line: None,
                cookies={"sessionid": session_cookie},
                timeout=httpx.Timeout(10.0, read=None),
            )
            for i in range(BOARDS)
        ]
        time.sleep(4.0)  # connected, baselines rendered
        idle = _load(server, duration)

        def swap_after(change: Any) -> float:
            while not events.empty():
                events.get_nowait()
            t0 = time.perf_counter()
            change()  # commits
            while True:
                at, kind = events.get(timeout=15)
                if kind == "swap":
                    time.sleep(1.0)
                    return (at - t0) * 1000

        created, claimed = [], []
        for i in range(RUNS):
            endpoint, name = healthy[i % len(healthy)]
            agent = AgentActor(endpoint, via="bench")
            created.append(
                swap_after(
                    lambda e=endpoint, n=name, a=agent: services.todo_create(
                        actor=a, endpoint=e, queue=n, title="bench live"
                    )
                )
            )
            claimed.append(
                swap_after(
                    lambda n=name, a=agent: services.claim_next(
                        actor=a, queue=n, claimant="bench-live"
                    )
                )
            )
        endpoint, name = healthy[0]
        agent = AgentActor(endpoint, via="bench")

        def create_steadily() -> None:
            services.todo_create(actor=agent, endpoint=endpoint, queue=name, title="bench busy")
            time.sleep(BUSY_EVERY_S)

        busy = _load(server, duration, create_steadily)
        for reader in readers:  # before the server stops
            reader.close()
    return {
        "create_ms": round(statistics.median(created), 1),
        "claim_ms": round(statistics.median(claimed), 1),
        "idle": idle,
        "busy": busy,
    }


def run(duration: float = 5.0, repeats: int = 2) -> dict[str, Any]:
    from django.test import Client

    from bench.fleet import seed

    fleet = seed(identities=40, todos=2_000, ledger_rows=100, prefix="boardlive")
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(fleet.owner)
    cookie = client.cookies["sessionid"].value
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for _ in range(repeats):
        for mode, flag in MODES.items():
            runs[mode].append(_mode(fleet, cookie, flag, duration))

    def median(mode: str, *path: str) -> float:
        values = []
        for r in runs[mode]:
            v: Any = r
            for key in path:
                v = v[key]
            values.append(v)
        return round(statistics.median(values), 1)

    figures = {
        mode: {
            "create_to_board_p50_ms": median(mode, "create_ms"),
            "claim_to_board_p50_ms": median(mode, "claim_ms"),
            "idle_server_cpu_percent": median(mode, "idle", "server_cpu_percent_of_one_core"),
            "idle_db_tx_per_s": median(mode, "idle", "db_transactions_per_s"),
            "busy_server_cpu_percent": median(mode, "busy", "server_cpu_percent_of_one_core"),
            "busy_db_tx_per_s": median(mode, "busy", "db_transactions_per_s"),
        }
        for mode in MODES
    }
    return {
        "boards": BOARDS,
        "repeats": repeats,
        "load_average_1m": {"before": load_before[0], "after": os.getloadavg()[0]},
        "figures": figures,
        "runs": runs,
    }
