"""The todo-table statements other apps compose or run: the claim gates' occupancy counts, skips
and reopens, the "is there claimable work" questions admission's reopen asks, and the named
limits' quarantine and status count.

A gate owns its own tables (a pool's slots, a budget's policy) and this module owns the todo
tables, so a gate's statement is the gate's SQL around fragments from here: an expression over
an alias the caller names, or a whole statement run on the caller's cursor. Nothing here knows a
gate's tables. Imported by ``admission`` as the one door into ``queues.sql`` (see the import
contract in pyproject.toml).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.db.backends.utils import CursorWrapper

from queues.claimable import CLAIMABLE, CLAIMABLE_STATE, LAPSED_CLAIM_SET
from queues.sql.attempts import ENDED_CLAIM, ended_attempt


def _claimed(match: str, excluding: str | None) -> str:
    skip = f" AND o.id IS DISTINCT FROM {excluding}" if excluding else ""
    return f"(SELECT count(*) FROM queues_todo o WHERE o.state = 'claimed' AND {match}{skip})"


def claimed_in_identity(endpoint_id: str, queue: str, *, excluding: str | None = None) -> str:
    """How many claimed todos the queue identity (``endpoint_id``, ``queue``: SQL) holds, leaving
    out the todo whose id is ``excluding`` (SQL) if given (todo_claimed_idx)."""
    return _claimed(f"o.endpoint_id = {endpoint_id} AND o.queue = {queue}", excluding)


# The lease expiry of a queue identity's claims with OFFSET earlier ones before it, leaving out a
# takeover's own todo (todo_claimed_idx).
_LEASE_AT_SQL = (
    "SELECT t.lease_expires_at FROM queues_todo t "
    "WHERE t.endpoint_id = %s AND t.queue = %s AND t.state = 'claimed' "
    "AND t.id IS DISTINCT FROM %s "
    "ORDER BY t.lease_expires_at OFFSET %s LIMIT 1"
)


def lease_at(
    cursor: CursorWrapper, endpoint_id: UUID, queue: str, offset: int, exclude: UUID | None
) -> Any:
    """The lease expiry of the identity's claims with ``offset`` earlier ones before it (None
    when there are not so many), leaving out the todo ``exclude``."""
    cursor.execute(_LEASE_AT_SQL, [endpoint_id, queue, exclude, offset])
    row = cursor.fetchone()
    return row[0] if row else None


def claimed_in_pool(name: str, *, excluding: str | None = None) -> str:
    """How many claimed todos name the pool ``name`` (SQL), leaving out the todo whose id is
    ``excluding`` (SQL) if given."""
    return _claimed(f"o.pool = {name}", excluding)


def claimed_with_tag(tag: str, *, excluding: str | None = None) -> str:
    """How many claimed todos carry the tag ``tag`` (SQL), leaving out ``excluding``'s todo."""
    # `o.tags <> '{}'` states todo_live_tags_idx's predicate, so the planner can use it.
    return _claimed(f"o.tags <> '{{}}' AND o.tags @> ARRAY[{tag}]", excluding)


def claimable_in(endpoint: str, queue: str) -> str:
    """Whether the queue identity (``endpoint``, ``queue``: SQL) has work a claim could take."""
    return (
        f"EXISTS (SELECT 1 FROM queues_todo t"
        f" WHERE t.endpoint_id = {endpoint} AND t.queue = {queue} AND {CLAIMABLE})"
    )


def todo_queue(cursor: CursorWrapper, todo_id: UUID) -> str:
    cursor.execute("SELECT queue FROM queues_todo WHERE id = %s", [todo_id])
    (queue,) = cursor.fetchone()
    return str(queue)


# Both name their index's predicate (todo_live_pool_idx: ``pool = ...`` is not NULL;
# todo_live_tags_idx: ``tags <> '{}'``), so a big backlog never makes them read every claim.
_CLAIMED_BY_POOL = """
    SELECT t.pool, count(*), min(t.lease_expires_at) FROM queues_todo t
    WHERE t.state = 'claimed' AND t.pool = ANY(%s) AND t.id IS DISTINCT FROM %s
    GROUP BY t.pool
"""
_CLAIMED_BY_TAG = """
    SELECT g.tag, count(*), min(t.lease_expires_at)
    FROM queues_todo t CROSS JOIN LATERAL unnest(t.tags) AS g(tag)
    WHERE t.state = 'claimed' AND t.tags <> '{}' AND t.tags && %s::varchar[]
      AND t.id IS DISTINCT FROM %s AND g.tag = ANY(%s::varchar[])
    GROUP BY g.tag
"""


def claimed_by_pool(
    cursor: CursorWrapper, names: list[str], excluding: UUID | None
) -> dict[str, tuple[int, Any]]:
    """Per pool among ``names``: the claimed todos naming it (leaving out ``excluding``) and
    their earliest lease expiry."""
    cursor.execute(_CLAIMED_BY_POOL, [names, excluding])
    return {row[0]: (row[1], row[2]) for row in cursor.fetchall()}


def claimed_by_tag(
    cursor: CursorWrapper, names: list[str], excluding: UUID | None
) -> dict[str, tuple[int, Any]]:
    """``claimed_by_pool`` for tags."""
    cursor.execute(_CLAIMED_BY_TAG, [names, excluding, names])
    return {row[0]: (row[1], row[2]) for row in cursor.fetchall()}


