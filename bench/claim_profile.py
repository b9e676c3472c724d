"""Where one bare claim_next + complete cycle spends its time (issue 12): statements per cycle,
the plans of the claim and completion statements, and a Python profile of a single-thread loop.

``python -m bench.claim_profile [--cycles N] [--explain] [--profile] [--sql]`` against its own
bench database (BENCH_DATABASE, as ``python -m bench``). Not a benchmark: the rates it prints
come from one thread and cProfile's overhead; ``python -m bench --only core`` measures.

``--named``: every todo names a pool and two tags, as the limits bench's named phase does
(enforce, room never to refuse), so a cycle is a named claim (verdicts, grant row) and a named
completion (reopen reads, end row). ``--history``: the benches' 20,000 finished todos first
(``bench.common.load_history``), as ``python -m bench`` loads them.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.claim_profile")
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--explain", action="store_true", help="EXPLAIN (ANALYZE, BUFFERS) both")
    parser.add_argument("--profile", action="store_true", help="cProfile the loop")
    parser.add_argument("--sql", action="store_true", help="print the two statements")
    parser.add_argument(
        "--auto-explain", action="store_true", help="the plans of one warm cycle, as run"
    )
    parser.add_argument(
        "--raw", action="store_true", help="the raw same-table loop instead, for comparison"
    )
    parser.add_argument("--nogates", action="store_true", help="the statements without gates")
    parser.add_argument(
        "--budgeted", action="store_true", help="a budget on every queue (never reached)"
    )
    parser.add_argument(
        "--queues", type=int, default=1, help="the endpoint's queues, todos dealt round-robin"
    )
    parser.add_argument(
        "--named", action="store_true", help="todos naming a pool and two tags (limits bench)"
    )
    parser.add_argument(
        "--history", action="store_true", help="the benches' finished todos first (20,000)"
    )
    parser.add_argument(
        "--wal", action="store_true", help="WAL records and HOT updates per cycle (pg_walinspect)"
    )
    parser.add_argument(
        "--functions",
        action="store_true",
        help="time per cycle in each SQL function (track_functions = all; adds its own overhead)",
    )
    parser.add_argument(
        "--swap",
        nargs=2,
        metavar=("A_SQL", "B_SQL"),
        help="A/B in one run: blocks of --cycles cycles alternate, each after its SQL file ran"
        " (e.g. two versions of the SQL functions); CPU per cycle of each, per-pair ratios",
    )
    parser.add_argument("--blocks", type=int, default=6, help="--swap: pairs of blocks")
    parser.add_argument(
        "--perf",
        metavar="DIR",
        help="--swap: perf record (call graphs) of the backend in each block, into DIR",
    )
    parser.add_argument("--exec", action="append", default=[], help="SQL to run first")
    parser.add_argument("--set", action="append", default=[], help="a session setting: name=value")
    parser.add_argument(
        "--pause-ms",
        type=float,
        default=0.0,
        help="idle this long after each statement, as between HTTP requests (backend wakeups)",
    )
    args = parser.parse_args(argv)
    from bench.__main__ import standalone

    return standalone(lambda: _run(args))


def _run(args: argparse.Namespace) -> None:
    from django.contrib.auth.models import User
    from django.db import connection

    from bench.core_bench import _reload
    from queues import services, sql
    from queues.access import AgentActor, SystemActor
    from queues.services import Claimed

    owner, _ = User.objects.get_or_create(username="bench-owner")
    queues = ["bench"] if args.queues == 1 else [f"bench{i}" for i in range(args.queues)]
    endpoint, _token = services.endpoint_vend(
        actor=SystemActor(via="bench"), owner=owner, name="bench profile", queues=queues, rps=0
    )
    actor = AgentActor(endpoint, via="api")
    if args.history:
        from bench.common import load_history

        load_history()
    names = _named() if args.named else {}
    todos = args.cycles * (2 if args.functions else 1) + 2000
    if args.swap:
        todos = (args.cycles + 50) * 2 * args.blocks + 2000
    if args.queues == 1 and not names:
        _reload(endpoint, todos)
    else:
        from bench.admission_bench import _make_todos, _vacuum

        _make_todos(endpoint, todos, queues, **names)
        if args.history:
            _vacuum()  # as the limits bench before each phase (never on an empty attempt table)
    if args.budgeted:
        _budget(owner, endpoint, queues)
    with connection.cursor() as cursor:
        for statement in args.exec:
            cursor.execute(statement)
        for setting in args.set:
            name, value = setting.split("=", 1)
            cursor.execute("SELECT set_config(%s, %s, false)", [name, value])

    def cycle() -> None:
        claimed = services.claim_next(actor=actor, claimant="w0")
        assert isinstance(claimed, Claimed)
        if pause:
            time.sleep(pause)
        services.complete(actor=actor, todo_id=claimed.todo.id)
        if pause:
            time.sleep(pause)

    pause = 0.0  # the warm-up and counting runs do not idle

    if args.nogates:
        from queues.sql import _COMPLETE, _claim_next_sql, _ending_sql

        claim_sql = _claim_next_sql((), False, False, False)
        complete_sql = _ending_sql((), *_COMPLETE)

        def cycle() -> None:
            with sql.hot_cursor() as cursor:
                cursor.execute(
                    claim_sql,
                    _claim_params(endpoint),
                )
                todo_id = cursor.fetchone()[0]
                cursor.execute(complete_sql, _complete_params(endpoint, todo_id))
                cursor.fetchone()

    if args.raw:
        from bench.core_bench import SAME_TABLE_CLAIM, SAME_TABLE_COMPLETE

        def cycle() -> None:
            with sql.hot_cursor() as cursor:
                cursor.execute(SAME_TABLE_CLAIM, ["w0", endpoint.id])
                (todo_id,) = cursor.fetchone()
                cursor.execute(SAME_TABLE_COMPLETE, [todo_id])

    for _ in range(50):  # warm: prepared statements, caches
        cycle()
    seen: Counter[str] = Counter()

    def count(execute: Any, statement: str, params: Any, many: bool, context: Any) -> Any:
        seen[" ".join(statement.split())[:90]] += 1
        return execute(statement, params, many, context)

    with connection.execute_wrapper(count):
        for _ in range(100):
            cycle()
    print("statements per cycle (100 cycles):")
    for text, n in seen.most_common():
        print(f"  {n / 100:5.2f}  {text}")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans, left(regexp_replace(statement, '\\s+', ' ', 'g'), 60)"
            " FROM pg_prepared_statements"
        )
        print("prepared statements (generic plans, custom plans):")
        for generic, custom, text in cursor.fetchall():
            print(f"  {generic:5} {custom:5}  {text}")
    if args.auto_explain:
        _auto_explain(cycle)
    if args.sql:
        print(sql.claim_next_sql(fast=True))
        print(sql.complete_sql())
    if args.explain:
        _explain(endpoint)
    if args.wal:
        _wal(cycle)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (backend,) = cursor.fetchone()
    pause = args.pause_ms / 1000
    if args.functions:
        _functions(cycle, args.cycles)
    if args.swap:
        _swap(cycle, args.swap, args.cycles, args.blocks, backend, args.perf)
        return
    server0, client0 = _cpu_of(backend), time.process_time()
    t0 = time.perf_counter()
    # CPU time, not wall time: the client CPU per cycle is what the profile apportions.
    profiler = cProfile.Profile(time.process_time) if args.profile else None
    if profiler:
        profiler.enable()
    for _ in range(args.cycles):
        cycle()
    if profiler:
        profiler.disable()
    elapsed = time.perf_counter() - t0
    server, client = _cpu_of(backend) - server0, time.process_time() - client0
    print(
        f"CPU per cycle: client {client / args.cycles * 1e6:.0f} us, "
        f"server backend {server / args.cycles * 1e6:.0f} us"
    )
    print(f"{args.cycles} cycles in {elapsed:.2f}s: {args.cycles / elapsed:.0f}/s (one thread)")
    if profiler:
        stats = pstats.Stats(profiler, stream=sys.stdout)
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(40)


def _named() -> dict[str, Any]:
    """The limits bench's named limits: a pool and two tags, enforce, never full."""
    from django.contrib.auth.models import User

    from admission.limits import services as limit_services
    from bench.limits_bench import ROOM
    from queues.access import HumanActor

    user, _ = User.objects.get_or_create(
        username="bench-limits-profile", defaults={"is_superuser": True, "is_staff": True}
    )
    actor = HumanActor(user, via="cli")
    pool, tags = "bench-pool", ["bench-a", "bench-b"]
    limit_services.limit_set(actor=actor, kind="pool", name=pool, slots=ROOM)
    for tag in tags:
        limit_services.limit_set(actor=actor, kind="tag", name=tag, limit=ROOM)
    return {"pool": pool, "tags": tags}


