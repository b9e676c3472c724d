"""At most one open attempt per todo, enforced by the database: the trigger attempt_one_open
(queues migration 0015), which replaced the partial unique index of that name so that an
attempt's end update is a HOT update. Raced over real connections: the trigger's lock is what
makes two writers of one todo see each other."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
from django.db import IntegrityError, connection, transaction

from queues import services
from queues.models import Attempt
from tests.conftest import Personas, database_url, push

OPEN_ATTEMPT = """
INSERT INTO queues_attempt (todo_id, number, endpoint_id, claimant, via, claimed_at,
                            lease_expires_at, summary)
VALUES (%s, %s, %s, %s, 'api', now(), now() + interval '5 minutes', '')
RETURNING id
"""


def _waiting_on_advisory_lock(observer: psycopg.Connection[Any]) -> bool:
    for _ in range(600):
        row = observer.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        ).fetchone()
        if row and row[0]:
            return True
        time.sleep(0.05)
    return False


def test_two_connections_opening_an_attempt_of_one_todo_at_once_make_one(
    tx_personas: Personas,
) -> None:
    """The first connection inserts an open attempt and holds its transaction open; the second's
    insert waits for it, then sees the committed attempt and is refused. Without the trigger's
    lock the second would read before the first committed and both attempts would stay open."""
    p = tx_personas
    (todo,) = push(p, 1)
    first = psycopg.connect(database_url(), autocommit=False)
    second = psycopg.connect(database_url(), autocommit=False)
    observer = psycopg.connect(database_url(), autocommit=True)
    outcome: list[BaseException | None] = []

    def insert_second() -> None:
        try:
            second.execute(OPEN_ATTEMPT, [todo.id, 1, p.agent.id, "second"])
            second.commit()
            outcome.append(None)
        except BaseException as exc:  # asserted below, in the test's thread
            second.rollback()
            outcome.append(exc)

    try:
        first.execute(OPEN_ATTEMPT, [todo.id, 1, p.agent.id, "first"])
        racer = threading.Thread(target=insert_second)
        racer.start()
        assert _waiting_on_advisory_lock(observer), "the second insert never waited"
        first.commit()
        racer.join(timeout=60)
    finally:
        for conn in (first, second, observer):
            conn.close()
    (error,) = outcome
    assert isinstance(error, psycopg.errors.UniqueViolation), error
    assert error.diag.constraint_name == "attempt_one_open"
    assert list(Attempt.objects.filter(todo=todo).values_list("claimant", flat=True)) == ["first"]


def test_an_attempt_reopened_or_moved_beside_an_open_one_is_refused(personas: Personas) -> None:
    p = personas
    first, second = push(p, 2)
    services.claim(actor=p.as_agent(), todo_id=first.id, claimant="holder")
    services.claim(actor=p.as_agent(), todo_id=second.id, claimant="other")
    services.complete(actor=p.as_agent(), todo_id=second.id)
    ended = Attempt.objects.get(todo=second)
    # Reopened beside the open attempt of `first`, after moving to `first`: refused.
    with pytest.raises(IntegrityError, match="attempt_one_open"), transaction.atomic():
        Attempt.objects.filter(pk=ended.pk).update(todo=first, ended_at=None, outcome=None)
    # An open attempt of a todo moved onto another todo's open attempt: refused.
    (third,) = push(p, 1)
    services.claim(actor=p.as_agent(), todo_id=third.id, claimant="third")
    with pytest.raises(IntegrityError, match="attempt_one_open"), transaction.atomic():
        Attempt.objects.filter(todo=third).update(todo=first)
    # Reopened with no other open attempt of its todo: allowed (the rule is about two).
    with transaction.atomic():
        Attempt.objects.filter(pk=ended.pk).update(ended_at=None, outcome=None)
    assert Attempt.objects.filter(todo=second, ended_at__isnull=True).count() == 1


def test_an_open_attempt_is_not_written_under_repeatable_read(personas: Personas) -> None:
    """Under REPEATABLE READ the trigger's read could miss another connection's committed open
    attempt, so it refuses to decide there; an ended attempt (history) is written as before."""
    p = personas
    (todo,) = push(p, 1)
    ended = OPEN_ATTEMPT.replace("summary)", "summary, ended_at, outcome)").replace(
        "'')", "'', now(), 'released')"
    )
    with psycopg.connect(database_url(), autocommit=False) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(psycopg.Error, match="READ COMMITTED or SERIALIZABLE"):
            conn.execute(OPEN_ATTEMPT, [todo.id, 1, p.agent.id, "rr"])
        conn.rollback()
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        # The foreign key is checked at commit, which this never reaches (the todo is this
        # test's, uncommitted): the insert itself passed the trigger's WHEN.
        assert conn.execute(ended, [todo.id, 1, p.agent.id, "history"]).fetchone()
        conn.rollback()


def test_the_end_of_an_attempt_sets_no_column_the_one_open_rule_indexes(
    personas: Personas,
) -> None:
    """The attempt table's B-tree indexes name none of the columns an ending sets, so the end
    update may be HOT (what the trigger replaced: an index whose predicate read ended_at)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = 'queues_attempt'"
            " AND indexdef NOT LIKE '%%USING brin%%'"
        )
        btrees = [row[0] for row in cursor.fetchall()]
    assert btrees
    for column in ("ended_at", "outcome", "disposition", "summary", "error", "lease_expires_at"):
        assert not [d for d in btrees if column in d], (column, btrees)
