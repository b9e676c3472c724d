"""What an HTTP cycle costs PostgreSQL beside the same verbs called in-process (issue 11).

``python -m bench.http_db [--rounds R] [--duration S]`` against its own bench database
(BENCH_DATABASE, as ``python -m bench``): claim_next + complete in this process (threads, each
with its connection) and through REST (``bench.http_bench``'s Node client against one uvicorn),
at 1 and 8, interleaved, each run on ``bench.http_bench``'s reload (fresh todos, the tables
vacuumed) after the benches' history. Per run: cycles/s and the DB CPU per cycle over every
process of the server (``bench.http_bench._database_cpu``); with pg_stat_statements loaded
(``http_bench._pgss`` says how), the statements per cycle and the claim's shared buffers per
call. The medians are printed per kind and count.

The statements are the same both ways (the token lookup is cached, ``last_seen_at`` written at
most once a minute), so a difference at the same count is what serving over HTTP does to
PostgreSQL's cost per statement (its backends idle between requests, the web process and the
client on the same cores), and a difference between 1 and 8 is concurrency's. Not a benchmark:
``python -m bench --only http`` measures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from typing import Any

CLAIMS = "WITH cand AS%"  # the claim's statements (bare, lean, full)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.http_db")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per run")
    args = parser.parse_args(argv)
    from bench.__main__ import standalone

    return standalone(lambda: _run(args.rounds, args.duration))


def _statements() -> bool:
    """pg_stat_statements reset, when it is loaded; False when it is not."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements'")
        if cursor.fetchone() is None:
            try:
                cursor.execute("CREATE EXTENSION pg_stat_statements")
            except Exception:
                return False
        try:
            cursor.execute("SELECT pg_stat_statements_reset()")
        except Exception:
            return False
    return True


def _counted(cycles: int) -> dict[str, float]:
    """Top-level statements per cycle and the claim's shared buffers per call, since the reset
    (statements of this process's own bookkeeping, made between runs, are not counted)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(calls) FILTER (WHERE toplevel), 0),"
            " coalesce(sum(shared_blks_hit + shared_blks_read) FILTER (WHERE query LIKE %s), 0),"
            " coalesce(sum(calls) FILTER (WHERE query LIKE %s), 0)"
            " FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database"
            " WHERE datname = current_database()) AND query NOT LIKE %s",
            [CLAIMS, CLAIMS, "%pg_stat%"],
        )
        calls, buffers, claims = cursor.fetchone()
    return {
        "statements_per_cycle": round(float(calls) / max(1, cycles), 2),
        "claim_buffers_per_call": round(float(buffers) / max(1, int(claims)), 1),
    }


def _in_process(endpoint: Any, threads: int, seconds: float) -> dict[str, Any]:
    from django.db import connections

    from bench import http_bench
    from queues import services
    from queues.access import AgentActor

    actor = AgentActor(endpoint, via="api")
    counts = [0] * threads
    gate = threading.Barrier(threads + 1)
    until = [0.0]

    def cycle(claimant: str) -> None:
        claimed = services.claim_next(actor=actor, claimant=claimant)
        assert isinstance(claimed, services.Claimed)
        services.complete(actor=actor, todo_id=claimed.todo.id)

    def work(n: int) -> None:
        try:
            for _ in range(10):  # warm: this thread's connection and prepared statements
                cycle(f"w{n}")
            gate.wait()
            gate.wait()
            while time.monotonic() < until[0]:
                cycle(f"w{n}")
                counts[n] += 1
        finally:
            connections.close_all()

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    gate.wait()
    counted = _statements()
    db0 = http_bench._database_cpu()
    started = time.perf_counter()
    until[0] = time.monotonic() + seconds
    gate.wait()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    db1 = http_bench._database_cpu()
    cycles = sum(counts)
    result: dict[str, Any] = {"cycles": cycles, "cycles_per_s": round(cycles / elapsed, 1)}
    if db1:
        db = sum(t - db0.get(pid, 0.0) for pid, t in db1.items())
        result["db_cpu_ms_per_cycle"] = round(1000 * db / max(1, cycles), 2)
    if counted:
        result.update(_counted(cycles))
    return result


def _over_rest(base: str, token: str, pid: int, clients: int, seconds: float) -> dict[str, Any]:
    from bench import http_bench

    counted = _statements()
    run = http_bench._drive("rest", base, token, clients, seconds, pid)
    keep = ("cycles", "cycles_per_s", "db_cpu_ms_per_cycle")
    result: dict[str, Any] = {k: run[k] for k in keep if k in run}
    if counted:
        result.update(_counted(run["cycles"]))
    return result


def _run(rounds: int, seconds: float) -> None:
    from django.contrib.auth.models import User

    from bench import http_bench
    from bench.common import load_history
    from queues import services
    from queues.access import SystemActor
    from queues.models import Todo
    from switchboard.liveserver import live_server

    load_history()
    owner, _ = User.objects.get_or_create(username="bench-http-owner")
    endpoint, token = services.endpoint_vend(
        actor=SystemActor(via="bench"),
        owner=owner,
        name="bench http db",
        queues=[http_bench.QUEUE],
        rps=0,
    )
    per_run = int(2500 * seconds) + 1000
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    try:
        with live_server(workers=1) as base:
            pid = http_bench._server_pid(base)
            http_bench._load_switchboard(endpoint, per_run)
            http_bench._drive("rest", base, token, 8, 1.0, pid)  # warm: imports, the pool
            for r in range(rounds):
                for clients in (1, 8):
                    kinds = ("in-process", "rest") if r % 2 == 0 else ("rest", "in-process")
                    for kind in kinds:
                        http_bench._load_switchboard(endpoint, per_run)
                        if kind == "rest":
                            result = _over_rest(base, token, pid, clients, seconds)
                        else:
                            result = _in_process(endpoint, clients, seconds)
                        result["load_avg_1m"] = round(os.getloadavg()[0], 2)
                        runs.setdefault((kind, clients), []).append(result)
                        print(f"round {r} {kind:<10} {clients}: {result}", flush=True)
    finally:
        Todo.objects.filter(endpoint=endpoint).delete()
        endpoint.delete()
    print("medians:")
    for (kind, clients), results in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        keys = [k for k in results[0] if k not in ("cycles", "load_avg_1m")]
        medians = {k: statistics.median(r[k] for r in results if k in r) for k in keys}
        print(f"  {kind:<10} {clients}: {medians}")


if __name__ == "__main__":
    raise SystemExit(main())
