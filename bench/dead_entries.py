"""The claimable index's dead entries against the vacuum cadence (issue 12 item 3).

Each claim + complete leaves two dead entries at the head of ``todo_claimable_idx``. The claims
mark them LP_DEAD, but every claim still reads the leaf pages that hold them, from the endpoint's
left edge, until a vacuum removes them: a claim's cost grows with the claims since the last
vacuum, in a sawtooth with autovacuum's period. This tool runs blocks of claim_next + complete
cycles at T threads on a freshly vacuumed hot queue, with no vacuum of its own between blocks
(autovacuum runs as configured), and after each block reports:

- cycles/s, and the claimers' backend CPU per cycle (their processes' /proc, local server only);
- the claimable index's pages read per cycle (pg_statio, always there) and, when
  pg_stat_statements is loaded, the claim statement's shared buffers and execution time per call;
- the index's leaf pages, leaf items, stale items (pointing at no claimable row) and items marked
  LP_DEAD (pageinspect);
- queues_todo's dead tuples, the autovacuum runs on it in the block and their time (PG 18's
  ``total_autovacuum_time``), and every autovacuum worker's CPU in the block (local server only).

``python -m bench.dead_entries --threads 8 --blocks 15 --block-cycles 10000``

Prices a setting without a code change: ``--naptime 10`` sets the cluster's
``autovacuum_naptime`` for the run (ALTER SYSTEM, restored afterwards), ``--todo-reloptions
autovacuum_vacuum_threshold=2000,autovacuum_vacuum_cost_delay=0`` sets the table's storage
parameters in the bench database, ``--todo-reloptions defaults`` removes every one (autovacuum's
defaults, whatever the migrations set). A database of its own (BENCH_DATABASE, as ``python -m
bench``), migrated fresh; JSON under bench/results/ (``dead_entries-*.json``).

The claim's buffers per call need pg_stat_statements preloaded, which takes a restart: ``ALTER
SYSTEM SET shared_preload_libraries = 'pg_stat_statements'``, then stop every process holding the
embedded server (it stops with its last holder) and start one again. Without it those columns
read "-" and the index pages per cycle stand in for them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INDEX = "todo_claimable_idx"
TABLE = "queues_todo"
CLAIM_LIKE = "%WITH cand AS%"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.dead_entries", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--threads", type=int, default=8, help="claimer threads (default 8)")
    parser.add_argument("--blocks", type=int, default=15)
    parser.add_argument("--block-cycles", type=int, default=10_000, help="cycles per block")
    parser.add_argument(
        "--naptime", type=float, default=None, help="autovacuum_naptime (s) for the run"
    )
    parser.add_argument(
        "--todo-reloptions",
        default=None,
        help="'k=v,k=v' set on queues_todo for the run, or 'defaults' to reset every one",
    )
    parser.add_argument(
        "--no-history", action="store_true", help="skip the benches' 20,000 finished todos"
    )
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=0,
        help="first measure autovacuum's CPU this long with no claims (its cost of visiting)",
    )
    parser.add_argument("--label", default="", help="a name for this run in the JSON")
    args = parser.parse_args(argv)
    from bench.__main__ import standalone

    return standalone(lambda: _run(args))


@dataclass
class Sample:
    """Cumulative counters read between blocks."""

    index_blocks: int
    claim_calls: int | None
    claim_buffers: int | None
    claim_exec_ms: float | None
    autovacuums: int
    autovacuum_ms: float | None
    autoanalyzes: int
    autovacuum_cpu_s: float | None
    claimers_cpu_s: float | None
    at: float = field(default_factory=time.perf_counter)


def _cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children_cpu_of(pid: int) -> float:
    """CPU of the exited children a process has reaped (cutime + cstime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


class Server:
    """What the tool reads of the server: whether it is on this machine, which extensions it has."""

    def __init__(self, cursor: Any) -> None:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
        cursor.execute("SHOW shared_preload_libraries")
        self.statements = "pg_stat_statements" in cursor.fetchone()[0]
        if self.statements:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        cursor.execute(
            "SELECT 1 FROM pg_attribute WHERE attrelid = 'pg_stat_user_tables'::regclass"
            " AND attname = 'total_autovacuum_time'"
        )
        self.vacuum_time = cursor.fetchone() is not None
        # The postmaster reaps every exited autovacuum worker: its children's CPU is theirs.
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'autovacuum launcher'"
        )
        row = cursor.fetchone()
        self.postmaster: int | None = None
        if row is not None and Path(f"/proc/{row[0]}").exists():
            import psutil

            self.postmaster = psutil.Process(row[0]).ppid()

    def sample(self, cursor: Any, claimers: list[int]) -> Sample:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT coalesce(idx_blks_hit + idx_blks_read, 0) FROM pg_statio_user_indexes"
            " WHERE indexrelname = %s",
            [INDEX],
        )
        (index_blocks,) = cursor.fetchone()
        vacuum_time = "total_autovacuum_time" if self.vacuum_time else "NULL"
        cursor.execute(
            f"SELECT autovacuum_count, {vacuum_time}, autoanalyze_count FROM pg_stat_user_tables"
            " WHERE relname = %s",
            [TABLE],
        )
        autovacuums, autovacuum_ms, autoanalyzes = cursor.fetchone()
        calls = buffers = None
        exec_ms = None
        if self.statements:
            cursor.execute(
                "SELECT coalesce(sum(calls), 0), coalesce(sum(shared_blks_hit + shared_blks_read),"
                " 0), coalesce(sum(total_exec_time), 0) FROM pg_stat_statements WHERE query LIKE"
                " %s AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
                [CLAIM_LIKE],
            )
            calls, buffers, exec_ms = cursor.fetchone()
        autovacuum_cpu = None
        if self.postmaster is not None:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'"
            )
            workers = [r[0] for r in cursor.fetchall()]
            autovacuum_cpu = _children_cpu_of(self.postmaster)
            for pid in workers:
                try:
                    autovacuum_cpu += _cpu_of(pid)
                except OSError:  # exited (and reaped) since: counted above or next time
                    pass
        claimers_cpu = None
        if self.postmaster is not None and all(claimers):
            claimers_cpu = sum(_cpu_of(p) for p in claimers)
        return Sample(
            int(index_blocks),
            None if calls is None else int(calls),
            None if buffers is None else int(buffers),
            None if exec_ms is None else float(exec_ms),
            int(autovacuums),
            None if autovacuum_ms is None else float(autovacuum_ms),
            int(autoanalyzes),
            autovacuum_cpu,
            claimers_cpu,
        )


