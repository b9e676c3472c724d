"""Whether a ring for a queue identity may ring now: not for a paused queue, nor for an identity a
claim gate defers. The wakes, the doorbell's reminders and the ready hook each ask. It fails open:
a failed check costs one wasted wake, while failing closed could strand a live queue.
"""

from __future__ import annotations

import logging
from uuid import UUID

from django.db import connection, transaction

from queues import gates
from queues.sql.push import identity_lookup_sql

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