def claimable_groups(
    cursor: CursorWrapper, endpoint_id: UUID, queues: list[str], *, key: str, where: str
) -> list[tuple[str, Any, int]]:
    """(queue, key, count) of the endpoint's claimable todos in ``queues`` for which ``where``
    holds, grouped by ``key`` (both SQL over the todo row ``t``)."""
    cursor.execute(
        f"""
        SELECT t.queue, {key}, count(*) FROM queues_todo t
        WHERE t.endpoint_id = %s AND t.queue = ANY(%s) AND {CLAIMABLE}
          AND {where}
        GROUP BY 1, 2
        """,
        [endpoint_id, queues],
    )
    return cursor.fetchall()


def claimable_counts(cursor: CursorWrapper, endpoint_id: UUID, queues: list[str]) -> dict[str, int]:
    """How many of the endpoint's todos in each of ``queues`` a claim could take but for its
    gates and pauses: pending, a lapsed lease (a takeover) or a due retry, each with attempts
    left (the claimable rule's state arms; never quarantine). What a deferral says it holds
    back (its ``pending``); a queue with none is absent."""
    cursor.execute(
        f"""
        SELECT t.queue, count(*)::integer FROM queues_todo t
        WHERE t.endpoint_id = %s AND t.queue = ANY(%s) AND t.queue <> 'quarantine'
          AND {CLAIMABLE_STATE}
        GROUP BY 1
        """,
        [endpoint_id, queues],
    )
    return dict(cursor.fetchall())


def pending_identities(
    cursor: CursorWrapper, *, where: str, params: dict[str, Any]
) -> list[tuple[UUID, str]]:
    """The queue identities with claimable pending todos for which ``where`` (SQL over ``t``,
    with named ``params``) holds, in (endpoint, queue) order."""
    cursor.execute(
        f"""
        SELECT DISTINCT t.endpoint_id, t.queue FROM queues_todo t
        WHERE t.state = 'pending' AND {where} AND {CLAIMABLE}
        ORDER BY 1, 2
        """,
        params,
    )
    return cursor.fetchall()


# --- quarantine of a named limit (admission.limits.services.limit_quarantine) ------------------

# The todos naming a pool or a tag, as SQL over a todo row ``t`` (the limit's name is ``%(n)s``).
NAMING = {
    "pool": "t.pool = %(n)s",
    "tag": "t.tags <> '{}' AND t.tags @> ARRAY[%(n)s]::varchar[]",
}


# The grants open now (``limits status``'s grants held): the claims holding one, which are what
# the ledger's replay holds open (a claim naming only limits that are off holds none).
GRANTS_HELD_SQL = """
SELECT count(*) FROM queues_todo t WHERE t.state = 'claimed' AND t.grant_hash IS NOT NULL
"""


def quarantine_lock_sql(kind: str, *, lock: bool = True) -> str:
    """The claims naming the limit, locked before the limit's lock: a claimer locks its todo
    before the gate's lock, so the quarantine takes the todos it will expire first (the
    same order) and never waits on a takeover that waits on it. ``lock=False``: the same ids,
    read without locks (the check, under the limit's lock, that no claim landed between)."""
    return f"""
SELECT t.id FROM queues_todo t WHERE t.state = 'claimed' AND {NAMING[kind]}
ORDER BY t.id{" FOR UPDATE OF t" if lock else ""}
"""


# Claims that landed while a quarantine took the limit's lock, locked without waiting (the rows
# another transaction holds are left out: the caller starts again).
QUARANTINE_LOCK_LANDED_SQL = """
SELECT t.id FROM queues_todo t WHERE t.id = ANY(%(ids)s::uuid[])
ORDER BY t.id FOR UPDATE OF t SKIP LOCKED
"""


def quarantine_queued_sql(kind: str) -> str:
    """The live, unclaimed todos naming the limit (pending, or failed with a retry due)."""
    return f"""
SELECT t.id::text FROM queues_todo t
WHERE {NAMING[kind]}
  AND (t.state = 'pending' OR (t.state = 'failed' AND t.next_retry_at IS NOT NULL))
ORDER BY t.id
"""


# A claim a quarantine expired: its attempt, as the reaper's, its error naming the quarantine
# (the holder's later complete or heartbeat is told so: ``queues.services.todos``).
def _expired_attempts(kind: str) -> str:
    return ended_attempt(
        "expired",
        ended_at="clock_timestamp()",
        outcome="'expired'",
        disposition="CASE WHEN h.state = 'pending' THEN 'requeued' ELSE 'dead_lettered' END",
        error=f"jsonb_build_object('error', 'quarantined', 'kind', '{kind}', 'name', %(n)s::text)",
    )


def quarantine_expire_sql(kind: str) -> str:
    """Every claim naming the limit expired at once, as the reaper would at its lapse: back to
    pending (dead-lettered at the cap), the attempt closed as expired, so the holder's complete,
    heartbeat or fail no longer holds the claim (a conflict), and its grant ends (the manifest
    names it). Answers one row per claim."""
    return f"""
WITH expired AS (
    UPDATE queues_todo t
    SET {LAPSED_CLAIM_SET}
    FROM (SELECT id, owner, grant_hash FROM queues_todo t
          WHERE t.state = 'claimed' AND {NAMING[kind]}) h
    WHERE t.id = h.id
    RETURNING t.id, h.owner, t.endpoint_id, t.queue, t.attempt, t.state, h.grant_hash,
              {ENDED_CLAIM}
), closed AS (
    -- The clock, not the transaction's start: claims committed while this waited for the
    -- limit's lock started after now(), and the occupancy history reads these instants.
    {_expired_attempts(kind)}
)
SELECT id::text, owner, endpoint_id::text, queue, attempt, state, grant_hash
FROM expired ORDER BY id
"""
