"""The sweeps: lapsed leases back to the queue (or dead-lettered), due retries back to pending."""

from __future__ import annotations

from django.db import connection, transaction

from queues import metrics, sql, wakes
from queues.models import TodoState

SWEEP_BATCH = 500


def reap_expired() -> int:
    """Lapsed claims back to pending, or dead-lettered at the cap. Safe to run twice at once:
    SKIP LOCKED means two sweeps never process the same row."""
    total = 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql.REAP_SQL, {"batch": SWEEP_BATCH})
            rows = cursor.fetchall()
            n = 0
            for endpoint_id, queue, state, count in rows:
                n += count
                metrics.leases_expired(queue, count)
                if state == TodoState.FAILED:
                    metrics.completed(queue, "dead_lettered", count)
                else:
                    wakes.todo_ready(endpoint_id, queue, reason="reaped")
                transaction.on_commit(
                    lambda e=endpoint_id, q=queue: wakes.slot_freed(e, q)  # type: ignore[misc]
                )
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
