"""The sweeps: lapsed leases back to the queue (or dead-lettered), due retries back to pending."""

from __future__ import annotations

import functools
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


def _freed(cursor: Any, identities: list[tuple[Any, str]]) -> list[tuple[Any, str, Any]]:
    """Per queue identity the sweep returned work to, the todo to name in its ring: when the
    sweep freed several of one identity, the oldest of them (the one a claim takes first). Read
    in the sweep's transaction (the todos it set pending carry its ``now()``)."""
    if not identities:
        return []
    cursor.execute(FREED_SQL, {"e": [e for e, _ in identities], "q": [q for _, q in identities]})
    named = {(e, q): todo_id for e, q, todo_id in cursor.fetchall()}
    return [(e, q, named.get((e, q))) for e, q in identities]


def _ring_freed(freed: list[tuple[Any, str, Any]], reason: str) -> None:
    """After the sweep's commit, in a transaction of its own: one ring per identity of
    ``freed`` (``_freed``). Never in the sweep's transaction: the reaper's statement holds a
    grant chain's lock (its ``limits.end`` rows) and a ring's gate reads the pause table, while
    a claim reads the pause table first and then takes a grant chain (the lock order of
    ``queues.pauses``). Rung inside, a sweep waiting behind a pause held the chain a claim the
    pause waited for needed."""
    if not freed:
        return
    with transaction.atomic():
        for endpoint_id, queue, todo_id in freed:
            wakes.todo_ready(endpoint_id, queue, todo_id=todo_id, reason=reason)


def reap_expired() -> int:
    """Lapsed claims back to pending, or dead-lettered at the cap. Safe to run twice at once:
    SKIP LOCKED means two sweeps never process the same row. Each ``reaped`` ring names a todo
    the batch returned to pending (``_ring_freed``, after the batch's commit)."""
    total = 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql.reap_sql(), {"batch": SWEEP_BATCH, **_reaper_params()})
            rows = cursor.fetchall()
            n = 0
            # One ring per queue identity for this commit, after it: ``reaped`` for the identities
            # work returned to, ``reopened`` for the others a freed limit unit wakes.
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
            freed = _freed(cursor, reaped)
            if freed:
                wakes.after_commit(functools.partial(_ring_freed, freed, "reaped"))
            reaped_keys = {wakes.payload(endpoint_id, queue) for endpoint_id, queue in reaped}
            if reopens - reaped_keys:
                wakes.after_commit(functools.partial(wakes.reopen, reopens - reaped_keys))
        total += n
        if n < SWEEP_BATCH:
            return total


def requeue_due_retries() -> int:
    """Failed todos whose backoff elapsed back to pending (a paused queue's wait there). Each
    ``requeued`` ring names a todo the batch requeued (``_ring_freed``, after the batch's
    commit)."""
    total = 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql.REQUEUE_SQL, {"batch": SWEEP_BATCH})
            rows = cursor.fetchall()
            n = sum(count for _, _, count in rows)
            freed = _freed(cursor, [(endpoint_id, queue) for endpoint_id, queue, _ in rows])
            if freed:
                wakes.after_commit(functools.partial(_ring_freed, freed, "requeued"))
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
