"""What an HTTP cycle costs PostgreSQL beside the same verbs called in-process (issue 11).

``python -m bench.http_db [--rounds R] [--duration S] [--trace]`` against its own bench database
(BENCH_DATABASE, as ``python -m bench``): claim_next + complete in this process (threads, each
with its connection) and through REST (``bench.http_bench``'s Node client against one uvicorn),
at 1 and 8, interleaved, each run on ``bench.http_bench``'s reload (fresh todos, the tables
vacuumed) after the benches' history. Per run: cycles/s and the DB CPU per cycle over the
server's processes but other databases' backends (``bench.http_bench._database_cpu``), over
REST the endpoint watch's share apart; with pg_stat_statements loaded (``http_bench._pgss``
says how), the statements per cycle and the claim's shared buffers per call; with ``--trace``,
the round trips, WAL flushes and lock waits of this database's backends per cycle (``TRACED``).
The medians are printed per kind and count.

The statements are the same both ways (the token lookup is cached, ``last_seen_at`` written at
most once a minute) but for the endpoint watch's empty statement over REST (one per request at
1 client, fewer at 8: requests share them), so a difference at the same count beyond the
watch's is what serving over HTTP does to PostgreSQL's cost per statement (its backends idle
between requests, the web process and the client on the same cores), and a difference between
1 and 8 is concurrency's. Not a benchmark: ``python -m bench --only http`` measures.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

CLAIMS = "WITH cand AS%"  # the claim's statements (bare, lean, full)
# What ``--trace`` counts in this database's backends, reported per cycle: an answer flushed
# to a client (sendto: one per round trip, a pipeline's answers go out together), a sleep
# until the client's next message (epoll_wait: only when it was not there already), a WAL
# flush (fdatasync) and a wait for a lock (futex: PostgreSQL's semaphores; at commit mostly
# WALWriteLock, held by another backend's flush). Issue 11, medians of 2 rounds at 8: REST
# 3.14 round trips a cycle (the claim, the completion, the endpoint watch's 1.14) and 2.6
# sleeps; in-process 2.0 and 0.7 (its next statement often waited already).
TRACED = ("sendto", "epoll_wait", "fdatasync", "futex")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.http_db")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per run")
    parser.add_argument(
        "--trace",
        action="store_true",
        help="count round trips, WAL flushes and lock waits of this database's backends per"
        " cycle with strace (which slows the backends: cycles/s and CPU then mean little)",
    )
    args = parser.parse_args(argv)
    if args.trace and shutil.which("strace") is None:
        parser.error("--trace needs strace")
    from bench.__main__ import standalone

    return standalone(lambda: _run(args.rounds, args.duration, args.trace))


def _backends() -> list[int]:
    """The pids of this database's backends but this process's own connection."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        return [pid for (pid,) in cursor.fetchall()]


@contextmanager
def _traced(enabled: bool) -> Iterator[dict[str, int]]:
    """With ``enabled``, ``strace -c`` on this database's backends (those connected now)
    until the block ends; the dict yielded is filled with each of ``TRACED``'s calls."""
    counts: dict[str, int] = {}
    if not enabled:
        yield counts
        return
    with tempfile.NamedTemporaryFile(prefix="http-db-strace-", suffix=".txt") as out:
        command = ["strace", "-c", "-f", "-e", f"trace={','.join(TRACED)}", "-o", out.name]
        for pid in _backends():
            command += ["-p", str(pid)]
        tracer = subprocess.Popen(command, stderr=subprocess.DEVNULL)
        time.sleep(0.5)  # attached
        try:
            yield counts
        finally:
            tracer.send_signal(signal.SIGINT)
            tracer.wait(timeout=30)
        # strace -c's table: "% time  seconds  usecs/call  calls  [errors]  syscall".
        for line in Path(out.name).read_text().splitlines():
            fields = line.split()
            if len(fields) >= 5 and fields[-1] in TRACED and fields[3].isdigit():
                counts[fields[-1]] = int(fields[3])


