"""The HTTP bench's yardstick: what a claim/complete endpoint costs with almost no framework.

Starlette on the same uvicorn as Switchboard, psycopg's async pool, a bearer check against a
constant, JSON in and out, and one raw SQL statement per verb on a table of its own
(``bench_baseline_todo``): the claim is ``FOR UPDATE SKIP LOCKED`` in one ``UPDATE … RETURNING``.
No auth lookup, no rate limit, no grants, no counters, no ledger: the limit of this machine for
an HTTP claim endpoint in Python, against which Switchboard's REST and MCP are measured.

Run by ``bench.http_bench``: ``BASELINE_DSN=… uvicorn bench.http_baseline:app``.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

TABLE = "bench_baseline_todo"
TOKEN = "baseline"

SCHEMA = f"""
DROP TABLE IF EXISTS {TABLE};
CREATE TABLE {TABLE} (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    queue text NOT NULL,
    state text NOT NULL,
    attempt int NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    result jsonb,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- The claim's candidate scan: oldest pending of a queue.
CREATE INDEX {TABLE}_pending ON {TABLE} (queue, created_at) WHERE state = 'pending';
"""

CLAIM = f"""
UPDATE {TABLE} SET state = 'claimed', attempt = attempt + 1,
       lease_expires_at = now() + interval '300 seconds'
WHERE id = (
    SELECT id FROM {TABLE} WHERE queue = %s AND state = 'pending'
    ORDER BY created_at FOR UPDATE SKIP LOCKED LIMIT 1
)
RETURNING id, queue, attempt
"""
COMPLETE = f"""
UPDATE {TABLE} SET state = 'done', lease_expires_at = NULL, result = %s
WHERE id = %s AND state = 'claimed' RETURNING id, state
"""


def load(dsn: str, n: int) -> None:
    """(Re)create the table with ``n`` pending todos."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute(
            f"INSERT INTO {TABLE} (queue, state) SELECT 'bench', 'pending' "
            "FROM generate_series(1, %s)",
            (n,),
        )
        conn.execute(f"ANALYZE {TABLE}")


pool = AsyncConnectionPool(os.environ.get("BASELINE_DSN", ""), min_size=4, max_size=16, open=False)


def _refused(request: Request) -> JSONResponse | None:
    if request.headers.get("authorization") != f"Bearer {TOKEN}":
        return JSONResponse({"error": "unknown token", "code": "unauthorized"}, status_code=401)
    return None


async def claim_next(request: Request) -> JSONResponse:
    refused = _refused(request)
    if refused is not None:
        return refused
    await request.json()
    async with pool.connection() as conn:
        cursor = await conn.execute(CLAIM, ("bench",), prepare=True)
        row = await cursor.fetchone()
    if row is None:
        return JSONResponse({"empty": True})
    todo = {"id": str(row[0]), "queue": row[1], "attempt": row[2]}
    return JSONResponse({"empty": False, "todo": todo})


async def complete(request: Request) -> JSONResponse:
    refused = _refused(request)
    if refused is not None:
        return refused
    body = await request.json()
    async with pool.connection() as conn:
        cursor = await conn.execute(COMPLETE, (Jsonb(None), uuid.UUID(body["id"])), prepare=True)
        row = await cursor.fetchone()
    if row is None:
        return JSONResponse({"error": "not claimed", "code": "conflict"}, status_code=409)
    return JSONResponse({"todo": {"id": str(row[0]), "state": row[1]}})


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    await pool.open()
    yield
    await pool.close()


app = Starlette(
    routes=[
        Route("/claim_next", claim_next, methods=["POST"]),
        Route("/complete", complete, methods=["POST"]),
    ],
    lifespan=lifespan,
)