def _leaves(cursor: Any) -> dict[str, int]:
    """The claimable index's leaf pages, their items, the stale ones, the marked ones."""
    cursor.execute(
        "SELECT count(*), coalesce(sum(s.live_items + s.dead_items), 0),"
        " coalesce(sum(s.dead_items), 0)"
        " FROM generate_series(1, pg_relation_size(%s) / current_setting('block_size')::int - 1)"
        " b, bt_page_stats(%s, b::int) s WHERE s.type = 'l'",
        [INDEX, INDEX],
    )
    pages, items, dead = cursor.fetchone()
    cursor.execute(
        f"SELECT count(*) FROM {TABLE} WHERE state IN ('pending', 'claimed')"
        " OR (state = 'failed' AND next_retry_at IS NOT NULL)"
    )
    (live,) = cursor.fetchone()
    return {
        "leaf_pages": int(pages),
        "leaf_items": int(items),
        "stale": int(items) - int(live),
        "lp_dead": int(dead),
    }


def _dead_tuples(cursor: Any) -> int:
    cursor.execute(
        "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = %s",
        [TABLE],
    )
    return int(cursor.fetchone()[0] or 0)


def _per(a: float | None, b: float | None, n: float, scale: float = 1.0) -> float | None:
    if a is None or b is None or not n:
        return None
    return round((b - a) / n * scale, 1)