def _budget(owner: Any, endpoint: Any, queues: list[str]) -> None:
    """The admission bench's budget on each queue: a window limit never reached.

    No VACUUM ANALYZE here (the plain profile makes none either): analysing queues_attempt while
    it is empty makes the completion's generic plan seq-scan and hash-join the attempt table,
    a cost that grows with every cycle and that was ~0.3-0.9 ms of the budgeted profile's extra
    backend time, not the budget's. A production attempt table is large and analysed.
    """
    from django.conf import settings

    from admission import services as admission_services
    from queues.access import HumanActor

    settings.POLICY_WRITE_RATE_LIMIT = (0, 0)
    for queue in queues:
        admission_services.policy_set(
            actor=HumanActor(owner, via="cli"),
            endpoint=endpoint,
            queue=queue,
            max_in_flight=None,
            max_claims_per_window=1_000_000,
            window={"period": "day", "tz": "UTC", "start": "00:00"},
            posture="enforce",
        )


def _wal(cycle: Any, n: int = 200) -> None:
    """What ``n`` cycles write: WAL records and bytes per cycle by resource manager, record type
    and relation (pg_walinspect, over the whole server: run it on a server of its own), and the
    updates of each todo table that were HOT."""
    from django.db import connection

    tables = ("queues_todo", "queues_attempt")
    with connection.cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")

        def updates() -> dict[str, tuple[int, int]]:
            cursor.execute("SELECT pg_stat_force_next_flush()")
            cursor.execute(
                "SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
                " WHERE relname = ANY(%s)",
                [list(tables)],
            )
            return {name: (upd, hot) for name, upd, hot in cursor.fetchall()}

        cursor.execute("SELECT pg_stat_clear_snapshot()")
        before = updates()
        cursor.execute("SELECT pg_current_wal_insert_lsn()")
        (start,) = cursor.fetchone()
        for _ in range(n):
            cycle()
        cursor.execute("SELECT pg_current_wal_insert_lsn()")
        (end,) = cursor.fetchone()
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        after = updates()
        cursor.execute(
            """
            SELECT r.resource_manager, r.record_type,
                   coalesce(c.relname, b.relfilenode::text, '-'),
                   count(DISTINCT r.start_lsn), sum(DISTINCT r.record_length::bigint)
            FROM pg_get_wal_records_info(%s, %s) r
            LEFT JOIN LATERAL (SELECT * FROM pg_get_wal_block_info(r.start_lsn, r.end_lsn)
                               LIMIT 1) b ON true
            LEFT JOIN pg_class c ON c.relfilenode = b.relfilenode
            GROUP BY 1, 2, 3 ORDER BY 4 DESC, 5 DESC
            """,
            [start, end],
        )
        rows = cursor.fetchall()
        cursor.execute("SELECT %s::pg_lsn - %s::pg_lsn", [end, start])
        (total,) = cursor.fetchone()
    print(
        f"WAL per cycle ({n} cycles): {sum(r[3] for r in rows) / n:.2f} records, "
        f"{float(total) / n:.0f} bytes"
    )
    for rmgr, kind, rel, count, _ in rows:
        print(f"  {count / n:6.2f}  {rmgr:12} {kind:24} {rel}")
    for name in tables:
        upd = after[name][0] - before[name][0]
        hot = after[name][1] - before[name][1]
        print(f"{name}: {upd / n:.2f} updates per cycle, {hot / n:.2f} HOT")


