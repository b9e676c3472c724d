"""Issue 2's bench: claim_next + complete cycles per second at 1, 4 and 16 workers, against a
raw-SQL SKIP LOCKED claim-and-complete through psycopg on the same database in the same run."""

from __future__ import annotations

from typing import Any

import psycopg
from django.contrib.auth.models import User
from django.db import connection

from bench.common import timed_pool
from queues import services
from queues.access import AgentActor, SystemActor
from queues.models import Endpoint, Todo
from queues.services import Claimed

WORKER_COUNTS = (1, 4, 16)
RAW_TABLE = "bench_raw_todo"


def _load_todos(endpoint: Endpoint, n: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO queues_todo (id, endpoint_id, queue, title, kind, payload, state, owner,
                attempt, max_attempts, source, created_at, updated_at)
            SELECT gen_random_uuid(), %s, 'bench', 'bench todo ' || g, '', '{}'::jsonb,
                   'pending', '', 0, 5, 'api', clock_timestamp(), clock_timestamp()
            FROM generate_series(1, %s) g
            """,
            [endpoint.id, n],
        )


def _raw_setup(n: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {RAW_TABLE}")
        cursor.execute(
            f"""
            CREATE TABLE {RAW_TABLE} (
                id bigserial PRIMARY KEY, state text NOT NULL DEFAULT 'pending',
                owner text, attempt int NOT NULL DEFAULT 0, lease_expires_at timestamptz,
                created_at timestamptz NOT NULL DEFAULT clock_timestamp())
            """
        )
        cursor.execute(f"CREATE INDEX ON {RAW_TABLE} (created_at) WHERE state = 'pending'")
        cursor.execute(
            f"INSERT INTO {RAW_TABLE} (state) SELECT 'pending' FROM generate_series(1, %s)", [n]
        )
        cursor.execute(f"ANALYZE {RAW_TABLE}")


RAW_CLAIM = f"""
UPDATE {RAW_TABLE} SET state = 'claimed', owner = %s, attempt = attempt + 1,
       lease_expires_at = now() + interval '5 minutes'
WHERE id = (SELECT id FROM {RAW_TABLE} WHERE state = 'pending'
            ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id
"""
RAW_COMPLETE = f"UPDATE {RAW_TABLE} SET state = 'done', lease_expires_at = NULL WHERE id = %s"

# The same raw loop on Switchboard's own table (its indexes and row width), for a second view of
# where the time goes: no attempt rows, no scope, no pause, no admission probe.
SAME_TABLE_CLAIM = """
UPDATE queues_todo SET state = 'claimed', owner = %s, attempt = attempt + 1,
       lease_expires_at = now() + interval '5 minutes', claimed_at = now()
WHERE id = (SELECT id FROM queues_todo WHERE endpoint_id = %s AND queue = 'bench'
              AND state = 'pending'
            ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id
"""
SAME_TABLE_COMPLETE = (
    "UPDATE queues_todo SET state = 'done', lease_expires_at = NULL, finished_at = now() "
    "WHERE id = %s"
)


def _raw_pool(
    params: dict[str, Any],
    workers: int,
    duration_s: float,
    claim: str,
    complete: str,
    extra: list[Any],
) -> dict[str, Any]:
    conns: dict[int, psycopg.Connection[Any]] = {}

    def cycle(i: int) -> bool:
        conn = conns.get(i)
        if conn is None:
            conn = conns[i] = psycopg.connect(autocommit=True, **params)
        row = conn.execute(claim, [f"raw-{i}", *extra]).fetchone()
        if row is None:
            return False
        conn.execute(complete, [row[0]])
        return True

    try:
        return timed_pool(workers, duration_s, cycle)
    finally:
        for c in conns.values():
            c.close()


def _reload(endpoint: Endpoint, n: int) -> None:
    Todo.objects.filter(endpoint=endpoint).delete()
    _load_todos(endpoint, n)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE queues_todo")


def run(duration_s: float = 5.0) -> dict[str, Any]:
    params = connection.get_connection_params()
    owner, _ = User.objects.get_or_create(username="bench-owner")
    endpoint, _token = services.endpoint_vend(
        actor=SystemActor(via="bench"), owner=owner, name="bench core", queues=["bench"], rps=0
    )
    actor = AgentActor(endpoint, via="api")
    per_config = int(4000 * duration_s) + 2000
    results: dict[str, Any] = {
        "duration_s": duration_s,
        "raw": [],
        "raw_same_table": [],
        "switchboard": [],
    }

    def cycle(i: int) -> bool:
        claimed = services.claim_next(actor=actor, claimant=f"w{i}")
        if not isinstance(claimed, Claimed):
            return False
        services.complete(actor=actor, todo_id=claimed.todo.id)
        return True

    try:
        for workers in WORKER_COUNTS:
            _raw_setup(per_config)
            results["raw"].append(
                _raw_pool(params, workers, duration_s, RAW_CLAIM, RAW_COMPLETE, [])
            )
            _reload(endpoint, per_config)
            results["raw_same_table"].append(
                _raw_pool(
                    params,
                    workers,
                    duration_s,
                    SAME_TABLE_CLAIM,
                    SAME_TABLE_COMPLETE,
                    [endpoint.id],
                )
            )
            _reload(endpoint, per_config)
            results["switchboard"].append(timed_pool(workers, duration_s, cycle))
    finally:
        Todo.objects.filter(endpoint=endpoint).delete()
        endpoint.delete()
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {RAW_TABLE}")

    def ratios(base: str) -> dict[str, float]:
        return {
            str(b["workers"]): round(ours["cycles_per_s"] / b["cycles_per_s"], 3)
            for b, ours in zip(results[base], results["switchboard"], strict=True)
        }

    results["ratio_vs_raw"] = ratios("raw")
    results["ratio_vs_raw_same_table"] = ratios("raw_same_table")
    results["target"] = "at 4 workers, switchboard >= 0.7 x raw"
    results["target_met"] = results["ratio_vs_raw"].get("4", 0) >= 0.7
    return results
