"""The sweeps: lapsed leases back to the queue (or dead-lettered), due retries back to pending."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from queues import metrics, sql, wakes
from queues.access import SystemActor, ledger_actor
from queues.models import SweepRun, TodoState
from queues.sql.push import FREED_SQL

SWEEP_BATCH = 500
log = logging.getLogger(__name__)


def _reaper_params() -> dict[str, Any]:
    """The reaper's part of its statement: the ``limits.end`` row naming the grants a batch ends
    is the system's (``system:reaper``)."""
    return sql.grant_params(ledger_actor(SystemActor(via="reaper")), "")


def _ring_freed(cursor: Any, identities: list[tuple[Any, str]], reason: str) -> None:
    """One ring per queue identity the sweep returned work to, naming the todo that became
    claimable: when the sweep freed several of one identity, the oldest of them (the one a claim
    takes first). Called in the sweep's transaction, before its commit."""
    if not identities:
        return
    cursor.execute(FREED_SQL, {"e": [e for e, _ in identities], "q": [q for _, q in identities]})
    named = {(e, q): todo_id for e, q, todo_id in cursor.fetchall()}
    for endpoint_id, queue in identities:
        wakes.todo_ready(endpoint_id, queue, todo_id=named.get((endpoint_id, queue)), reason=reason)


def reap_expired() -> int:
    """Lapsed claims back to pending, or dead-lettered at the cap. Safe to run twice at once:
    SKIP LOCKED means two sweeps never process the same row. Each ``reaped`` ring names a todo
    the batch returned to pending (``_ring_freed``)."""
    total = 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql.reap_sql(), {"batch": SWEEP_BATCH, **_reaper_params()})
            rows = cursor.fetchall()
            n = 0
            # One ring per queue identity for this commit: ``reaped`` for the identities work
            # returned to, ``reopened`` (after commit) for the others a freed limit unit wakes.
            reaped: list[tuple[Any, str]] = []
            reopens: set[str] = set()
            for endpoint_id, queue, state, count, keys in rows:
                n += count
                reopens.update(keys)
                metrics.leases_expired(queue, count)
                if state == TodoState.FAILED:
                    metrics.completed(queue, "dead_lettered", count)
                else:
                    reaped.append((endpoint_id, queue))
            _ring_freed(cursor, reaped, "reaped")
            reaped_keys = {wakes.payload(endpoint_id, queue) for endpoint_id, queue in reaped}
            if reopens - reaped_keys:
                wakes.after_commit(lambda keys=reopens - reaped_keys: wakes.reopen(keys))  # type: ignore[misc]
        total += n
        if n < SWEEP_BATCH:
            return total


def requeue_due_retries() -> int:
    """Failed todos whose backoff elapsed back to pending (a paused queue's wait there). Each
    ``requeued`` ring names a todo the batch requeued (``_ring_freed``)."""
    total = 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql.REQUEUE_SQL, {"batch": SWEEP_BATCH})
            rows = cursor.fetchall()
            n = sum(count for _, _, count in rows)
            _ring_freed(
                cursor, [(endpoint_id, queue) for endpoint_id, queue, _ in rows], "requeued"
            )
        total += n
        if n < SWEEP_BATCH:
            return total


def swept(name: str, sweep: Callable[[], int]) -> int:
    """Run a beat sweep and record that it finished (``record_sweep_run``): a record that fails
    is logged, never the sweep's failure."""
    done = sweep()
    try:
        record_sweep_run(name, done)
    except Exception:
        log.warning("could not record that the %s sweep ran", name, exc_info=True)
    return done


def record_sweep_run(name: str, count: int) -> None:
    """A sweep finished now (``SweepRun``), having done ``count``: what the board and /metrics
    read to tell a stopped worker or beat from a quiet fleet."""
    SweepRun.objects.update_or_create(
        name=name, defaults={"finished_at": timezone.now(), "count": max(count, 0)}
    )
