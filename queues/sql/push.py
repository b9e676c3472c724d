"""The push path's statements on the todo tables: the doorbell's attach read, its sweeps
(reminders for work nobody took, stalls told to the holder), the todo a sweep's ring names and
the wakes' gate lookups over a queue identity. The gates' probes are folded in by the caller
(``queues.gates``).
"""

from __future__ import annotations

from queues.claimable import CLAIMABLE

WAITING_SQL = f"""
SELECT t.id::text, t.queue {{probes}}
FROM queues_todo t
WHERE t.endpoint_id = %(e)s AND {CLAIMABLE}
  AND (%(q)s::text IS NULL OR t.queue = %(q)s::text)
  AND (%(since)s::timestamptz IS NULL OR t.updated_at > %(since)s::timestamptz)
ORDER BY t.created_at, t.id
LIMIT 50
"""

# How many reminders a todo has had since it last changed, and whether the next one is due.
_RUNG = "(CASE WHEN t.rung_since IS DISTINCT FROM t.updated_at THEN 0 ELSE t.rings END)"
_DUE = f"""
    t.state = 'pending' AND {_RUNG} < %(steps)s
    AND now() >= t.updated_at + make_interval(secs => (%(after)s::int[])[{_RUNG} + 1])
"""
# The candidates are chosen without locks: each active endpoint's oldest due todos, at most
# PER_ENDPOINT of them (a LATERAL probe of the endpoint's pending todos, todo_pending_idx), then
# the oldest ``batch`` of those. The cap per endpoint comes first, so one endpoint's backlog
# cannot fill the batch and leave the others unreminded. Only the candidates are locked, SKIP
# LOCKED, and the due test is applied again to the locked row, so a claim meanwhile skips only
# the rows about to ring and a sweep that raced another rings nothing twice.
DUE_SQL = f"""
WITH due AS (
    SELECT d.id, d.created_at
    FROM queues_endpoint e
    CROSS JOIN LATERAL (
        SELECT t.id, t.created_at FROM queues_todo t
        WHERE t.endpoint_id = e.id AND {CLAIMABLE} AND {_DUE}
        ORDER BY t.created_at, t.id
        LIMIT %(per_endpoint)s
    ) d
    WHERE e.state = 'active'
    ORDER BY d.created_at, d.id
    LIMIT %(batch)s
)
SELECT t.id, t.endpoint_id, t.queue, {_RUNG}
FROM queues_todo t JOIN due ON due.id = t.id
WHERE {_DUE}
ORDER BY t.created_at, t.id
FOR UPDATE OF t SKIP LOCKED
"""

RUNG_SQL = """
UPDATE queues_todo SET rings = %(rung)s + 1, rung_since = updated_at WHERE id = %(id)s
"""

STALLED_SQL = """
WITH stalled AS (
    SELECT t.id FROM queues_todo t
    WHERE t.state = 'claimed' AND t.lease_expires_at > now()
      AND now() >= t.updated_at + (t.lease_expires_at - t.updated_at) / 2
      AND (t.stall_rung_at IS NULL OR t.stall_rung_at < t.updated_at)
    ORDER BY t.lease_expires_at
    LIMIT %(batch)s
    FOR UPDATE OF t SKIP LOCKED
)
UPDATE queues_todo t SET stall_rung_at = now()
FROM stalled s WHERE t.id = s.id
RETURNING t.id, t.endpoint_id, t.queue
"""

# The todo a sweep's ring names for each queue identity it returned work to (``%(e)s``,
# ``%(q)s``: parallel arrays): of the identity's pending todos, the oldest that the sweep's own
# transaction made pending (the reaper and the retry sweep set ``updated_at = now()``, the
# transaction's start), which a claim would take first. Walks todo_pending_idx in created_at
# order, and work a sweep frees is mostly old.
FREED_SQL = """
SELECT k.e, k.q, f.id
FROM unnest(%(e)s::uuid[], %(q)s::text[]) AS k(e, q)
CROSS JOIN LATERAL (
    SELECT t.id FROM queues_todo t
    WHERE t.endpoint_id = k.e AND t.queue = k.q AND t.state = 'pending' AND t.updated_at = now()
    ORDER BY t.created_at, t.id
    LIMIT 1
) f
"""

# A queue identity as a todo-shaped row, every other column NULL: a gate's probe may name any todo
# column (admission.limits' per-todo gates read pool and tags, and so say nothing here).
IDENTITY_ROW = (
    "jsonb_populate_record(NULL::queues_todo, "
    "jsonb_build_object('endpoint_id', %(e)s::uuid, 'queue', %(q)s::text))"
)


def identity_lookup_sql(probes: str) -> str:
    """Whether the queue is paused, the endpoint's hook URL, the identity's oldest pending todo,
    then ``probes`` (the gates' probes over ``i``), for the identity ``%(e)s``, ``%(q)s``."""
    return f"""
        SELECT EXISTS (SELECT 1 FROM queues_queuepause WHERE queue = %(q)s),
               (SELECT notify_url FROM queues_endpoint WHERE id = %(e)s),
               (SELECT id FROM queues_todo WHERE endpoint_id = %(e)s AND queue = %(q)s
                  AND state = 'pending' ORDER BY created_at, id LIMIT 1)
               {probes}
        FROM {IDENTITY_ROW} i
        """
