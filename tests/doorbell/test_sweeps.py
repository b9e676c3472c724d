"""The doorbell's sweeps: reminders for work still waiting (5 min, 20 min, 1 h, 6 h; five rings
a todo at most; three reminders an endpoint a sweep; never for a paused or deferred queue) and
the stall ring to a claim's holder, each counted exactly on a LISTEN connection, raced, on a
real Celery worker, and received by a real agent stream."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from queues import services, tasks
from queues.services import Claimed
from tests.admission.test_reopen import daily, exhaust
from tests.conftest import Personas, push
from tests.doorbell.streams import attached, wait_for
from tests.pause.conftest import HookServer
from tests.pause.helpers import Listener, in_thread, pause, resume


def _rings(listener: Listener) -> list[tuple[str, str | None]]:
    return [(r["r"], r["t"]) for r in (json.loads(raw) for raw in listener.drain_raw())]


def waited(todos: list[Any], minutes: float) -> None:
    """Move the todos' last change (and the reminders counted from it) into the past, as if
    they had waited that much longer."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE queues_todo
            SET rung_since = CASE WHEN rung_since = updated_at
                                  THEN rung_since - make_interval(mins => %(m)s) END,
                updated_at = updated_at - make_interval(mins => %(m)s)
            WHERE id = ANY(%(ids)s)
            """,
            {"m": minutes, "ids": [t.id for t in todos]},
        )


def test_a_waiting_todo_is_reminded_once_at_each_step_and_rings_five_times_in_all(
    tx_personas: Personas, listener: Listener
) -> None:
    p = tx_personas
    (todo,) = push(p, 1)
    assert _rings(listener) == [("created", str(todo.id))]
    assert services.remind_waiting() == 0  # just created: nothing to remind

    waited([todo], 6)
    assert services.remind_waiting() == 1
    assert services.remind_waiting() == 0  # the next step is at 20 minutes
    waited([todo], 15)  # 21 minutes
    assert services.remind_waiting() == 1
    waited([todo], 45)  # 66 minutes
    assert services.remind_waiting() == 1
    waited([todo], 5 * 60)  # over 6 hours
    assert services.remind_waiting() == 1
    waited([todo], 48 * 60)
    assert services.remind_waiting() == 0  # five rings: the created one and four reminders
    assert _rings(listener) == [("waiting", str(todo.id))] * 4


def test_a_todo_that_changed_counts_its_reminders_afresh(
    tx_personas: Personas, listener: Listener
) -> None:
    p = tx_personas
    (todo,) = push(p, 1)
    waited([todo], 6)
    assert services.remind_waiting() == 1
    claimed = services.claim_next(actor=p.as_agent())
    assert isinstance(claimed, Claimed)
    assert services.remind_waiting() == 0  # claimed: nothing to remind
    services.release(actor=p.as_agent(), todo_id=todo.id, lease_token=claimed.lease_token)
    listener.drain()
    waited([todo], 6)
    assert services.remind_waiting() == 1
    assert _rings(listener) == [("waiting", str(todo.id))]


def test_an_endpoint_gets_at_most_three_reminders_a_sweep_oldest_first(
    tx_personas: Personas, listener: Listener
) -> None:
    p = tx_personas
    todos = push(p, 5)
    (other,) = push(p, 1, endpoint=p.agent2)
    waited([*todos, other], 6)
    listener.drain()
    assert services.remind_waiting() == 4
    first = _rings(listener)
    assert sorted(first) == sorted(("waiting", str(t.id)) for t in [*todos[:3], other])
    assert services.remind_waiting() == 2
    assert _rings(listener) == [("waiting", str(t.id)) for t in todos[3:]]
    assert services.remind_waiting() == 0


def test_a_paused_or_deferred_queue_is_never_reminded(
    tx_personas: Personas, listener: Listener
) -> None:
    p = tx_personas
    todos = push(p, 2)
    waited(todos, 6)
    pause(p.pauser)
    listener.drain()
    assert services.remind_waiting() == 0
    assert listener.drain() == []

    exhaust(daily(p, endpoint=p.agent, limit=1))
    resume(p.pauser)  # deferred now: even the resume does not ring
    waited(todos, 6)
    assert services.remind_waiting() == 0
    assert listener.drain() == []


def test_two_sweeps_at_once_ring_each_todo_once(tx_personas: Personas, listener: Listener) -> None:
    p = tx_personas
    endpoints = [p.agent, p.agent2]
    todos = [t for e in endpoints for t in push(p, 3, endpoint=e)]
    waited(todos, 6)
    listener.drain()
    start = threading.Barrier(2)

    def sweep() -> int:
        start.wait(10)
        return services.remind_waiting()

    runs = [in_thread(sweep) for _ in range(2)]
    counts = [future.result(timeout=30) for _, future in runs]
    assert sum(counts) == 6
    assert sorted(_rings(listener)) == sorted(("waiting", str(t.id)) for t in todos)


def claimed_for(p: Personas, seconds_ago: int, lease_seconds: int = 60) -> Any:
    """A todo claimed (or last heartbeated) ``seconds_ago`` with a lease of ``lease_seconds``."""
    (todo,) = push(p, 1, queue="outbox")
    services.claim(actor=p.as_agent(), todo_id=todo.id, lease_ttl_seconds=lease_seconds)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE queues_todo SET updated_at = now() - make_interval(secs => %(s)s), "
            "lease_expires_at = now() - make_interval(secs => %(s)s) "
            "+ make_interval(secs => %(ttl)s) WHERE id = %(id)s",
            {"s": seconds_ago, "ttl": lease_seconds, "id": todo.id},
        )
    return todo


def test_a_claim_quiet_for_half_its_lease_rings_its_holder_once_until_it_heartbeats(
    tx_personas: Personas, listener: Listener, hook_server: HookServer, eager_celery: None
) -> None:
    p = tx_personas
    services.endpoint_update(
        endpoint=p.agent, actor=p.as_human(p.owner), notify_url=hook_server.url
    )
    claimed_for(p, seconds_ago=10)  # quiet for 10 of 60 seconds: not stalled
    quiet = claimed_for(p, seconds_ago=31)
    listener.drain()
    hook_server.posts.clear()
    assert services.ring_stalled() == 1
    assert _rings(listener) == [("stalled", str(quiet.id))]
    assert [(b["reason"], b["todo"]) for b in hook_server.bodies()] == [("stalled", str(quiet.id))]
    assert services.ring_stalled() == 0  # once per quiet spell

    services.heartbeat(actor=p.as_agent(), todo_id=quiet.id, lease_ttl_seconds=60)
    assert services.ring_stalled() == 0
    with connection.cursor() as cursor:  # 40 of the new lease's 60 seconds pass in quiet
        cursor.execute(
            "UPDATE queues_todo SET updated_at = updated_at - interval '40 seconds', "
            "lease_expires_at = lease_expires_at - interval '40 seconds', "
            "stall_rung_at = stall_rung_at - interval '40 seconds' WHERE id = %s",
            [quiet.id],
        )
    assert services.ring_stalled() == 1
    assert _rings(listener) == [("stalled", str(quiet.id))]
    assert services.ring_stalled() == 0


@pytest.fixture
def server(live_url: str) -> str:
    """The session's web process (tests/mcp/conftest.py): a process per test cost a Django start
    each, and every stream here is its own endpoint's (the personas are new each test)."""
    return live_url


