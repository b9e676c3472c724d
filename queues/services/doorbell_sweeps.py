"""The doorbell's sweeps, on beat: reminders for work nobody took, and stalls told to the holder.

A ring is a hint: an agent that was down, or whose stream dropped the ring, misses it. The
**heartbeat** re-rings a pending, claimable todo that has waited ``REMINDER_AFTER[n]`` since it
last changed (5 min, 20 min, 1 h, 6 h), so with the first ring a todo rings at most five times;
at most ``PER_ENDPOINT`` reminders per endpoint per sweep (the oldest todos first), so a backlog
does not flood a fleet, and ``BATCH`` in all, taken after the cap per endpoint, so one endpoint's
backlog never crowds the others out of a sweep. It skips paused queues (the claimable rule) and queue identities a gate
defers now (the same gate every ring passes, failing open).

The **stall sweep** rings the holder's stream with reason ``stalled`` when a claimed todo had no
heartbeat for half its lease (its ``updated_at``, set by the claim and by each heartbeat, is
older than half the way to ``lease_expires_at``): once per quiet spell, so the agent can
heartbeat or release before the reaper takes the claim back.

Both lock the rows they ring (``SKIP LOCKED``) and record the ring in the same transaction as the
NOTIFY, so two sweeps at once never ring one todo twice.
"""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction

from queues import ring_gate, wakes
from queues.sql.push import DUE_SQL, RUNG_SQL, STALLED_SQL

# Seconds after a todo last changed at which the heartbeat reminds (one reminder per step).
REMINDER_AFTER = (300, 1200, 3600, 21600)
PER_ENDPOINT = 3
BATCH = 500


def remind_waiting() -> int:
    """One heartbeat sweep; returns how many reminders rang."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            DUE_SQL,
            {
                "steps": len(REMINDER_AFTER),
                "after": list(REMINDER_AFTER),
                "batch": BATCH,
                "per_endpoint": PER_ENDPOINT,
            },
        )
        rows = cursor.fetchall()
        gate: dict[tuple[Any, str], tuple[bool, str]] = {}
        rang = 0
        for todo_id, endpoint_id, queue, rung in rows:
            key = (endpoint_id, queue)
            if key not in gate:
                may_ring, url, _ = ring_gate.check(endpoint_id, queue)
                gate[key] = (may_ring, url)
            may_ring, url = gate[key]
            if not may_ring:  # deferred now: the reminder waits for a later sweep
                continue
            cursor.execute(RUNG_SQL, {"id": todo_id, "rung": rung})
            wakes.ring(endpoint_id, queue, "waiting", todo_id, hook=bool(url))
            rang += 1
        return rang


def ring_stalled() -> int:
    """One stall sweep; returns how many holders were told."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(STALLED_SQL, {"batch": BATCH})
        rows = cursor.fetchall()
        if not rows:
            return 0
        cursor.execute(
            "SELECT id, notify_url <> '' FROM queues_endpoint WHERE id = ANY(%s)",
            [list({endpoint_id for _, endpoint_id, _ in rows})],
        )
        hooked = dict(cursor.fetchall())
        for todo_id, endpoint_id, queue in rows:
            wakes.ring(endpoint_id, queue, "stalled", todo_id, hook=hooked.get(endpoint_id, False))
        return len(rows)