def _block(before: Sample, after: Sample, cycles: int, total: int, extra: dict[str, Any]) -> dict:
    elapsed = after.at - before.at
    calls = None if after.claim_calls is None else after.claim_calls - (before.claim_calls or 0)
    return {
        "cycles_since_vacuum_start": total,
        "seconds": round(elapsed, 2),
        "cycles_per_s": round(cycles / elapsed, 1),
        "backend_us_per_cycle": _per(before.claimers_cpu_s, after.claimers_cpu_s, cycles, 1e6),
        "index_pages_per_cycle": _per(before.index_blocks, after.index_blocks, cycles),
        "claim_buffers_per_call": _per(before.claim_buffers, after.claim_buffers, calls or 0),
        "claim_exec_us_per_call": _per(before.claim_exec_ms, after.claim_exec_ms, calls or 0, 1e3),
        "autovacuums": after.autovacuums - before.autovacuums,
        "autovacuum_ms": _per(before.autovacuum_ms, after.autovacuum_ms, 1),
        "autoanalyzes": after.autoanalyzes - before.autoanalyzes,
        "autovacuum_cpu_us_per_cycle": _per(
            before.autovacuum_cpu_s, after.autovacuum_cpu_s, cycles, 1e6
        ),
        **extra,
        "load": round(os.getloadavg()[0], 2),
    }


COLUMNS = (
    ("cycles_since_vacuum_start", "cycles", 8),
    ("cycles_per_s", "cyc/s", 6),
    ("backend_us_per_cycle", "be us/c", 7),
    ("index_pages_per_cycle", "idx pg/c", 8),
    ("claim_buffers_per_call", "claim buf", 9),
    ("claim_exec_us_per_call", "claim us", 8),
    ("leaf_pages", "leaves", 6),
    ("stale", "stale", 6),
    ("lp_dead", "LP_DEAD", 7),
    ("dead_tuples", "dead tup", 8),
    ("autovacuums", "avac", 4),
    ("autovacuum_ms", "avac ms", 7),
    ("autovacuum_cpu_us_per_cycle", "avac us/c", 9),
    ("load", "load", 5),
)


def _line(row: dict[str, Any]) -> str:
    def cell(value: Any, width: int) -> str:
        if value is None:
            return "-".rjust(width)
        if isinstance(value, float):
            return f"{value:{width}.{0 if abs(value) >= 100 else 1}f}"
        return f"{value:{width}}"

    return " ".join(cell(row.get(key), width) for key, _, width in COLUMNS)


