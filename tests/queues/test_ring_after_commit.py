"""A ring after a commit that fails is logged, never raised: the change it announces stands.

A release's, an ended claim's and an operator's retry's rings run once their change has
committed (``wakes.after_commit``). When the database went away between the commit and the ring,
the ring's error reached the caller: the agent or the operator heard 503 "nothing changed" for
an ending or a retry that had been made (and an agent, told so, would end it again or think it
still held the claim). Here the database process serving the change ends right at its commit,
before the ring, as when the server restarts: the call returns what it did, the change is in
the database, and the log says the ring was lost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from django.db import OperationalError, connection, transaction

from queues import services, wakes
from queues.models import Todo, TodoState
from tests.conftest import Personas, database_url, push

LOST = "a ring after a commit failed; the change it announces stands"


def _end_own_backend(pid: int) -> Callable[[], None]:
    """A commit hook that ends the server process ``pid`` (this connection's) from another
    session, and returns once it is gone."""

    def end() -> None:
        with psycopg.connect(database_url(), autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s)", [pid])
            deadline = time.monotonic() + 30
            while other.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone():
                assert time.monotonic() < deadline, "the backend outlived its termination"
                time.sleep(0.02)

    return end


@contextmanager
def database_gone_at_commit() -> Iterator[None]:
    """A transaction whose connection's server process ends at its commit, before any ring
    registered inside it runs; then a new connection for whatever comes next."""
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                (pid,) = cursor.fetchone()
            transaction.on_commit(_end_own_backend(pid))  # first: runs before the rings
            yield
    finally:
        connection.close()


def _state(todo: Todo) -> tuple[str, int]:
    with psycopg.connect(database_url(), autocommit=True) as other:
        row = other.execute(
            "SELECT state, attempt FROM queues_todo WHERE id = %s", [todo.id]
        ).fetchone()
    assert row is not None
    return row[0], row[1]


def _lost_rings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == LOST and r.exc_info]


def test_an_agents_release_stands_when_its_ring_fails(
    tx_personas: Personas, caplog: pytest.LogCaptureFixture
) -> None:
    p = tx_personas
    (todo,) = push(p, 1)
    claimed = services.claim(actor=p.as_agent(), todo_id=todo.id)
    caplog.set_level(logging.ERROR, logger="queues.wakes")
    with database_gone_at_commit():
        released = services.release(actor=p.as_agent(), todo_id=todo.id, attempt=claimed.attempt)
    assert released.state == TodoState.PENDING
    assert _state(todo) == (TodoState.PENDING, 1)
    (record,) = _lost_rings(caplog)
    assert record.exc_info is not None and isinstance(record.exc_info[1], OperationalError)
    # The next call is served on a new connection.
    again = services.claim(actor=p.as_agent(), todo_id=todo.id)
    assert again.attempt == 2


def test_an_operators_retry_stands_when_its_ring_fails(
    tx_personas: Personas, caplog: pytest.LogCaptureFixture
) -> None:
    p = tx_personas
    (todo,) = push(p, 1, max_attempts=1)
    claimed = services.claim(actor=p.as_agent(), todo_id=todo.id)
    services.fail(actor=p.as_agent(), todo_id=todo.id, error="boom", attempt=claimed.attempt)
    assert _state(todo) == (TodoState.FAILED, 1)
    caplog.set_level(logging.ERROR, logger="queues.wakes")
    with database_gone_at_commit():
        retried = services.todo_retry(actor=p.as_human(), todo_id=todo.id)
    assert retried.state == TodoState.PENDING
    assert _state(todo) == (TodoState.PENDING, 1)
    (record,) = _lost_rings(caplog)
    assert isinstance(record.exc_info[1], OperationalError)  # type: ignore[index]


def test_a_ring_that_fails_outside_a_transaction_is_logged_too(
    transactional_db: None, caplog: pytest.LogCaptureFixture
) -> None:
    """In autocommit (an agent's ending commits its one statement) the ring runs at once."""
    caplog.set_level(logging.ERROR, logger="queues.wakes")
    rang: list[Any] = []

    def failing() -> None:
        rang.append(1)
        raise OperationalError("server closed the connection unexpectedly")

    assert connection.get_autocommit() and not connection.in_atomic_block
    wakes.after_commit(failing)
    assert rang == [1]
    assert len(_lost_rings(caplog)) == 1
