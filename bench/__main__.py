"""``make bench``: every benchmark, results as JSON under bench/results/.

Runs against a database of its own (``switchboard_bench``, or BENCH_DATABASE) on the embedded PostgreSQL, or on the
server of DATABASE_URL, migrated fresh; the embedded Valkey is started if REDIS_URL is unset.
``python -m bench [--duration S] [--repeats N] [--modes threads,processes] [--points 8,32]
[--only core,http,admission,console,doorbell,boardlive,limits] [--wait-quiet S]``: ``--repeats`` and ``--modes``
reach the benches that take them (core, admission; repeats also boardlive, limits), ``--points``
the admission bench (1, 8, 32, 10_queues_at_8, 3_windows_at_8). ``--wait-quiet S`` starts each
bench only once the host is quiet (``bench.common.wait_for_quiet``), waiting at most S seconds;
the result records the wait (``quiet_gate``). Prints each bench's wall time and the total.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCHES = {
    "core": "bench.core_bench",
    "http": "bench.http_bench",
    "admission": "bench.admission_bench",
    "console": "bench.console_bench",
    "doorbell": "bench.doorbell_bench",
    "boardlive": "bench.board_live_bench",
    "limits": "bench.limits_bench",
}


def _bench_database() -> None:
    """Point DATABASE_URL at a bench database on the same server, created if missing."""
    import psycopg

    from switchboard import embedded

    base = os.environ.get("DATABASE_URL")
    if base:
        settings_dict = embedded.parse_database_url(base)
        admin = base
    else:
        info = embedded.ensure_postgres()
        settings_dict = embedded.database_settings(None)
        admin = info.url("postgres")
    # The embedded server is shared by every checkout on the machine: BENCH_DATABASE names
    # another database, so two benches at once do not drop each other's.
    name = os.environ.get("BENCH_DATABASE", "switchboard_bench")
    # A fresh database each run: nothing left over from an earlier schema or an earlier run.
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    host, port, user = settings_dict["HOST"], settings_dict["PORT"], settings_dict["USER"]
    password = settings_dict.get("PASSWORD") or ""
    auth = user + (f":{password}" if password else "")
    if host.startswith("/"):
        os.environ["DATABASE_URL"] = f"postgresql://{auth}@/{name}?host={host}&port={port}"
    else:
        os.environ["DATABASE_URL"] = f"postgresql://{auth}@{host}:{port}/{name}"


def standalone(body: Callable[[], None]) -> int:
    """A bench module run on its own (``python -m bench.claim_profile``, ``…agent_path_profile``):
    a fresh bench database, Django set up, Valkey started when none answers, the migrations
    applied, then ``body``; Valkey stopped again if started here."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "switchboard.settings")
    _bench_database()
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from switchboard import embedded

    valkey: Any = None
    if not embedded.valkey_running(settings.REDIS_URL):
        valkey = embedded.start_valkey(settings.REDIS_URL)
    call_command("migrate", verbosity=0)
    try:
        body()
    finally:
        if valkey is not None:
            # The claims' counter increments, sent now while the Valkey started here still
            # answers: the exit-time flush would find it stopped and warn that it kept them.
            from switchboard.core import counters

            counters.flush()
            valkey.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--only", default=",".join(BENCHES), help="comma-separated benches")
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs per point, where a bench repeats (median)"
    )
    parser.add_argument(
        "--modes", default="threads,processes", help="worker modes, where a bench has them"
    )
    parser.add_argument("--points", default="", help="admission points (default: all)")
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="S",
        help="start each bench in a quiet spell of the host, waiting at most S seconds",
    )
    args = parser.parse_args(argv)
    # Each option reaches the benches whose run() takes it (and the repeating ones say so).
    options: dict[str, Any] = {
        "repeats": args.repeats,
        "modes": tuple(m.strip() for m in args.modes.split(",") if m.strip()),
    }
    if args.points:
        options["points"] = tuple(p.strip() for p in args.points.split(",") if p.strip())
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "switchboard.settings")
    _bench_database()
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from switchboard import embedded

    valkey: Any = None
    if not os.environ.get("REDIS_URL") and not embedded.valkey_running(settings.REDIS_URL):
        valkey = embedded.start_valkey(settings.REDIS_URL)
    call_command("migrate", verbosity=0)
    from bench.common import HISTORY_TODOS, load_history, wait_for_quiet, write_result

    load_history()

    status = 0
    began = time.perf_counter()
    try:
        for name in args.only.split(","):
            module = importlib.import_module(BENCHES[name.strip()])
            print(f"== {name} ({args.duration:g} s per measurement)", flush=True)
            accepted = inspect.signature(module.run).parameters
            kwargs = {k: v for k, v in options.items() if k in accepted}
            gate = None
            if args.wait_quiet > 0:
                gate = functools.partial(wait_for_quiet, embedded.data_dir(), args.wait_quiet)
            result = measured(
                functools.partial(module.run, args.duration, **kwargs), embedded.data_dir(), gate
            )
            result["history_todos"] = HISTORY_TODOS
            result["load"] = [round(x, 2) for x in os.getloadavg()]
            path = write_result(name, result)
            print(f"   {_brief(result)}\n   -> {path}", flush=True)
        print(f"== all done in {time.perf_counter() - began:.0f} s", flush=True)
    finally:
        if valkey is not None:
            valkey.stop()
    return status


def measured(
    run: Callable[[], dict[str, Any]],
    folder: Path,
    gate: Callable[[], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A bench's result with its wall time, and what the host gave just before it and just
    after it (``bench.common.host_probe``, its flush file in ``folder``): every loop waits for
    flushes and round trips, and on a virtual machine the host's moment moves them. With a
    ``gate`` (``--wait-quiet``), the bench starts when it returns, and its record is kept as
    ``quiet_gate``."""
    from bench.common import host_probe

    waited = None
    if gate is not None:
        waited = gate()
        if waited["quiet"] is False:
            print(f"   the host was not quiet: {waited}", flush=True)
        elif waited["quiet"] is None:
            print("   this host reports no steal: the bench was not held back", flush=True)
    before = host_probe(folder)
    started = time.perf_counter()
    result = run()
    result["wall_s"] = round(time.perf_counter() - started, 1)
    result["host_probe"] = {"before": before, "after": host_probe(folder)}
    if waited is not None:
        result["quiet_gate"] = waited
    return result


def _brief(value: Any) -> Any:
    """A result without its per-run detail (points, runs), for the terminal."""
    if isinstance(value, dict):
        return {
            k: _brief(v)
            for k, v in value.items()
            if k not in ("points", "runs", "collapses") and not isinstance(v, list)
        }
    return value


if __name__ == "__main__":
    sys.exit(main())
