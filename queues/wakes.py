"""Wakes: the todo_ready notification and the ready hook. Hints, never the contract.

After commit, one ``pg_notify('todo_ready', <message>)`` (NOTIFY is transactional, so issuing it
inside the transaction delivers it exactly when the transaction commits) and, for an endpoint with
a notify hook, a ready hook posted by Celery. The message is JSON naming the queue identity, the
reason and the todo (the one that became claimable, else the identity's oldest pending):
``{"e": endpoint_id, "q": queue, "r": reason, "t": todo_id}``. Every web process's doorbell
(``queues.doorbell``) LISTENs and fans it out to the agents' streams. Nothing rings for a paused queue or a
deferred queue identity. The gate fails open: a failed check costs one wasted wake, while failing
closed could strand a live queue.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from typing import Any
from uuid import UUID

import psycopg
from django.conf import settings
from django.db import connection, transaction

from queues import hook_tasks, metrics, ring_gate, selectors
from switchboard.core import availability

log = logging.getLogger(__name__)
CHANNEL = "todo_ready"


# Why a ring rang, the ``reason`` of every stream event and ready hook: work became claimable
# (``created`` ... ``resumed``: the edges issue 14 lists), a held claim went quiet (``stalled``,
# to its holder), or ``waiting``: a reminder that work already claimable still waits (the
# doorbell heartbeat, a stream's attach or reconnect). ``waiting`` is kept apart on purpose: no
# edge happened, so naming one (say ``created`` for a todo created hours ago and requeued since)
# would tell an agent or a hook receiver something false; an agent may treat it like any other
# ring (try claim_next), and one already busy may ignore it.
REASONS = (
    "created",
    "requeued",
    "released",
    "reaped",
    "reopened",
    "resumed",
    "waiting",
    "stalled",
)


def payload(endpoint_id: UUID | str, queue: str) -> str:
    """The queue identity a ring is for, as ``<endpoint_id>:<queue>``."""
    return f"{endpoint_id}:{queue}"


def message(endpoint_id: UUID | str, queue: str, reason: str, todo_id: UUID | str | None) -> str:
    """The NOTIFY payload (well under PostgreSQL's 8000-byte limit: a queue name is <= 64)."""
    return json.dumps(
        {"e": str(endpoint_id), "q": queue, "r": reason, "t": str(todo_id) if todo_id else None},
        separators=(",", ":"),
    )


def parse(raw: str) -> dict[str, Any] | None:
    """A NOTIFY payload back to ``{"e", "q", "r", "t"}``; None for anything else on the channel."""
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(body, dict) or not {"e", "q", "r"} <= body.keys():
        return None
    return body


# The channel that ends an endpoint's streams (its token was revoked): the endpoint's id. Apart
# from ``todo_ready``, which carries only rings (hooks, tests and operators read it as such).
REVOKED_CHANNEL = "endpoint_revoked"


def revoked(endpoint_id: UUID | str) -> None:
    """End the endpoint's open streams in every web process when the current transaction
    commits (NOTIFY is transactional): its agent, refused from now on, is told nothing more."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [REVOKED_CHANNEL, str(endpoint_id)])


def identity(raw: str) -> str:
    """``<endpoint_id>:<queue>`` of a NOTIFY payload (the raw text if it is not a ring)."""
    body = parse(raw)
    return payload(body["e"], body["q"]) if body else raw


def after_commit(ring: Callable[[], object]) -> None:
    """Run ``ring`` once the current transaction commits (at once outside one). A ring that
    fails then is logged and dropped, never raised: the change it announces has committed, and
    its caller must hear that it did. Raised, it made an agent's ending or an operator's retry
    answer 503 "nothing changed" (or a sweep fail) for a change that had been made, when the
    database went away between the commit and the ring. A wake is a hint: work that still waits
    is found by the next claim, and the doorbell's reminders ring for it again."""

    def run() -> None:
        try:
            ring()
        except Exception:
            log.exception("a ring after a commit failed; the change it announces stands")

    transaction.on_commit(run)


def todo_ready(
    endpoint_id: UUID | str,
    queue: str,
    *,
    todo_id: UUID | str | None = None,
    reason: str = "created",
) -> bool:
    """Ring for a queue identity in the current transaction (delivered at commit). Returns
    whether it rang. The gate reads the pause table: not after an append to ledger chain 0 in a
    transaction that had not touched that table (lock order: ``queues.pauses``); ring on its
    commit instead."""
    may_ring, url, oldest = ring_gate.check(endpoint_id, queue)
    if not may_ring:
        metrics.notify_suppressed(reason)
        return False
    ring(endpoint_id, queue, reason, todo_id or oldest, hook=bool(url))
    return True


def ring(
    endpoint_id: UUID | str, queue: str, reason: str, todo_id: UUID | str | None, *, hook: bool
) -> None:
    """The NOTIFY (and, with ``hook``, the ready hook after commit), ungated: for callers that
    checked the gate or need none (a stall concerns a claim already held)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_notify(%s, %s)", [CHANNEL, message(endpoint_id, queue, reason, todo_id)]
        )
    metrics.notify_rung(reason)
    if hook:
        transaction.on_commit(lambda: _enqueue_hook(endpoint_id, queue, todo_id, reason))


def todo_ready_now(
    endpoint_id: UUID | str,
    queue: str,
    reason: str = "released",
    *,
    todo_id: UUID | str | None = None,
) -> bool:
    """Ring in a transaction of its own (for callers that have already committed)."""
    with transaction.atomic():
        return todo_ready(endpoint_id, queue, todo_id=todo_id, reason=reason)


def reopen(
    keys: Iterable[str],
    *,
    own: tuple[UUID | str, str] | None = None,
    reason: str | None = None,
    todo_id: UUID | str | None = None,
) -> int:
    """After a commit that ended claims: one ring per queue identity, in a transaction of its
    own. ``own`` (the ended todo's identity) rings ``reason`` (``released``) when given; every
    other identity among ``keys`` (``<endpoint_id>:<queue>``, from ``gates.reopens``: a limit
    that was at its cap freed a unit) rings ``reopened`` if a claim could take its work now.
    Each ring passes the gate (pause, admission); if the waiting check fails, all ring (fail
    open). Returns how many rang."""
    own_key = payload(*own) if own is not None else None
    wanted = sorted(set(keys) - ({own_key} if reason and own_key else set()))
    rang = 0
    with transaction.atomic():
        if own is not None and reason:
            rang += todo_ready(own[0], own[1], todo_id=todo_id, reason=reason)
        if not wanted:
            return rang
        try:
            with transaction.atomic():
                found = selectors.claimable_identities(
                    (e, q) for e, _, q in (key.partition(":") for key in wanted)
                )
            waiting = sorted(payload(e, q) for e, q in found)
        except Exception:
            log.exception("reopen check failed for %s; ringing anyway", wanted)
            waiting = wanted
        for key in waiting:
            endpoint_id, _, queue = key.partition(":")
            rang += todo_ready(endpoint_id, queue, reason="reopened")
    return rang


def _enqueue_hook(
    endpoint_id: UUID | str, queue: str, todo_id: UUID | str | None, reason: str
) -> None:
    """Hand the hook to the broker within the request's bound on Redis (``REDIS_TIMEOUT_SECONDS``
    to connect and for each socket operation), once, with no retry: Celery's own publish waits
    for ever on a broker that holds the connection open and does not answer (a frozen Valkey),
    and held every agent thread of the process with it (chaos10). A hook not handed over is
    logged and dropped: it is a hint, and the doorbell's reminders ring again for work that
    still waits. After a hand-off fails, the broker is not tried for
    ``REDIS_BREAKER_OPEN_SECONDS`` (``broker_breaker``), as the counters skip Redis: each hooked
    write held its agent thread for the bound, and under many writers every claim waited behind
    them (regress9b)."""
    if not broker_breaker.allow():
        log.warning(
            "did not hand the ready hook for %s:%s to the broker: it did not answer a moment ago",
            endpoint_id,
            queue,
        )
        return
    bound = settings.REDIS_TIMEOUT_SECONDS
    task = hook_tasks.deliver_ready_hook
    options = {"socket_timeout": bound, "socket_connect_timeout": bound, "max_retries": 0}
    try:
        with task.app.connection_for_write(
            connect_timeout=bound, transport_options=options
        ) as broker:
            task.apply_async(
                (str(endpoint_id), queue, str(todo_id) if todo_id else None, reason),
                connection=broker,
                retry=False,
            )
    except Exception as exc:
        broker_breaker.failed()
        log.warning(
            "could not hand the ready hook for %s:%s to the broker: %s", endpoint_id, queue, exc
        )


# The broker's own breaker (it may be another server than the counters' Redis).
broker_breaker = availability.Breaker()


def listen(timeout: float, *, channel: str = CHANNEL) -> list[Any]:
    """Collect todo_ready notifications on a fresh connection for up to ``timeout`` seconds
    (operators' debugging and the tests; the SSE forwarder has its own listener)."""
    params = connection.get_connection_params()
    conn = psycopg.connect(autocommit=True, **params)
    try:
        conn.execute(f"LISTEN {channel}")
        return [n.payload for n in conn.notifies(timeout=timeout)]
    finally:
        conn.close()
