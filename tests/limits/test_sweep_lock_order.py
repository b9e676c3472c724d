"""The sweeps ring after their commit, holding no grant chain while a ring's gate waits.

Lock order (``queues.pauses``): the pause table, then a ledger chain. A claim naming a limit
reads the pause table in its statement and then takes a grant chain for its ``limits.grant``
row; a pause waits (ACCESS EXCLUSIVE) for every claim that read the table. The reaper's statement
takes a grant chain for its ``limits.end`` rows, and its rings' gate reads the pause table. Rung
in the reaper's transaction, a reaper queued behind a pause held its grant chain meanwhile, so
a claim the pause waited for could wait for that chain: a cycle PostgreSQL only untangles after
its deadlock timeout, by reordering the pause table's queue. Rung after the commit, the sweep
waits for the pause holding nothing, and what it swept is already committed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from queues import services
from queues.models import TodoState
from queues.services import sweeps
from tests.conftest import (
    Personas,
    database_url,
    in_thread,
    lapse,
    make_retry_due,
    patient,
    until_a_lock_waits,
)
from tests.limits.conftest import pool, push_named


def _waiting_on_the_pause_table(
    watcher: psycopg.Connection[Any], todo_id: Any
) -> list[tuple[int, int, str]]:
    """Per session waiting for the pause table: its pid, the advisory locks it holds, and the
    state of the todo ``todo_id`` as committed."""
    return watcher.execute(
        """
        SELECT w.pid,
               (SELECT count(*) FROM pg_locks a
                WHERE a.pid = w.pid AND a.locktype = 'advisory' AND a.granted),
               (SELECT state FROM queues_todo WHERE id = %s)
        FROM pg_locks w
        WHERE w.locktype = 'relation' AND NOT w.granted
          AND w.relation = 'queues_queuepause'::regclass
        """,
        [todo_id],
    ).fetchall()


def _swept_behind_a_pause(sweep: Callable[[], int], todo_id: Any) -> tuple[int, str]:
    """Run ``sweep`` while a pause holds the pause table part-way (locked, its row and ledger
    append next) until the sweep waits for it; then the advisory locks the waiting session
    holds and the todo's committed state at that moment. The pause then gives up and the sweep
    must have swept one todo."""
    with (
        psycopg.connect(database_url()) as pause,
        psycopg.connect(database_url(), autocommit=True) as watcher,
    ):
        pause.execute("LOCK TABLE queues_queuepause IN ACCESS EXCLUSIVE MODE")
        thread, swept = in_thread(patient(sweep))
        until_a_lock_waits(f"{sweep.__name__}'s ring")
        (waiter,) = _waiting_on_the_pause_table(watcher, todo_id)
        pause.rollback()
        assert swept.result(timeout=30) == 1
        thread.join(timeout=30)
    _, advisory_locks, state = waiter
    return advisory_locks, state


def test_the_reaper_waits_for_a_pause_holding_no_grant_chain(tx_personas: Personas) -> None:
    p = tx_personas
    pool("gpu", slots=1)
    (todo,) = push_named(p, 1, pool="gpu")
    services.claim(actor=p.as_agent(), todo_id=todo.id)
    lapse(todo)
    advisory_locks, state = _swept_behind_a_pause(sweeps.reap_expired, todo.id)
    assert advisory_locks == 0, "the reaper waits for the pause holding a grant chain"
    assert state == TodoState.PENDING, "the lapsed claim is not swept until the pause ends"
    todo.refresh_from_db()
    assert todo.state == TodoState.PENDING and todo.attempt == 1


def test_the_retry_sweep_rings_after_its_commit(tx_personas: Personas) -> None:
    """Its statement takes no grant chain today; its ring waits outside its transaction all the
    same, so nothing it might hold one day waits behind a pause."""
    p = tx_personas
    (todo,) = push_named(p, 1, max_attempts=3)
    claimed = services.claim(actor=p.as_agent(), todo_id=todo.id)
    services.fail(actor=p.as_agent(), todo_id=todo.id, error="boom", attempt=claimed.attempt)
    make_retry_due(todo)
    _, state = _swept_behind_a_pause(sweeps.requeue_due_retries, todo.id)
    assert state == TodoState.PENDING, "the retry is not committed until the pause ends"
