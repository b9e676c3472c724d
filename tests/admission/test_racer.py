"""The two-process race harness itself (racer.py): a racer that cannot connect ends the race at
once with its error, instead of leaving its child at the start barrier and the parent waiting on
that child for ever (seen when the shared server ran out of connections)."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

from django.conf import settings
from django.db import connection

from queues.models import Todo
from tests.admission.racer import race
from tests.conftest import Personas, database_url, push


def test_a_racer_that_cannot_connect_ends_the_race_with_its_error(
    tx_personas: Personas, tmp_path: Path
) -> None:
    p = tx_personas
    push(p, 4)
    # A real refusal from the server: a role allowed one connection, so each child's first
    # connection (the endpoint's read) succeeds and its racer threads' second ones are refused.
    role = f"racer_{uuid.uuid4().hex[:12]}"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 1")
        cursor.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
    url = database_url().replace(f"//{connection.settings_dict['USER']}", f"//{role}", 1)
    assert role in url
    outcome: list[BaseException | object] = []

    def run() -> None:
        try:
            outcome.append(race(p.agent.id, 3, tmp_path, url, settings.REDIS_URL, 20.0))
        except BaseException as exc:
            outcome.append(exc)

    try:
        started = time.monotonic()
        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        # Well before the children's own start timeout (20 s): the refusal ends it, not a clock.
        runner.join(15)
        assert not runner.is_alive(), "the race hung on a racer that could not connect"
        assert time.monotonic() - started < 15
        [error] = outcome
        assert isinstance(error, AssertionError), error
        assert "never got ready" in str(error)
        assert "too many connections" in str(error) or "could not connect" in str(error)
        # Nobody claimed: the children stopped before "go".
        assert not Todo.objects.filter(endpoint=p.agent, state="claimed").exists()
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role]
            )
            cursor.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}")
            cursor.execute(f"DROP ROLE {role}")
