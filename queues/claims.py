"""The claim statements, in raw SQL because the claim is the hot path.

One predicate decides what is claimable on all three claim paths (claim_next, claim of one todo,
the board's claim): pending with attempts left, a claimed todo whose lease lapsed with attempts
left (a takeover), or a failed todo whose retry is due with attempts left; never the quarantine
queue; never a paused queue name, checked inside the statement that locks the row.

The candidate statement also probes for an admission policy on the candidate's queue identity and
claims at once when there is none, so a queue without a policy costs exactly one statement: the
same one it would cost if admission did not exist, with the probe folded into it (one lookup on
the policy table's unique (endpoint_id, queue) index).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.backends.utils import CursorWrapper

from queues.models import Todo

_TODO_FIELDS = list(Todo._meta.concrete_fields)
# Every column of a todo, in model order, so a claim returns the whole row in one statement.
TODO_COLUMNS = ", ".join(f"t.{f.column}" for f in _TODO_FIELDS)
CLAIMED_COLUMNS = ", ".join(f"cl.{f.column}" for f in _TODO_FIELDS)

# The state arms of "claimable": pending, a lapsed lease (a takeover) or a due retry, each with
# attempts left.
CLAIMABLE_STATE = """
    (
        (t.state = 'pending' AND t.attempt < t.max_attempts)
        OR (t.state = 'claimed' AND t.lease_expires_at <= now() AND t.attempt < t.max_attempts)
        OR (t.state = 'failed' AND t.next_retry_at <= now() AND t.attempt < t.max_attempts)
    )
"""

# The queues a claim_next may draw from, computed inside the claiming statement (an InitPlan over
# the same snapshot): granted, not excluded by a refusal, not quarantine, not paused. Written as
# one array so the planner keeps its row estimate and walks todo_claimable_idx in order; as an
# anti-join per row it misjudges the pause table and sorts the whole backlog instead.
OPEN_QUEUES = """
    ARRAY(
        SELECT g FROM unnest(%(queues)s::text[]) g
        WHERE g <> 'quarantine' AND g <> ALL (%(excluded)s::text[])
          AND NOT EXISTS (SELECT 1 FROM queues_queuepause qp WHERE qp.queue = g)
    )
"""

# The claim itself, applied to a row this transaction already holds locked. It also closes the
# lapsed attempt a takeover replaces and writes the new Attempt row, in the same statement.
_CLAIM_CTES = """
claimed AS (
    UPDATE queues_todo t
    SET state = 'claimed',
        attempt = t.attempt + 1,
        owner = %(claimant)s,
        claimed_at = clock_timestamp(),
        lease_expires_at = clock_timestamp() + make_interval(secs => %(ttl)s),
        next_retry_at = NULL,
        updated_at = clock_timestamp()
    FROM cand c
    WHERE t.id = c.id {admit}
    RETURNING {TODO_COLUMNS}, c.prev_state, c.prev_attempt
),
superseded AS (
    UPDATE queues_attempt a
    SET ended_at = cl.claimed_at, outcome = 'superseded', disposition = 'requeued'
    FROM claimed cl
    WHERE cl.prev_state = 'claimed' AND a.todo_id = cl.id AND a.number = cl.prev_attempt
      AND a.ended_at IS NULL
    RETURNING a.id
),
attempt_row AS (
    INSERT INTO queues_attempt (todo_id, number, endpoint_id, claimant, via, claimed_at,
                                lease_expires_at, lease_token_hash, summary)
    SELECT cl.id, cl.attempt, cl.endpoint_id, %(claimant)s, %(via)s, cl.claimed_at,
           cl.lease_expires_at, %(fence_hash)s, ''
    FROM claimed cl
    -- An InitPlan: closes the superseded attempt before this insert, so the one-open-attempt
    -- unique index never sees two open attempts of a taken-over todo.
    WHERE (SELECT count(*) FROM superseded) >= 0
    RETURNING todo_id
)
"""

# claim_next: the oldest claimable todo of the endpoint's granted queues, skipping rows other
# claimers hold (uses todo_pending_idx for the pending arm). Claims at once when the candidate's
# queue identity has no admission policy; otherwise returns the candidate (locked) and the
# policy id, and the caller runs admission.
CLAIM_NEXT_SQL = f"""
WITH cand AS (
    SELECT t.id, t.state AS prev_state, t.attempt AS prev_attempt, t.endpoint_id, t.queue
    FROM queues_todo t
    WHERE t.endpoint_id = %(endpoint)s
      AND t.queue = ANY({OPEN_QUEUES})
      -- todo_claimable_idx's predicate, stated so the planner can use it.
      AND (t.state IN ('pending', 'claimed') OR (t.state = 'failed' AND t.next_retry_at IS NOT NULL))
      AND {CLAIMABLE_STATE}
    ORDER BY t.created_at, t.id
    LIMIT 1
    FOR UPDATE OF t SKIP LOCKED
),
pol AS (
    SELECT p.id FROM admission_admissionpolicy p, cand c
    WHERE p.endpoint_id = c.endpoint_id AND p.queue = c.queue
),
{_CLAIM_CTES.format(admit="AND NOT EXISTS (SELECT 1 FROM pol)", TODO_COLUMNS=TODO_COLUMNS)}
SELECT c.id, c.queue, (SELECT id FROM pol) AS policy_id, cl.id IS NOT NULL, {CLAIMED_COLUMNS}
FROM cand c LEFT JOIN claimed cl ON cl.id = c.id
"""

# claim of one todo: lock it (waiting for any other holder), and report what it is, whether its
# queue is paused and whether it has a policy. The caller decides and then runs CLAIM_ONE_SQL.
LOCK_ONE_SQL = f"""
SELECT t.id, t.queue, t.state, t.attempt, t.max_attempts, t.endpoint_id,
       (t.queue <> 'quarantine' AND {CLAIMABLE_STATE}) AS claimable,
       EXISTS (SELECT 1 FROM queues_queuepause qp WHERE qp.queue = t.queue) AS paused,
       (SELECT p.id FROM admission_admissionpolicy p
        WHERE p.endpoint_id = t.endpoint_id AND p.queue = t.queue) AS policy_id
