"""What the sweeps ring: a ``reaped`` or ``requeued`` ring (and its ready hook) names the todo
that became claimable, not the queue's oldest waiting one; a requeued todo keeps no owner; and
the heartbeat reminds every endpoint with due work in one sweep, however large one endpoint's
backlog."""

from __future__ import annotations

import json
from typing import Any

import pytest

from queues import services
from queues.models import Todo, TodoState
from queues.services import doorbell_sweeps
from tests.conftest import Personas, claim_and_lapse, make_retry_due, push
from tests.doorbell.test_sweeps import waited
from tests.pause.conftest import HookServer
from tests.pause.helpers import Listener


def _rings(listener: Listener) -> list[tuple[str, str | None]]:
    return [(r["r"], r["t"]) for r in (json.loads(raw) for raw in listener.drain_raw())]


def _failed_and_due(p: Personas, todo: Any) -> None:
    services.claim(actor=p.as_agent(), todo_id=todo.id, claimant="alice")
    services.fail(actor=p.as_agent(), todo_id=todo.id)
    make_retry_due(todo)


def test_a_reaped_ring_and_its_hook_name_the_todo_whose_lease_lapsed(
    tx_personas: Personas, listener: Listener, hook_server: HookServer, eager_celery: None
) -> None:
    p = tx_personas
    services.endpoint_update(
        endpoint=p.agent, actor=p.as_human(p.owner), notify_url=hook_server.url
    )
    waiting, lapsed = push(p, 2)  # the older one waits unclaimed
    claim_and_lapse(p, [lapsed])
    listener.drain()
    hook_server.posts.clear()

    assert services.reap_expired() == 1
    assert _rings(listener) == [("reaped", str(lapsed.id))]
    assert [(b["reason"], b["todo"]) for b in hook_server.bodies()] == [("reaped", str(lapsed.id))]
    assert Todo.objects.get(pk=waiting.pk).state == TodoState.PENDING


def test_a_requeued_ring_and_its_hook_name_the_todo_whose_retry_came_due(
    tx_personas: Personas, listener: Listener, hook_server: HookServer, eager_celery: None
) -> None:
    p = tx_personas
    services.endpoint_update(
        endpoint=p.agent, actor=p.as_human(p.owner), notify_url=hook_server.url
    )
    _, retried = push(p, 2)
    _failed_and_due(p, retried)
    listener.drain()
    hook_server.posts.clear()

    assert services.requeue_due_retries() == 1
    assert _rings(listener) == [("requeued", str(retried.id))]
    assert [(b["reason"], b["todo"]) for b in hook_server.bodies()] == [
        ("requeued", str(retried.id))
    ]


def test_a_sweep_freeing_several_todos_of_one_queue_rings_once_naming_the_oldest_it_freed(
    tx_personas: Personas, listener: Listener
) -> None:
    p = tx_personas
    _, first, second = push(p, 3)
    (elsewhere,) = push(p, 1, endpoint=p.agent2)
    claim_and_lapse(p, [second, first, elsewhere])
    listener.drain()

    assert services.reap_expired() == 3
    assert sorted(_rings(listener)) == sorted(
        [("reaped", str(first.id)), ("reaped", str(elsewhere.id))]
    )


def test_a_requeued_todo_keeps_no_owner_as_a_reaped_or_released_one(
    tx_personas: Personas,
) -> None:
    p = tx_personas
    (todo,) = push(p, 1)
    _failed_and_due(p, todo)
    assert Todo.objects.get(pk=todo.pk).owner == "alice"  # a failed todo shows who failed it

    assert services.requeue_due_retries() == 1
    todo.refresh_from_db()
    assert (todo.state, todo.owner) == (TodoState.PENDING, "")


def test_one_endpoints_backlog_larger_than_the_sweep_leaves_no_other_endpoint_unreminded(
    tx_personas: Personas, listener: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tx_personas
    monkeypatch.setattr(doorbell_sweeps, "BATCH", 5)
    backlog = push(p, 8)  # the oldest work of the fleet, more than a whole sweep
    others = [*push(p, 1, endpoint=p.agent2), *push(p, 1, endpoint=p.foreign)]
    waited([*backlog, *others], 6)
    listener.drain()

    assert services.remind_waiting() == 5
    assert sorted(_rings(listener)) == sorted(
        ("waiting", str(t.id)) for t in [*backlog[:3], *others]
    )
