"""How an ending finds its todo (issue 12 item 2): by the primary key, whatever the number of the
endpoint's claims in flight. Through todo_claimed_idx (endpoint, queue) an ending read every
claimed row of its endpoint to keep the one it names: a completion's cost grew with the fleet.
The hot cursor prepares these statements, so the plan that runs is the generic one."""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction
from psycopg._queries import PostgresQuery
from psycopg.adapt import Transformer

from queues import services, sql
from tests.conftest import Personas, push


def _generic_plan(statement: str, params: dict[str, Any]) -> str:
    """The plan PostgreSQL keeps for ``statement`` once prepared (as the hot cursor runs it)."""
    connection.ensure_connection()
    query = PostgresQuery(Transformer(connection.connection))
    query.convert(statement, params)  # placeholders to $n, in the order of query._order
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(
            "SELECT format_type(o, NULL) FROM unnest(%s::oid[]) WITH ORDINALITY u(o, n) ORDER BY n",
            [list(query.types)],
        )
        # A None binds as unknown (oid 0): PREPARE infers its type from the statement.
        types = ["unknown" if row[0] == "-" else row[0] for row in cur.fetchall()]
        cur.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cur.execute(f"PREPARE ending_plan({', '.join(types)}) AS {query.query.decode()}")
        values = [params[name] for name in query._order or ()]
        placeholders = ", ".join("%s" if t == "unknown" else f"%s::{t}" for t in types)
        cur.execute(f"EXPLAIN EXECUTE ending_plan({placeholders})", values)
        plan = "\n".join(row[0] for row in cur.fetchall())
        cur.execute("DEALLOCATE ending_plan")
    return plan


def test_the_endings_and_the_heartbeat_find_the_todo_by_its_primary_key(
    personas: Personas,
) -> None:
    todos = push(personas, 500)[:12]
    # Statistics from a moment with nothing in flight (as after a quiet spell): the planner
    # then thinks the claimed index holds next to nothing, and scanning all of it cheap.
    with connection.cursor() as cur:
        cur.execute("ANALYZE queues_todo")
    for todo in todos:  # an endpoint with 12 claims in flight and a backlog
        services.claim(actor=personas.as_agent(), todo_id=todo.id)
    params = sql.transition_params(
        {"result": None, "summary": "", "error": None, "ttl": 60, "base": 1, "cap": 60},
        todo_id=todos[5].id,
        endpoint_ids=[personas.agent.id],
        operator=False,
        fence=None,
        attempt=None,
        ends=True,
    )
    for statement in (
        sql.complete_sql(),
        sql.complete_plain_sql(),
        sql.fail_sql(),
        sql.release_sql(),
        sql.heartbeat_sql(),
    ):
        plan = _generic_plan(statement, params)
        todo_scan = [
            line for line in plan.splitlines() if "Scan" in line and "queues_todo t" in line
        ]
        assert todo_scan, plan
        assert all("queues_todo_pkey" in line for line in todo_scan), plan
