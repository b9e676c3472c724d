"""The sweeps: lapsed leases back to the queue (or dead-lettered), due retries back to pending."""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction

from queues import metrics, sql, wakes
from queues.access import SystemActor, ledger_actor
from queues.models import TodoState

SWEEP_BATCH = 500


def _reaper_params() -> dict[str, Any]:
    """The reaper's part of its statement: the ``limits.end`` row naming the grants a batch ends
    is the system's (``system:reaper``)."""
    return sql.grant_params(ledger_actor(SystemActor(via="reaper")), "")


def reap_expired() -> int:
    """Lapsed claims back to pending, or dead-lettered at the cap. Safe to run twice at once:
    SKIP LOCKED means two sweeps never process the same row."""
    total = 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql.reap_sql(), {"batch": SWEEP_BATCH, **_reaper_params()})
            rows = cursor.fetchall()
            n = 0
            # One ring per queue identity for this commit: ``reaped`` for the identities work
            # returned to, ``reopened`` (after commit) for the others a freed limit unit wakes.
            reaped: set[str] = set()
            reopens: set[str] = set()
            for endpoint_id, queue, state, count, keys in rows:
                n += count
                reopens.update(keys)
                metrics.leases_expired(queue, count)
                if state == TodoState.FAILED:
                    metrics.completed(queue, "dead_lettered", count)
                else:
                    reaped.add(wakes.payload(endpoint_id, queue))
                    wakes.todo_ready(endpoint_id, queue, reason="reaped")
            if reopens - reaped:
                transaction.on_commit(lambda keys=reopens - reaped: wakes.reopen(keys))  # type: ignore[misc]
        total += n
        if n < SWEEP_BATCH:
            return total


def requeue_due_retries() -> int:
    """Failed todos whose backoff elapsed back to pending (a paused queue's wait there)."""
    total = 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql.REQUEUE_SQL, {"batch": SWEEP_BATCH})
            rows = cursor.fetchall()
            n = 0
            for endpoint_id, queue, count in rows:
                n += count
                wakes.todo_ready(endpoint_id, queue, reason="requeued")
        total += n
        if n < SWEEP_BATCH:
            return total