def _swap(
    cycle: Any, files: list[str], n: int, blocks: int, backend: int, perf_dir: str | None
) -> None:
    """Alternate A and B ``blocks`` times: run the side's SQL file, warm 50 cycles (its plans),
    then ``n`` cycles measured. Same process, database and backend for both, interleaved, so a
    machine shared with other work loads both sides alike; per-pair ratios B / A."""
    import signal
    import statistics
    import subprocess

    from django.db import connection

    texts = [Path(f).read_text() for f in files]
    cpu: dict[int, list[tuple[float, float]]] = {0: [], 1: []}
    for block in range(blocks):
        for side in (0, 1):
            with connection.cursor() as cursor:
                cursor.execute(texts[side])
            for _ in range(50):
                cycle()
            perf = None
            if perf_dir:
                out = Path(perf_dir) / f"{'ab'[side]}{block}.data"
                perf = subprocess.Popen(
                    ["perf", "record", "-q", "-g", "-F", "499", "-o", str(out), "-p", str(backend)],
                    stderr=subprocess.DEVNULL,
                )
                time.sleep(0.5)  # attached
            server0, client0 = _cpu_of(backend), time.process_time()
            for _ in range(n):
                cycle()
            server = (_cpu_of(backend) - server0) / n * 1e6
            client = (time.process_time() - client0) / n * 1e6
            if perf is not None:
                perf.send_signal(signal.SIGINT)
                perf.wait(timeout=30)
            cpu[side].append((server, client))
            print(
                f"  {'AB'[side]} {Path(files[side]).name}: server {server:.0f} us, "
                f"client {client:.0f} us per cycle, load {os.getloadavg()[0]:.2f}"
            )
    for what, i in (("server backend CPU (us)", 0), ("client CPU (us)", 1)):
        a = [x[i] for x in cpu[0]]
        b = [x[i] for x in cpu[1]]
        ratios = sorted(y / x for x, y in zip(a, b, strict=True))
        print(
            f"{what} per cycle: A median {statistics.median(a):.0f} "
            f"({min(a):.0f}-{max(a):.0f}), B median {statistics.median(b):.0f} "
            f"({min(b):.0f}-{max(b):.0f}); B/A per pair median {statistics.median(ratios):.3f} "
            f"({ratios[0]:.3f}-{ratios[-1]:.3f})"
        )


