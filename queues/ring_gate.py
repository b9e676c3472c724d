"""Whether a ring for a queue identity may ring now: not for a paused queue, nor for an identity a
claim gate defers. The wakes, the doorbell's reminders and the ready hook each ask. It fails open:
a failed check costs one wasted wake, while failing closed could strand a live queue.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import connection, transaction

from queues import gates
from queues.sql.push import WAITING_SQL, identity_lookup_sql

log = logging.getLogger(__name__)


def check(endpoint_id: UUID | str, queue: str) -> tuple[bool, str, UUID | None]:
    """(may ring, notify hook URL, the identity's oldest pending todo). Fails open on any error."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            # The gates' probes over the identity, folded into the one lookup.
            cursor.execute(identity_lookup_sql(gates.probes("i")), {"e": endpoint_id, "q": queue})
            paused, url, oldest, *keys = cursor.fetchone()
            if paused:
                return False, url or "", oldest
            return gates.admits_now(tuple(keys)), url or "", oldest
    except Exception:
        log.exception("wake gate failed for %s:%s; ringing anyway", endpoint_id, queue)
        return True, "", None


def admitted(
    endpoint_id: UUID | str,
    *,
    queue: str | None = None,
    since: datetime | None = None,
    limit: int,
) -> list[tuple[str, str]]:
    """Up to ``limit`` claimable todos of the endpoint (of ``queue`` only, if given; changed
    after ``since``, if given) that every gate admits now, per todo: a pool, tag or rate limit
    a todo names, besides its identity's pause and budget. (id, queue), oldest first, among the
    oldest 50 claimable. A failing gate check lets the todo through (fail open). On the caller's
    connection, in its transaction."""
    with connection.cursor() as cursor:
        cursor.execute(
            WAITING_SQL.format(probes=gates.probes("t")),
            {"e": endpoint_id, "q": queue, "since": since},
        )
        rows = cursor.fetchall()
    found: list[tuple[str, str]] = []
    admits: dict[tuple[Any, ...], bool] = {}
    for todo_id, todo_queue, *keys in rows:
        # A probe may give an array (a todo's tags): as a dict key, a tuple.
        key = tuple(tuple(k) if isinstance(k, list) else k for k in keys)
        if key not in admits:
            try:
                admits[key] = gates.admits_now(tuple(keys))
            except Exception:
                log.exception("gate check failed for %s; ringing anyway", endpoint_id)
                admits[key] = True
        if admits[key]:
            found.append((todo_id, todo_queue))
            if len(found) == limit:
                break
    return found