def _per_cycle(counts: dict[str, int], cycles: int) -> dict[str, float]:
    return {f"{name}_per_cycle": round(n / max(1, cycles), 2) for name, n in counts.items()}


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


def _in_process(endpoint: Any, threads: int, seconds: float, trace: bool) -> dict[str, Any]:
    """The benches' own cycle (``bench.common.claim_loop``) in ``threads`` threads, with the
    database's CPU and, when loaded, pg_stat_statements read over the timed window."""
    from bench import http_bench
    from bench.common import timed_pool

    window: dict[str, Any] = {}
    with ExitStack() as stack:

        def clock(starting: bool) -> None:
            if starting:
                window["counted"] = http_bench.pgss_reset()
                # The threads' connections are open by now.
                window["traced"] = stack.enter_context(_traced(trace))
                window["db0"] = http_bench._database_cpu()
            else:
                window["db1"] = http_bench._database_cpu()
                stack.close()

        run = timed_pool(threads, seconds, "bench.common:claim_loop", endpoint.id, clock=clock)
    if run["ran_dry"]:
        raise RuntimeError(f"the todos ran out in an in-process run: {run}")
    cycles = int(run["cycles"])
    result: dict[str, Any] = {"cycles": cycles, "cycles_per_s": run["cycles_per_s"]}
    if window["db1"]:
        db = sum(t - window["db0"].get(pid, 0.0) for pid, t in window["db1"].items())
        result["db_cpu_ms_per_cycle"] = round(1000 * db / max(1, cycles), 2)
    if window["counted"]:
        result.update(_counted(cycles))
    result.update(_per_cycle(window["traced"], cycles))
    return result


def _over_rest(
    base: str, token: str, pid: int, clients: int, seconds: float, trace: bool
) -> dict[str, Any]:
    from bench import http_bench
    from queues.auth import WATCH_APPLICATION_NAME

    counted = http_bench.pgss_reset()
    with _traced(trace) as traced:
        run = http_bench._drive("rest", base, token, clients, seconds, pid)
    keep = ("cycles", "cycles_per_s", "db_cpu_ms_per_cycle")
    result: dict[str, Any] = {k: run[k] for k in keep if k in run}
    split = run.get("db_cpu_ms_per_cycle_by_process", {})
    result["watch_cpu_ms_per_cycle"] = split.get(f"backend ({WATCH_APPLICATION_NAME})", 0.0)
    if counted:
        result.update(_counted(run["cycles"]))
    result.update(_per_cycle(traced, run["cycles"]))
    return result


def _run(rounds: int, seconds: float, trace: bool) -> None:
    from bench import http_bench
    from bench.common import load_history

    load_history()
    with http_bench.bench_endpoint("bench http db", rps=0) as (endpoint, token):
        _measure(endpoint, token, rounds, seconds, trace)


def _measure(endpoint: Any, token: str, rounds: int, seconds: float, trace: bool) -> None:
    from bench import http_bench
    from switchboard.liveserver import live_server

    per_run = http_bench.todos_for(seconds)  # the http bench's supply rule
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
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
                        result = _over_rest(base, token, pid, clients, seconds, trace)
                    else:
                        result = _in_process(endpoint, clients, seconds, trace)
                    result["load_avg_1m"] = round(os.getloadavg()[0], 2)
                    runs.setdefault((kind, clients), []).append(result)
                    print(f"round {r} {kind:<10} {clients}: {result}", flush=True)
    print("medians:")
    for (kind, clients), results in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        keys = [k for k in results[0] if k not in ("cycles", "load_avg_1m")]
        medians = {k: statistics.median(r[k] for r in results if k in r) for k in keys}
        print(f"  {kind:<10} {clients}: {medians}")


if __name__ == "__main__":
    raise SystemExit(main())