def _functions(cycle: Any, n: int) -> None:
    """Calls, total and self milliseconds per cycle of each SQL function ``n`` cycles call
    (pg_stat_user_functions, this backend's counts; the timing itself costs some CPU)."""
    from django.db import connection

    def read(cursor: Any) -> dict[str, tuple[float, float, float]]:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT funcname, calls, total_time, self_time FROM pg_stat_user_functions")
        return {name: (calls, total, own) for name, calls, total, own in cursor.fetchall()}

    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('track_functions', 'all', false)")
        before = read(cursor)
        for _ in range(n):
            cycle()
        after = read(cursor)
        cursor.execute("SELECT set_config('track_functions', 'none', false)")
    print(f"SQL functions per cycle ({n} cycles): calls, total us, self us")
    rows: list[tuple[str, float, float, float]] = []
    for name, (calls, total, own) in after.items():
        c0, t0, s0 = before.get(name, (0, 0.0, 0.0))
        if calls > c0:
            rows.append((name, (calls - c0) / n, (total - t0) * 1000 / n, (own - s0) * 1000 / n))
    for name, calls, total, own in sorted(rows, key=lambda r: -r[3]):
        print(f"  {calls:5.2f} {total:8.1f} {own:8.1f}  {name}")


def _complete_params(endpoint: Any, todo_id: int) -> dict[str, Any]:
    """The completion statement's parameters: the endpoint completes its own claim, no fence;
    the grant parameters as ``queues.services.todos`` binds them (an end row may read them)."""
    from queues import sql

    return sql.transition_params(
        {"result": None, "summary": ""},
        todo_id=todo_id,
        endpoint_ids=[endpoint.id],
        operator=False,
        fence=None,
        attempt=None,
        ends=True,
    )


def _claim_params(endpoint: Any) -> dict[str, Any]:
    """The bare claim statement's parameters for one claimer of the bench queue."""
    from queues import sql

    return {
        "endpoint": endpoint.id,
        "queues": ["bench"],
        "excluded": [],
        "passed": [],
        "claimant": "w0",
        "via": "api",
        "ttl": 300,
        "fence_hash": None,
        # The grant row and a superseded grant's end row read these; with no actor, NULLs.
        **sql.grant_params(None, "w0"),
    }


def _cpu_of(pid: int) -> float:
    """User + system CPU seconds of a process on this machine (the server backend)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _auto_explain(cycle: Any) -> None:
    """The plans the warm (prepared, generic) statements actually ran, with timings."""
    from django.db import connection

    notices: list[str] = []
    with connection.cursor() as cursor:
        cursor.execute("LOAD 'auto_explain'")
        for name, value in [
            ("auto_explain.log_min_duration", "0"),
            ("auto_explain.log_analyze", "on"),
            ("auto_explain.log_buffers", "on"),
            ("auto_explain.log_nested_statements", "on"),
            ("auto_explain.log_level", "notice"),
        ]:
            cursor.execute("SELECT set_config(%s, %s, false)", [name, value])
    raw = connection.connection
    raw.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    cycle()
    cycle()
    print("\n\n".join(notices[len(notices) // 2 :]))
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('auto_explain.log_min_duration', '-1', false)")


def _explain(endpoint: Any) -> None:
    from django.db import connection, transaction

    from queues import gates, sql

    params = _claim_params(endpoint)
    for i, gate in enumerate(gates.gates()):
        params[f"gp{i}"] = gate.fast_params(endpoint.id)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN (ANALYZE, BUFFERS, VERBOSE, SETTINGS) " + sql.claim_next_sql(fast=True), params
        )
        print("\n".join(r[0] for r in cursor.fetchall()))
        cursor.execute(
            "SELECT id FROM queues_todo WHERE endpoint_id = %s AND state = 'claimed' LIMIT 1",
            [endpoint.id],
        )
        (todo_id,) = cursor.fetchone()
        cursor.execute(
            "EXPLAIN (ANALYZE, BUFFERS, VERBOSE) " + sql.complete_sql(),
            _complete_params(endpoint, todo_id),
        )
        print("\n".join(r[0] for r in cursor.fetchall()))
        transaction.set_rollback(True)


if __name__ == "__main__":
    sys.exit(main())