def test_the_holders_stream_is_told_its_claim_stalled(tx_personas: Personas, server: str) -> None:
    p = tx_personas
    quiet = claimed_for(p, seconds_ago=45)
    with attached(server, p.agent_token) as stream:
        assert services.ring_stalled() == 1
        event = stream.next()
        assert (event["todo"], event["queue"], event["reason"]) == (
            str(quiet.id),
            "outbox",
            "stalled",
        )


def test_beat_runs_both_sweeps_and_a_real_worker_rings(
    tx_personas: Personas, listener: Listener, celery_worker: Any
) -> None:
    schedule: dict[str, dict[str, Any]] = settings.CELERY_BEAT_SCHEDULE
    assert {"queues.tasks.remind_waiting", "queues.tasks.ring_stalled"} <= {
        entry["task"] for entry in schedule.values()
    }
    p = tx_personas
    (todo,) = push(p, 1)
    quiet = claimed_for(p, seconds_ago=45)
    waited([todo], 6)
    listener.drain()
    tasks.remind_waiting.delay()
    tasks.ring_stalled.delay()
    seen: list[tuple[str, str | None]] = []

    def both_rang() -> bool:
        seen.extend(_rings(listener))
        return len(seen) >= 2

    assert wait_for(both_rang)
    assert sorted(seen) == sorted([("waiting", str(todo.id)), ("stalled", str(quiet.id))])
