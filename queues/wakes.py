"""Wakes: the todo_ready notification and the ready hook. Hints, never the contract.

After commit, ``pg_notify('todo_ready', '<endpoint_id>:<queue>')`` (NOTIFY is transactional, so
issuing it inside the transaction delivers it exactly when the transaction commits) and, for an
endpoint with a notify hook, a ready hook posted by Celery. Nothing rings for a paused queue or a
deferred queue identity. The gate fails open: a failed check costs one wasted wake, while failing
closed could strand a live queue.
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID

from django.db import connection, transaction

from queues import gates

log = logging.getLogger(__name__)
CHANNEL = "todo_ready"


# A queue identity as a todo-shaped row, every other column NULL: a gate's probe may name any todo
# column (admission.limits' per-todo gates read pool and tags, and so say nothing here).
IDENTITY_ROW = (
    "jsonb_populate_record(NULL::queues_todo, "
    "jsonb_build_object('endpoint_id', %(e)s::uuid, 'queue', %(q)s::text))"
)


def payload(endpoint_id: UUID | str, queue: str) -> str:
    return f"{endpoint_id}:{queue}"


def _gate(endpoint_id: UUID | str, queue: str) -> tuple[bool, str]:
    """(may ring, notify hook URL). Fails open on any error."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            # The gates' probes over the identity, folded into the one lookup.
            cursor.execute(
                f"""
                SELECT EXISTS (SELECT 1 FROM queues_queuepause WHERE queue = %(q)s),
                       (SELECT notify_url FROM queues_endpoint WHERE id = %(e)s)
                       {gates.probes("i")}
                FROM {IDENTITY_ROW} i
                """,
                {"e": endpoint_id, "q": queue},
            )
            paused, url, *keys = cursor.fetchone()
            if paused:
                return False, url or ""
            return gates.admits_now(tuple(keys)), url or ""
    except Exception:
        log.exception("wake gate failed for %s:%s; ringing anyway", endpoint_id, queue)
        return True, ""


def todo_ready(
    endpoint_id: UUID | str,
    queue: str,
    *,
    todo_id: UUID | str | None = None,
    reason: str = "created",
) -> bool:
    """Ring for a queue identity in the current transaction (delivered at commit). Returns
    whether it rang."""
    may_ring, url = _gate(endpoint_id, queue)
    if not may_ring:
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, payload(endpoint_id, queue)])
    if url:
        transaction.on_commit(lambda: _enqueue_hook(endpoint_id, queue, todo_id, reason))
    return True


def todo_ready_now(endpoint_id: UUID | str, queue: str, reason: str = "released") -> bool:
    """Ring in a transaction of its own (for callers that have already committed)."""
    with transaction.atomic():
        return todo_ready(endpoint_id, queue, reason=reason)


def slot_freed(endpoint_id: UUID | str, queue: str) -> bool:
    """The reopen edge: a claim ended, so a queue a gate limits in flight may be admitted again.
    Rings only when some gate limits it, every gate admits now and todos are pending (an ending
    claim frees no window budget: nothing refunds)."""
    try:
        with connection.cursor() as cursor:
            # Whether some gate limits what the ending claim held (admission: an in-flight
            # cap), and work waits.
            cursor.execute(
                f"""
                SELECT ({gates.frees_slot("i")})
                   AND EXISTS (SELECT 1 FROM queues_todo
                               WHERE endpoint_id = %(e)s AND queue = %(q)s AND state = 'pending')
                FROM {IDENTITY_ROW} i
                """,
                {"e": endpoint_id, "q": queue},
            )
            row = cursor.fetchone()
    except Exception:
        log.exception("reopen check failed for %s:%s", endpoint_id, queue)
        return False
    if not row or not row[0]:
        return False
    return todo_ready_now(endpoint_id, queue, reason="reopened")


def _enqueue_hook(
    endpoint_id: UUID | str, queue: str, todo_id: UUID | str | None, reason: str
) -> None:
    try:
        from queues import tasks

        tasks.deliver_ready_hook.delay(
            str(endpoint_id), queue, str(todo_id) if todo_id else None, reason
        )
    except Exception:
        log.exception("could not enqueue the ready hook for %s:%s", endpoint_id, queue)


def listen(timeout: float, *, channel: str = CHANNEL) -> list[Any]:
    """Collect todo_ready notifications on a fresh connection for up to ``timeout`` seconds
    (operators' debugging and the tests; the SSE forwarder has its own listener)."""
    import psycopg

    params = connection.get_connection_params()
    conn = psycopg.connect(autocommit=True, **params)
    try:
        conn.execute(f"LISTEN {channel}")
        return [n.payload for n in conn.notifies(timeout=timeout)]
    finally:
        conn.close()
