"""Issue 11's bench: claim_next + complete over HTTP, Switchboard's REST and MCP against a minimal
async server doing the same raw claim SQL (``bench/http_baseline.py``), side by side in one run.

A cycle is two requests: claim_next, then complete of the todo it got. The load client is Node
(``bench/http_client.mjs``: no Python GIL, one keep-alive socket per agent), the same for all
three servers; it reports its own CPU share, so a client that became the bottleneck shows. Beside
the web server's CPU per cycle each run reports PostgreSQL's (``db_cpu_ms_per_cycle``: every
process of the server, when it runs on this machine), so a cycle's cost shows on both sides. Each
server runs as one process (the same number for all three), on the same uvicorn install.
Measurements are interleaved (baseline, REST, MCP, baseline, …) and repeated; the medians are
reported with the machine's load average, because this machine is shared.

Targets (issue 11): at 8 clients REST and MCP each reach ≥ 0.5× the baseline's cycles/s with
p99 ≤ 3× the baseline's p50; at 1 client their p50 ≤ 2× the baseline's. The baseline runs twice:
on this install's uvicorn stack (httptools, uvloop: ``verdict``, ``all_met``) and on the stack
the issue's anchor (``../shared/bench/http-anchor/``) is installed with (h11, asyncio's loop:
``anchor_stack``, ``verdict_vs_anchor_stack``). ``python -m bench.yardstick`` runs the anchor
itself beside them. ``verdict_paired`` (``all_met_paired``) judges the same targets round by
round against the baseline's run of that round, and takes the median of each ratio.

Then the README's production command (gunicorn with uvicorn workers) with 1, 2 and 4 worker
processes, REST at 8 and 16 clients: the curve of cycles/s against processes.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
from django.contrib.auth.models import User
from django.db import DatabaseError, connection, transaction

from bench import http_baseline
from bench.common import host_cpu, steal_share
from queues import services
from queues.access import SystemActor
from queues.auth import endpoint_rate
from queues.models import Endpoint, Todo
from switchboard.liveserver import current_database_url, free_port, live_server, wait_until_up

HERE = Path(__file__).resolve().parent
CLIENT = HERE / "http_client.mjs"
# Pending todos loaded before each run, per second of the run: more than any server here can
# claim (the baseline reached 1,366 cycles/s at 8 clients on 2026-12-02, exactly what 1,200 a
# second loaded for 3 s allowed: it ran dry and its figure was the supply's). ``supplied``
# refuses a run that ran dry.
TODOS_PER_SECOND = 4000


def todos_for(duration_s: float) -> int:
    return int(TODOS_PER_SECOND * duration_s) + 500


def supplied(result: dict[str, Any], what: str) -> dict[str, Any]:
    """``result`` of a load client's run, unless its claims found the queue empty: then the run
    measured the todos loaded, not the server, and the bench stops rather than report it."""
    if result.get("empty"):
        raise RuntimeError(
            f"{what} ran out of todos ({result['empty']} empty claims after {result['cycles']} "
            "cycles): its figure would be the supply's; raise http_bench.TODOS_PER_SECOND"
        )
    return result


QUEUE = "bench-http"
REPEATS = 3
TARGETS = {
    "cycles_ratio_at_8_min": 0.5,
    "p99_at_8_over_baseline_p50_max": 3.0,
    "p50_at_1_over_baseline_p50_max": 2.0,
}


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        raise RuntimeError("the HTTP bench's load client needs Node (apt-get install nodejs)")
    return node


def _load_switchboard(endpoint: Endpoint, n: int) -> None:
    """Fresh pending todos for the endpoint (earlier ones removed), in one statement, then the
    todo and attempt tables vacuumed, as the baseline's table is new for each run. Without it
    each run started on the dead rows and index entries of the runs before it (the todos and
    attempts deleted here, the versions every cycle leaves): the claim read ~60 shared buffers
    a call in the first run and ~180-200 by the fifth (pg_stat_statements), ~40-70 with the
    vacuum, so the DB CPU per cycle moved with the runs' order and autovacuum's timing."""
    Todo.objects.filter(endpoint=endpoint).delete()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO queues_todo (id, endpoint_id, queue, title, kind, payload, state, owner,
                attempt, max_attempts, source, created_at, updated_at)
            SELECT gen_random_uuid(), %s, %s, 'http bench ' || g, '', '{}'::jsonb,
                   'pending', '', 0, 5, 'api', clock_timestamp(), clock_timestamp()
            FROM generate_series(1, %s) g
            """,
            [endpoint.id, QUEUE, n],
        )
        cursor.execute("VACUUM ANALYZE queues_todo")
        cursor.execute("VACUUM queues_attempt")  # never empty here: the history's attempts