FROM queues_todo t
WHERE t.id = %(todo)s AND t.endpoint_id = ANY(%(endpoints)s)
FOR UPDATE OF t
"""

# The claim of a row this transaction holds locked and has admitted.
CLAIM_ONE_SQL = f"""
WITH cand AS (
    SELECT t.id, t.state AS prev_state, t.attempt AS prev_attempt
    FROM queues_todo t WHERE t.id = %(todo)s
),
{_CLAIM_CTES.format(admit="", TODO_COLUMNS=TODO_COLUMNS)}
SELECT cl.id, cl.queue, NULL::uuid AS policy_id, true, {CLAIMED_COLUMNS}
FROM claimed cl
"""


@contextmanager
def hot_cursor() -> Iterator[CursorWrapper]:
    """A cursor for the hot statements: server-side binding, so psycopg prepares a statement it
    has run a few times on this connection and PostgreSQL stops re-planning it. Wrapped in
    Django's CursorWrapper so errors, execute wrappers and query counts behave as usual."""
    db = connections[DEFAULT_DB_ALIAS]
    db.ensure_connection()
    # Binary results: timestamps and uuids load without parsing text.
    raw = psycopg.Cursor(db.connection)
    raw.format = psycopg.pq.Format.BINARY
    try:
        yield CursorWrapper(raw, db)
    finally:
        raw.close()


# Endpoints whose last claim_next met a policy skip the autocommit fast path for a while, so
# a budgeted queue does not pay for a probe it will discard. Only a performance hint: the
# statement itself always probes for a policy.
_BUDGETED_HINT_SECONDS = 10.0
_budgeted_until: dict[UUID, float] = {}


def recently_budgeted(endpoint_id: UUID) -> bool:
    return _budgeted_until.get(endpoint_id, 0.0) > time.monotonic()


def mark_budgeted(endpoint_id: UUID) -> None:
    _budgeted_until[endpoint_id] = time.monotonic() + _BUDGETED_HINT_SECONDS


@dataclass(frozen=True)
class Candidate:
    """What a claim statement found: the claimed todo, or a locked candidate awaiting admission."""

    todo_id: UUID
    queue: str
    policy_id: UUID | None
    todo: Todo | None  # set when the statement claimed it

    @property
    def claimed(self) -> bool:
        return self.todo is not None


_TODO_ATTNAMES = [f.attname for f in _TODO_FIELDS]
# Fields whose database value needs Django's converter: JSON arrives as text from Django's own
# cursors and already decoded from a binary hot cursor.
_CONVERTED = [i for i, f in enumerate(_TODO_FIELDS) if hasattr(f, "from_db_value")]


def todo_from_row(values: tuple[Any, ...] | list[Any]) -> Todo:
    """A Todo from a raw row in TODO_COLUMNS order, with the fields' database converters applied."""
    converted = list(values)
    if len(converted) != len(_TODO_FIELDS):
        raise ValueError(f"expected {len(_TODO_FIELDS)} todo columns, got {len(converted)}")
    for i in _CONVERTED:
        value = converted[i]
        if isinstance(value, str | bytes | bytearray):
            converted[i] = _TODO_FIELDS[i].from_db_value(value, None, connection)  # type: ignore[attr-defined]
    return Todo.from_db(DEFAULT_DB_ALIAS, _TODO_ATTNAMES, converted)


def _candidate(row: tuple[Any, ...] | None) -> Candidate | None:
    if row is None:
        return None
    todo_id, queue, policy_id, claimed, *columns = row
    return Candidate(todo_id, queue, policy_id, todo_from_row(columns) if claimed else None)


def claim_next_candidate(
    cursor: CursorWrapper,
    *,
    endpoint_id: UUID,
    queues: list[str],
    excluded: list[str],
    claimant: str,
    via: str,
    ttl: int,
    fence_hash: str | None,
) -> Candidate | None:
    cursor.execute(
        CLAIM_NEXT_SQL,
        {
            "endpoint": endpoint_id,
            "queues": queues,
            "excluded": excluded,
            "claimant": claimant,
            "via": via,
            "ttl": ttl,
            "fence_hash": fence_hash,
        },
    )
    return _candidate(cursor.fetchone())


@dataclass(frozen=True)
class LockedTodo:
    id: UUID
    queue: str
    state: str
    attempt: int
    max_attempts: int
    endpoint_id: UUID
    claimable: bool
    paused: bool
    policy_id: UUID | None


def lock_one(
    cursor: CursorWrapper, *, todo_id: UUID, endpoint_ids: list[UUID]
) -> LockedTodo | None:
    cursor.execute(LOCK_ONE_SQL, {"todo": todo_id, "endpoints": endpoint_ids})
    row = cursor.fetchone()
    return LockedTodo(*row) if row else None


def claim_locked(
    cursor: CursorWrapper,
    *,
    todo_id: UUID,
    claimant: str,
    via: str,
    ttl: int,
    fence_hash: str | None,
) -> Candidate:
    cursor.execute(
        CLAIM_ONE_SQL,
        {"todo": todo_id, "claimant": claimant, "via": via, "ttl": ttl, "fence_hash": fence_hash},
    )
    candidate = _candidate(cursor.fetchone())
    assert candidate is not None, "the claimed row was locked by this transaction"
    return candidate