def _summary(rows: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    if not values:
        return None
    return {
        "median": round(statistics.median(values), 1),
        "peak": round(max(values), 1),
        "min": round(min(values), 1),
    }


def _configure(cursor: Any, args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """Apply --naptime and --todo-reloptions; what to restore afterwards, and the settings."""
    restore: Any = None
    if args.naptime is not None:
        cursor.execute("SELECT setting, source FROM pg_settings WHERE name = 'autovacuum_naptime'")
        restore = cursor.fetchone()
        cursor.execute(f"ALTER SYSTEM SET autovacuum_naptime = '{float(args.naptime):g}s'")
        cursor.execute("SELECT pg_reload_conf()")
        time.sleep(0.5)
    if args.todo_reloptions == "defaults":
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = %s", [TABLE])
        present = [opt.split("=", 1)[0] for opt in cursor.fetchone()[0] or []]
        if present:
            cursor.execute(f"ALTER TABLE {TABLE} RESET ({', '.join(present)})")
    elif args.todo_reloptions:
        pairs = [p.strip() for p in args.todo_reloptions.split(",") if p.strip()]
        for pair in pairs:
            name, _, value = pair.partition("=")
            if not name.replace("_", "").isalnum() or not value:
                raise SystemExit(f"--todo-reloptions: {pair!r} is not name=value")
        cursor.execute(f"ALTER TABLE {TABLE} SET ({', '.join(pairs)})")
    cursor.execute(
        "SELECT name, setting FROM pg_settings WHERE name LIKE 'autovacuum%%'"
        " OR name IN ('vacuum_cost_limit', 'vacuum_cost_delay') ORDER BY name"
    )
    cluster = dict(cursor.fetchall())
    cursor.execute("SELECT reloptions FROM pg_class WHERE relname = %s", [TABLE])
    table = cursor.fetchone()[0] or []
    return {"cluster": cluster, TABLE: table}, restore


def _restore(cursor: Any, restore: Any) -> None:
    if restore is None:
        return
    setting, source = restore
    if source == "default":
        cursor.execute("ALTER SYSTEM RESET autovacuum_naptime")
    else:
        cursor.execute(f"ALTER SYSTEM SET autovacuum_naptime = '{int(setting)}s'")
    cursor.execute("SELECT pg_reload_conf()")


def _run(args: argparse.Namespace) -> None:
    from django.contrib.auth.models import User
    from django.db import connection

    from bench.common import load_history, write_result
    from queues import services
    from queues.access import SystemActor

    if not args.no_history:
        load_history()
    owner, _ = User.objects.get_or_create(username="bench-owner")
    endpoint, _token = services.endpoint_vend(
        actor=SystemActor(via="bench"), owner=owner, name="dead entries", queues=["bench"], rps=0
    )
    with connection.cursor() as cursor:
        server = Server(cursor)
        settings, restore = _configure(cursor, args)
    try:
        idle = _idle(server, args.idle_seconds) if args.idle_seconds else None
        result = {**_blocks(args, endpoint, server, settings), "idle": idle}
    finally:
        with connection.cursor() as cursor:
            _restore(cursor, restore)
    path = write_result("dead_entries", result)
    print(f"-> {path}")


def _idle(server: Server, seconds: float) -> dict[str, Any]:
    """Autovacuum's CPU with nothing to vacuum: its visits to every database of the cluster, once
    per naptime each (a worker started, the database's statistics read)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_database WHERE datallowconn")
        (databases,) = cursor.fetchone()
        before = server.sample(cursor, [])
        time.sleep(seconds)
        after = server.sample(cursor, [])
    cpu = _per(before.autovacuum_cpu_s, after.autovacuum_cpu_s, after.at - before.at, 1e3)
    print(
        f"idle {seconds:g} s: autovacuum CPU {cpu if cpu is not None else '-'} ms per second"
        f" ({databases} databases on the server)"
    )
    return {"seconds": seconds, "autovacuum_cpu_ms_per_s": cpu, "databases": int(databases)}


def _blocks(args: argparse.Namespace, endpoint: Any, server: Server, settings: dict) -> dict:
    from django.db import connection, connections

    from bench.core_bench import _reload
    from queues import services
    from queues.access import AgentActor
    from queues.services import Claimed

    threads = args.threads
    per = max(1, args.block_cycles // threads)
    cycles = per * threads
    # Enough pending todos that the queue never runs dry, then VACUUM ANALYZE: the start is a
    # freshly vacuumed table, as after any vacuum. Loading 150,000 of them outlasts the settings'
    # statement timeout on a loaded machine.
    with connection.cursor() as cursor:
        cursor.execute("SET statement_timeout = 0")
    _reload(endpoint, args.blocks * cycles + 100 * threads + 1000)
    actor = AgentActor(endpoint, via="api")
    pids: list[int] = [0] * threads
    start, end = threading.Barrier(threads + 1), threading.Barrier(threads + 1)
    stop = threading.Event()
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                pids[i] = cursor.fetchone()[0]
            while True:
                start.wait()
                if stop.is_set():
                    break
                for _ in range(per):
                    claimed = services.claim_next(actor=actor, claimant=f"dead-{i}")
                    if not isinstance(claimed, Claimed):
                        raise RuntimeError(f"the hot queue ran dry or refused: {claimed!r}")
                    services.complete(actor=actor, todo_id=claimed.todo.id)
                # The backend's statistics go out now, not up to a second later (PG 15+).
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_stat_force_next_flush()")
                end.wait()
        except BaseException as exc:
            errors.append(exc)
            start.abort()
            end.abort()
        finally:
            connections.close_all()

    workers = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    rows: list[dict[str, Any]] = []
    print(
        f"{threads} threads, {args.blocks} blocks of {cycles} claim+complete cycles, from a"
        " freshly vacuumed table; autovacuum as configured:"
    )
    print(f"  {TABLE}: {settings[TABLE] or 'no storage parameters (autovacuum defaults)'}")
    print(f"  autovacuum_naptime: {settings['cluster'].get('autovacuum_naptime')} s")
    if not server.statements:
        print(
            "  pg_stat_statements is not preloaded: 'claim buf' and 'claim us' read '-' (ALTER"
            " SYSTEM SET shared_preload_libraries = 'pg_stat_statements', then restart the server)"
        )
    if server.postmaster is None:
        print("  the server is not on this machine: no backend or autovacuum CPU")
    print("  " + " ".join(title.rjust(width) for _, title, width in COLUMNS))
    total = 0
    try:
        with connection.cursor() as cursor:
            while not all(pids) and not errors:
                time.sleep(0.05)
            before = server.sample(cursor, pids)
            for _ in range(args.blocks):
                start.wait()
                end.wait()
                after = server.sample(cursor, pids)
                total += cycles
                extra = {**_leaves(cursor), "dead_tuples": _dead_tuples(cursor)}
                row = _block(before, after, cycles, total, extra)
                rows.append(row)
                print("  " + _line(row), flush=True)
                # The leaf walk above is not the claimers' time: the next block starts after it.
                before = server.sample(cursor, pids)
    finally:
        stop.set()
        try:
            start.wait(timeout=60)
        except threading.BrokenBarrierError:
            pass
        for w in workers:
            w.join(timeout=60)
    if errors:
        raise errors[0]
    keys = (
        "cycles_per_s",
        "backend_us_per_cycle",
        "index_pages_per_cycle",
        "claim_buffers_per_call",
        "claim_exec_us_per_call",
        "autovacuum_cpu_us_per_cycle",
        "leaf_pages",
        "lp_dead",
    )
    medians = {key: _summary(rows, key) for key in keys}
    runs = [r["autovacuum_ms"] for r in rows if r["autovacuums"]]
    vacuums = sum(r["autovacuums"] for r in rows)
    seconds = sum(r["seconds"] for r in rows)
    vacuum = {
        "runs": vacuums,
        "every_s": round(seconds / vacuums, 1) if vacuums else None,
        "ms_per_run": round(sum(runs) / vacuums, 1) if vacuums and None not in runs else None,
        "autoanalyzes": sum(r["autoanalyzes"] for r in rows),
    }
    print(f"  over {total} cycles in {seconds:.0f} s:")
    for key, value in medians.items():
        if value is not None:
            print(f"    {key}: median {value['median']}, peak {value['peak']}, min {value['min']}")
    print(
        f"    autovacuum of {TABLE}: {vacuum['runs']} runs, one every {vacuum['every_s']} s,"
        f" {vacuum['ms_per_run']} ms each"
    )
    return {
        "label": args.label,
        "threads": threads,
        "blocks": args.blocks,
        "block_cycles": cycles,
        "settings": settings,
        "pg_stat_statements": server.statements,
        "summary": medians,
        "autovacuum": vacuum,
        "rows": rows,
        "load": [round(x, 2) for x in os.getloadavg()],
    }


if __name__ == "__main__":
    raise SystemExit(main())