def _processes(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _cpu_seconds(procs: list[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def _process_kind(proc: psutil.Process) -> str:
    """What a PostgreSQL process is, from its title: "backend" for a client's, else its role
    ("autovacuum worker", "walwriter", "checkpointer", ...)."""
    try:
        title = " ".join(proc.cmdline())
    except psutil.Error:
        return "unknown"
    if not title.startswith("postgres: "):
        return "postmaster"
    rest = title.removeprefix("postgres: ")
    for role in (
        "autovacuum launcher", "autovacuum worker", "walwriter", "checkpointer",
        "background writer", "logical replication launcher", "stats collector", "io worker",
    ):  # fmt: skip
        if rest.startswith(role):
            return role
    return "backend"


_kinds: dict[int, str] = {}
_system: dict[int, float] = {}


def _wal_lsn() -> int:
    """The server's WAL position in bytes: its change over a run is the WAL the run wrote."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        return int(cursor.fetchone()[0])


def _database_cpu() -> dict[int, float]:
    """CPU seconds so far of each process of the PostgreSQL server (its postmaster and every
    child: this database's backends, WAL writer, checkpointer, I/O workers), when it runs on
    this machine and they can be read; empty otherwise (a remote server).

    Backends connected to another database are left out: on a cluster shared with other
    work (the embedded one every checkout uses) they are that work's, and counted per cycle
    they made a slower run look dearer for PostgreSQL (issue 11: REST at 1 client read ~4.1 ms
    of "backend" CPU per cycle where this database's backends used ~1.2)."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            row = cursor.fetchone()
        postmaster = psutil.Process(row[0]).parent()
        if postmaster is None or "postgres" not in postmaster.name():
            return {}
        procs = [postmaster, *postmaster.children()]
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid, application_name, datname IS NOT NULL"
                " AND datname <> current_database() FROM pg_stat_activity"
            )
            rows = cursor.fetchall()
        names = {pid: name for pid, name, _ in rows}
        elsewhere = {pid for pid, _, other in rows if other}
    except psutil.Error:
        return {}
    seconds: dict[int, float] = {}
    for proc in procs:
        if proc.pid in elsewhere:
            continue
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        seconds[proc.pid] = times.user + times.system
        _system[proc.pid] = times.system
        if proc.pid not in _kinds:
            _kinds[proc.pid] = _process_kind(proc)
            if _kinds[proc.pid] == "backend" and names.get(proc.pid):
                _kinds[proc.pid] = f"backend ({names[proc.pid]})"
    return seconds


def _connections_per_worker(server_pid: int, port: int) -> list[int]:
    """How many client connections each of the server's worker processes holds (gunicorn's
    workers are the master's children; a lone uvicorn is its own worker), busiest first."""
    root = psutil.Process(server_pid)
    workers = root.children() or [root]
    counts = []
    for worker in workers:
        try:
            conns = worker.net_connections(kind="tcp")
        except psutil.Error:
            continue
        counts.append(
            sum(c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port for c in conns)
        )
    return sorted(counts, reverse=True)


def _drive(
    kind: str,
    url: str,
    token: str,
    clients: int,
    seconds: float,
    server_pid: int,
    *,
    sockets: int = 1,
) -> dict[str, Any]:
    """One run of the Node client; adds the server processes' CPU share over the run, and the
    database server's CPU per cycle (the same PostgreSQL serves all three servers). With
    ``sockets`` > 1 each agent spreads its cycles over that many keep-alive sockets, and the
    connections each worker process holds at mid-run are reported."""
    procs = _processes(server_pid)
    _pgss("reset")
    wal0 = _wal_lsn()
    cpu0 = _cpu_seconds(procs)
    db0 = _database_cpu()
    sys0 = dict(_system)
    host0 = host_cpu()
    started = time.perf_counter()
    command = [_node(), str(CLIENT), kind, url, token, str(clients), f"{seconds:g}", str(sockets)]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as client:
        spread = None
        if sockets > 1:
            time.sleep(seconds / 2)
            port = int(url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
            spread = _connections_per_worker(server_pid, port)
        stdout, stderr = client.communicate(timeout=seconds + 60)
    elapsed = time.perf_counter() - started
    if client.returncode != 0:
        raise RuntimeError(f"the load client failed against {kind}: {stderr[-2000:]}")
    result: dict[str, Any] = supplied(json.loads(stdout.strip().splitlines()[-1]), kind)
    if spread is not None:
        result["connections_per_worker"] = spread
    server_cpu = _cpu_seconds(procs) - cpu0
    db1 = _database_cpu()
    result["server_cpu_share"] = round(server_cpu / elapsed, 3)
    # CPU per cycle moves less with the machine's other load than cycles/s does.
    result["server_cpu_ms_per_cycle"] = round(1000 * server_cpu / max(1, result["cycles"]), 2)
    if db1:  # backends started during the run count from zero
        db_cpu = sum(t - db0.get(pid, 0.0) for pid, t in db1.items())
        result["db_cpu_ms_per_cycle"] = round(1000 * db_cpu / max(1, result["cycles"]), 2)
        # Where it went: client backends by application_name (the endpoint watch apart; those
        # started during the run apart, their first statements fill catalog caches and plan)
        # and PostgreSQL's own processes; then its kernel share and the WAL written.
        split: dict[str, float] = {}
        for pid, t in db1.items():
            kind = _kinds.get(pid, "unknown")
            if kind.startswith("backend") and pid not in db0:
                kind = f"{kind} started during the run"
            split[kind] = split.get(kind, 0.0) + t - db0.get(pid, 0.0)
        result["db_cpu_ms_per_cycle_by_process"] = {
            k: round(1000 * v / max(1, result["cycles"]), 3) for k, v in sorted(split.items()) if v
        }
        result["db_system_cpu_ms_per_cycle"] = round(
            1000 * sum(_system[p] - sys0.get(p, 0.0) for p in db1) / max(1, result["cycles"]), 3
        )
        result["wal_bytes_per_cycle"] = round((_wal_lsn() - wal0) / max(1, result["cycles"]))
        backends = [p for p in db1 if _kinds.get(p, "").startswith("backend")]
        result["db_backends_started"] = sum(1 for p in backends if p not in db0)
        # Backends that used over a millisecond of CPU: the connections the run kept busy.
        result["db_backends_busy"] = sum(1 for p in backends if db1[p] - db0.get(p, 0.0) > 1e-3)
    result["load_avg_1m"] = round(os.getloadavg()[0], 2)
    result["cpu_steal_share"] = steal_share(host0, host_cpu())
    _pgss(f"{command[2]} {clients}", result["cycles"])
    return result


def _pgss(what: str, cycles: int = 0) -> None:
    """With BENCH_PGSS=1, each run's statements to stderr: calls, plans, times and shared
    buffers (hit, read) per cycle.
    Needs pg_stat_statements loaded: in the embedded server's .data/pg/postgresql.auto.conf,
    ``shared_preload_libraries = 'pg_stat_statements'`` and ``pg_stat_statements.track = all``
    (nested statements too: the foreign-key checks)."""
    if not os.environ.get("BENCH_PGSS"):
        return
    if what == "reset":
        pgss_reset()
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT calls, plans, total_exec_time, total_plan_time, shared_blks_hit"
            " + shared_blks_read, left(regexp_replace(query, '\\s+', ' ', 'g'), 100)"
            " FROM pg_stat_statements ORDER BY total_exec_time + total_plan_time DESC LIMIT 25"
        )
        rows = cursor.fetchall()
    print(f"-- {what}: {cycles} cycles", file=sys.stderr)
    for calls, plans, ex, pl, blocks, q in rows:
        print(
            f"{calls / max(1, cycles):6.2f}/cy plans {plans / max(1, cycles):5.2f}/cy"
            f" exec {1000 * ex / max(1, cycles):6.1f}us/cy plan {1000 * pl / max(1, cycles):6.1f}"
            f"us/cy buffers {blocks / max(1, cycles):6.1f}/cy  {q}",
            file=sys.stderr,
        )


def pgss_reset() -> bool:
    """pg_stat_statements created if need be and reset; False when the server has not loaded
    it (``_pgss`` says how to load it)."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            cursor.execute("SELECT pg_stat_statements_reset()")
    except DatabaseError:
        return False
    return True


# The anchor (``../shared/bench/http-anchor/``) is installed by its README as ``pip install
# starlette uvicorn …``: uvicorn without its extras, so it parses HTTP with h11 (pure Python) on
# asyncio's own event loop. This repository's uvicorn has httptools and uvloop, which uvicorn picks
# when present: the baseline on them is a stricter yardstick than the anchor. Both are measured:
# ``baseline`` (this install's stack) and ``anchor_stack`` (the same app on the anchor's stack).
ANCHOR_STACK = ("--http", "h11", "--loop", "asyncio")


@contextmanager
def _baseline_server(dsn: str, stack: tuple[str, ...] = ()) -> Iterator[tuple[str, int]]:
    uvicorn = [sys.executable, "-m", "uvicorn", "bench.http_baseline:app", *stack]
    with uvicorn_server(uvicorn, HERE.parent, {"BASELINE_DSN": dsn}) as server:
        yield server


@contextmanager
def uvicorn_server(uvicorn: list[str], cwd: Path, env: dict[str, str]) -> Iterator[tuple[str, int]]:
    """A bare claim/complete server: ``uvicorn`` (the command up to its app and options) on a
    free local port, run in ``cwd`` with ``env`` added; yields its URL and pid once it answers."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [
        *uvicorn,
        "--host", "127.0.0.1", "--port", str(port), "--no-access-log", "--log-level", "warning",
    ]  # fmt: skip
    with tempfile.NamedTemporaryFile(prefix="bench-server-", suffix=".log") as log:
        process = subprocess.Popen(
            command, cwd=cwd, env={**os.environ, **env}, stdout=log, stderr=log
        )
        try:
            wait_until_up(process, f"{base}/claim_next", Path(log.name))
            yield base, process.pid
        finally:
            process.terminate()
            process.wait(timeout=15)


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median cycles/s, with every run's cycles/s, p50, p99 and steal share
    beside it (in the order they ran: a slow spell of the host shows in one round). The
    verdict reads the median run's own figures; the other runs' latencies show how far a
    verdict on p99, one run's tail, moves from run to run."""
    ordered = sorted(runs, key=lambda r: r["cycles_per_s"])
    median = dict(ordered[len(ordered) // 2])
    for key in ("cycles_per_s", "p50_ms", "p99_ms"):
        median[f"runs_{key}"] = [r.get(key) for r in runs]
    median["runs_cpu_steal_share"] = [r.get("cpu_steal_share") for r in runs]
    return median


# What ``ratios`` gives, in its order, as the verdicts name them.
RATIO_NAMES = ("cycles_ratio_at_8", "p99_at_8_over_baseline_p50", "p50_at_1_over_baseline_p50")


def ratios(
    one: dict[str, Any], eight: dict[str, Any], yard_one: dict[str, Any], yard_eight: dict[str, Any]
) -> tuple[float, float, float]:
    """Issue 11's three ratios of a protocol's runs (at 1 and 8 clients) against a yardstick's:
    cycles/s at 8, p99 at 8 ÷ the yardstick's p50 at 8, p50 at 1 ÷ the yardstick's p50 at 1."""
    return (
        eight["cycles_per_s"] / yard_eight["cycles_per_s"],
        eight["p99_ms"] / yard_eight["p50_ms"],
        one["p50_ms"] / yard_one["p50_ms"],
    )


def _met(cycles_ratio: float, p99_ratio: float, p50_ratio: float) -> dict[str, bool]:
    """Which of the targets three ratios meet: cycles/s at 8 ÷ the yardstick's, p99 at 8 ÷ its
    p50, p50 at 1 ÷ its p50."""
    return {
        "cycles_ratio_at_8": cycles_ratio >= TARGETS["cycles_ratio_at_8_min"],
        "p99_at_8": p99_ratio <= TARGETS["p99_at_8_over_baseline_p50_max"],
        "p50_at_1": p50_ratio <= TARGETS["p50_at_1_over_baseline_p50_max"],
    }


def _verdict(
    table: dict[str, dict[int, dict[str, Any]]], yardstick: str = "baseline"
) -> dict[str, Any]:
    """Each protocol's ratios against ``yardstick`` and whether each target is met.

    Beside them, what tells a slow server from a wide tail. At 8 closed-loop clients a cycle's
    mean latency is 8 ÷ cycles/s, so a server at half the yardstick's rate has about twice its
    p50 whatever its tail. ``own_p99_over_p50_at_8`` is the run's tail shape (the yardstick's
    is given too); ``cycles_ratio_for_p99_at_8`` is the cycles ratio at which the p99 target
    would be met with that same shape (p99 scales as 1 ÷ cycles/s): the ratio times p99's
    share of its bound. Above 0.5, the p99 target is the binding one."""
    base1, base8 = table[yardstick][1], table[yardstick][8]
    verdict: dict[str, Any] = {}
    for kind in ("rest", "mcp"):
        one, eight = table[kind][1], table[kind][8]
        ratio, p99_ratio, p50_ratio = ratios(one, eight, base1, base8)
        p99_bound = TARGETS["p99_at_8_over_baseline_p50_max"]
        verdict[kind] = {
            "cycles_ratio_at_8": round(ratio, 3),
            "p99_at_8_over_baseline_p50": round(p99_ratio, 2),
            "p50_at_1_over_baseline_p50": round(p50_ratio, 2),
            "own_p99_over_p50_at_8": round(eight["p99_ms"] / eight["p50_ms"], 2),
            "yardstick_p99_over_p50_at_8": round(base8["p99_ms"] / base8["p50_ms"], 2),
            "cycles_ratio_for_p99_at_8": round(ratio * p99_ratio / p99_bound, 3),
            "met": _met(ratio, p99_ratio, p50_ratio),
        }
        verdict[kind]["all_met"] = all(verdict[kind]["met"].values())
    return verdict


def _paired_verdict(
    runs: dict[str, dict[int, list[dict[str, Any]]]], yardstick: str = "baseline"
) -> dict[str, Any]:
    """The targets' ratios round by round, each protocol's run against the yardstick's run of
    the same round (interleaved, seconds apart), and their medians over the rounds. ``_verdict``
    divides medians taken apart: a slow spell of the host that falls in the yardstick's median
    run and not in a protocol's (or the other way round) moves its ratios, where a ratio within
    one round cancels what the round's runs shared. Reported beside ``verdict``, the verdict of
    record, not instead of it."""
    base1, base8 = runs[yardstick][1], runs[yardstick][8]
    verdict: dict[str, Any] = {}
    for kind in ("rest", "mcp"):
        per_round = [
            ratios(*run) for run in zip(runs[kind][1], runs[kind][8], base1, base8, strict=True)
        ]
        rounds = {name: [r[i] for r in per_round] for i, name in enumerate(RATIO_NAMES)}
        median = {name: statistics.median(values) for name, values in rounds.items()}
        cycles, p99, p50 = (median[name] for name in RATIO_NAMES)  # ratios()' order, by name
        met = _met(cycles, p99, p50)
        verdict[kind] = {
            **{name: round(value, 3) for name, value in median.items()},
            "rounds": {name: [round(v, 3) for v in values] for name, values in rounds.items()},
            "met": met,
            "all_met": all(met.values()),
        }
    return verdict


# A server as the runs drive it: the bench client's kind for it, its URL, the bearer token,
# the pid whose CPU is its own, and what loads ``n`` fresh pending todos for it.
Target = tuple[str, str, str, int, Callable[[int], None]]


def servers(
    dsn: str,
    baselines: dict[str, tuple[str, int]],
    base: str,
    endpoint: Endpoint,
    token: str,
) -> dict[str, Target]:
    """Each baseline server given (name → its URL and pid, on the table ``http_baseline``
    loads in ``dsn``), then Switchboard's REST and MCP on the server at ``base``."""
    server_pid = _server_pid(base)
    targets: dict[str, Target] = {
        name: ("baseline", url, http_baseline.TOKEN, pid, lambda n: http_baseline.load(dsn, n))
        for name, (url, pid) in baselines.items()
    }
    targets["rest"] = ("rest", base, token, server_pid, lambda n: _load_switchboard(endpoint, n))
    targets["mcp"] = (
        "mcp", f"{base}/mcp/{endpoint.slug}", token, server_pid,
        lambda n: _load_switchboard(endpoint, n),
    )  # fmt: skip
    return targets


def side_by_side(endpoint: Endpoint, token: str, duration_s: float, repeats: int) -> dict[str, Any]:
    """The baseline (on this install's stack and on the anchor's), REST and MCP, one process
    each, at 1 and 8 clients, interleaved and repeated."""
    dsn = current_database_url()
    per_run = todos_for(duration_s)
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {
        k: {1: [], 8: []} for k in ("baseline", "anchor_stack", "rest", "mcp")
    }
    with (
        _baseline_server(dsn) as baseline,
        _baseline_server(dsn, ANCHOR_STACK) as anchor,
        live_server(workers=1) as base,
    ):
        targets = servers(
            dsn, {"baseline": baseline, "anchor_stack": anchor}, base, endpoint, token
        )
        for kind, url, secret, pid, load in targets.values():  # warm-up: imports, pools
            load(per_run)
            _drive(kind, url, secret, 8, min(1.0, duration_s), pid)
        for _ in range(repeats):
            for clients in (1, 8):
                for server, (kind, url, secret, pid, load) in targets.items():
                    load(per_run)
                    result = _drive(kind, url, secret, clients, duration_s, pid)
                    result["kind"] = server
                    runs[server][clients].append(result)
    table = {kind: {c: _median_run(r) for c, r in by.items()} for kind, by in runs.items()}
    return {
        "table": table,
        "verdict": _verdict(table),
        "verdict_vs_anchor_stack": _verdict(table, "anchor_stack"),
        "verdict_paired": _paired_verdict(runs),
    }


def _server_pid(base: str) -> int:
    """The pid of the process listening on ``base``'s port (the server's parent for gunicorn)."""
    port = int(base.rsplit(":", 1)[1])
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            proc = psutil.Process(conn.pid)
            parent = proc.parent()
            if parent is not None and "gunicorn" in " ".join(parent.cmdline()):
                return parent.pid
            return conn.pid
    raise RuntimeError(f"nothing listens on {base}")


# Keep-alive sockets per agent in the production curve: enough that the connections spread over
# the worker processes (each reports how many it held, ``connections_per_worker``).
CURVE_SOCKETS = 4


def process_curve(
    endpoint: Endpoint, token: str, duration_s: float, workers: tuple[int, ...] = (1, 2, 4)
) -> list[dict[str, Any]]:
    """The README's production command (gunicorn, uvicorn workers) with 1, 2 and 4 processes.

    Each agent spreads its cycles over ``CURVE_SOCKETS`` keep-alive sockets: with one socket
    each, the 8 agents' connections landed unevenly on the workers (whichever process wakes
    first accepts several), so the curve measured one busy worker and stayed flat."""
    per_run = todos_for(duration_s)
    curve = []
    for n in workers:
        with live_server(workers=n, server="gunicorn") as base:
            pid = _server_pid(base)
            _load_switchboard(endpoint, per_run)
            _drive("rest", base, token, 8, min(1.0, duration_s), pid, sockets=CURVE_SOCKETS)
            point: dict[str, Any] = {"workers": n}
            for clients in (8, 16):
                _load_switchboard(endpoint, per_run)
                point[f"rest_{clients}_clients"] = _drive(
                    "rest", base, token, clients, duration_s, pid, sockets=CURVE_SOCKETS
                )
            curve.append(point)
    return curve


# The endpoint's request rate: finite, as every endpoint's is unless made unlimited, so every
# REST request and MCP tool call pays the rate limiter, and far above what the bench reaches
# (the largest an endpoint may have; its burst is the one the code derives, twice the rate).
ENDPOINT_RPS = 100000


@contextmanager
def bench_endpoint(name: str, rps: int = ENDPOINT_RPS) -> Iterator[tuple[Endpoint, str]]:
    """An endpoint granted the bench's queue, at ``rps`` requests per second, and its token;
    deleted afterwards with its todos (and its owner, when it has no other endpoint)."""
    owner, _ = User.objects.get_or_create(username="bench-http-owner")
    endpoint, token = services.endpoint_vend(
        actor=SystemActor(via="bench"), owner=owner, name=name, queues=[QUEUE], rps=rps
    )
    try:
        yield endpoint, token
    finally:
        Todo.objects.filter(endpoint=endpoint).delete()
        endpoint.delete()
        if not owner.endpoints.exists():
            owner.delete()


def run(duration_s: float = 5.0, *, repeats: int = REPEATS) -> dict[str, Any]:
    with bench_endpoint("bench http") as (endpoint, token):
        return _run(endpoint, token, duration_s, repeats)


def _run(endpoint: Endpoint, token: str, duration_s: float, repeats: int) -> dict[str, Any]:
    rps, burst = endpoint_rate(endpoint)
    results: dict[str, Any] = {
        "duration_s": duration_s,
        "repeats": repeats,
        "cpus": os.cpu_count(),
        "load_avg_before": [round(x, 2) for x in os.getloadavg()],
        "targets": TARGETS,
        "endpoint_rate": {"rps": rps, "burst": burst},
        "client": "bench/http_client.mjs (Node, node:http keep-alive, closed loop)",
        "servers": "one process each: uvicorn bench.http_baseline:app (baseline) | the same "
        "with --http h11 --loop asyncio (anchor_stack: the issue's anchor's stack, as its "
        "README installs uvicorn) | uvicorn switchboard.asgi:application (switchboard.liveserver)",
    }
    results.update(side_by_side(endpoint, token, duration_s, repeats))
    results["production_curve"] = process_curve(endpoint, token, duration_s)
    results["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    results["all_met"] = all(v["all_met"] for v in results["verdict"].values())
    results["all_met_vs_anchor_stack"] = all(
        v["all_met"] for v in results["verdict_vs_anchor_stack"].values()
    )
    results["all_met_paired"] = all(v["all_met"] for v in results["verdict_paired"].values())
    return results


def summary(results: dict[str, Any]) -> str:
    """The table as text, for the console and the closing note."""
    lines = [
        "server       clients  cycles/s  p50 ms  p99 ms  server CPU  ms/cycle  db ms/cycle  client CPU"
    ]
    for kind, by in results["table"].items():
        for clients, r in by.items():
            lines.append(
                f"{kind:<12} {clients:>7} {r['cycles_per_s']:>9} {r['p50_ms']:>7} "
                f"{r['p99_ms']:>7} {r['server_cpu_share']:>11} "
                f"{r['server_cpu_ms_per_cycle']:>9} {r.get('db_cpu_ms_per_cycle', '-'):>12} "
                f"{r['client_cpu_share']:>11}"
            )
    return "\n".join(lines)
