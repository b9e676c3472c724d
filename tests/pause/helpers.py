"""Helpers for the pause tests: pause/resume as a human, a LISTEN connection that can prove
silence, and threads with their own database connections that can be held mid-transaction."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from django.db import connection

from queues import pauses, wakes
from queues.access import HumanActor
from tests.conftest import in_thread as in_thread  # shared; the pause tests import it here


def pause(user: Any, queue: str = "inbox", reason: str = "upgrade", **kw: Any) -> Any:
    return pauses.queue_pause(actor=HumanActor(user), queue=queue, reason=reason, **kw)


def resume(user: Any, queue: str = "inbox") -> Any:
    return pauses.queue_resume(actor=HumanActor(user), queue=queue)


class Listener:
    """LISTEN todo_ready on a connection of its own. ``drain()`` returns every notification
    committed before it was called: it sends a sentinel through the same channel and reads up
    to it. Notifications arrive in commit order, so silence is proved without waiting on a
    clock."""

    def __init__(self) -> None:
        params = connection.get_connection_params()
        self.conn = psycopg.connect(autocommit=True, **params)
        self.conn.execute(f"LISTEN {wakes.CHANNEL}")

    def drain(self) -> list[str]:
        """The queue identities (``<endpoint_id>:<queue>``) rung since the last drain."""
        return [wakes.identity(raw) for raw in self.drain_raw()]

    def drain_raw(self) -> list[str]:
        sentinel = f"sentinel:{uuid.uuid4()}"
        self.conn.execute("SELECT pg_notify(%s, %s)", [wakes.CHANNEL, sentinel])
        seen: list[str] = []
        for note in self.conn.notifies(timeout=30):
            if note.payload == sentinel:
                return seen
            seen.append(note.payload)
        raise AssertionError(f"the sentinel never arrived; saw {seen}")

    def close(self) -> None:
        self.conn.close()


def waiting_locks(table: str = "queues_queuepause") -> list[str]:
    """Lock modes other sessions are waiting for on a table."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT mode FROM pg_locks WHERE relation = %s::regclass AND NOT granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "ORDER BY mode",
            [table],
        )
        return [row[0] for row in cursor.fetchall()]


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll for a state the database reports (a wait, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.01)
