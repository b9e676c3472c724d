"""One source of rings: every path that makes work claimable sends one todo_ready naming the todo,
the queue and the reason; the gate holds it back for paused and deferred queues; a window boundary
rings once per endpoint and queue however much work waits."""

from __future__ import annotations

import json
from typing import Any

from admission import services as admission_services
from queues import services, wakes
from queues.models import Endpoint, Todo
from queues.services import Claimed
from tests.admission.test_reopen import daily, exhaust, roll_over
from tests.conftest import FIXTURE, Personas, lapse, push
from tests.pause.conftest import HookServer
from tests.pause.helpers import Listener, pause


def _hooked(p: Personas, hook_server: HookServer, name: str) -> Endpoint:
    endpoint, _ = services.endpoint_vend(
        actor=FIXTURE, owner=p.owner, name=name, queues=["inbox"], rps=0, notify_url=hook_server.url
    )
    return endpoint


def _rings(listener: Listener) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in listener.drain_raw()]


def test_a_created_todo_rings_once_naming_itself_its_queue_and_the_reason(
    tx_personas: Personas, listener: Listener
) -> None:
    p = tx_personas
    (todo,) = push(p, 1)
    assert _rings(listener) == [
        {"e": str(p.agent.id), "q": "inbox", "r": "created", "t": str(todo.id)}
    ]


def test_release_reap_and_requeue_ring_with_their_reasons(
    tx_personas: Personas, listener: Listener
) -> None:
    p = tx_personas
    (todo,) = push(p, 1)
    listener.drain()
    claimed = services.claim_next(actor=p.as_agent())
    assert isinstance(claimed, Claimed)
    services.release(actor=p.as_agent(), todo_id=todo.id, lease_token=claimed.lease_token)
    assert [(r["r"], r["t"]) for r in _rings(listener)] == [("released", str(todo.id))]

    assert isinstance(services.claim_next(actor=p.as_agent()), Claimed)
    lapse(todo)
    assert services.reap_expired() == 1
    assert [(r["r"], r["t"]) for r in _rings(listener)] == [("reaped", str(todo.id))]

    Todo.objects.filter(pk=todo.pk).update(state="failed", next_retry_at="2000-01-01T00:00Z")
    assert services.requeue_due_retries() == 1
    assert [(r["r"], r["t"]) for r in _rings(listener)] == [("requeued", str(todo.id))]


def test_a_paused_queue_never_rings_on_create(tx_personas: Personas, listener: Listener) -> None:
    p = tx_personas
    pause(p.pauser)
    push(p, 3)
    assert listener.drain() == []


def test_forty_pending_todos_in_an_exhausted_queue_ring_once_per_endpoint_at_the_boundary(
    tx_personas: Personas, listener: Listener, hook_server: HookServer, eager_celery: None
) -> None:
    p = tx_personas
    endpoints = [_hooked(p, hook_server, name) for name in ("Alpha", "Beta")]
    spent = [exhaust(daily(p, endpoint=e, limit=1)) for e in endpoints]
    for endpoint in endpoints:
        push(p, 40, endpoint=endpoint)
    admission_services.reopen_sweep()  # a beat inside the spent window
    assert listener.drain() == []
    assert hook_server.posts == []

    for window in spent:
        roll_over(window)
    admission_services.reopen_sweep()
    admission_services.reopen_sweep()  # the next beat: still admitted, no second ring

    assert sorted(listener.drain()) == sorted(wakes.payload(e.id, "inbox") for e in endpoints)
    assert sorted((b["endpoint"], b["reason"]) for b in hook_server.bodies()) == sorted(
        (e.slug, "reopened") for e in endpoints
    )


def test_each_edge_reaches_the_ready_hook_with_its_reason(
    tx_personas: Personas, listener: Listener, hook_server: HookServer, eager_celery: None
) -> None:
    """created, released, reaped, requeued here; reopened, resumed and stalled in
    test_forty_pending_..., tests/pause/test_wakes.py and test_sweeps.py."""
    p = tx_personas
    hooked = _hooked(p, hook_server, "Hooked")
    agent = p.as_agent(hooked)
    (todo,) = push(p, 1, endpoint=hooked)
    claimed = services.claim_next(actor=agent)
    assert isinstance(claimed, Claimed)
    services.release(actor=agent, todo_id=todo.id, lease_token=claimed.lease_token)
    assert isinstance(services.claim_next(actor=agent), Claimed)
    lapse(todo)
    assert services.reap_expired() == 1
    Todo.objects.filter(pk=todo.pk).update(state="failed", next_retry_at="2000-01-01T00:00Z")
    assert services.requeue_due_retries() == 1
    assert [(b["reason"], b["todo"]) for b in hook_server.bodies()] == [
        (reason, str(todo.id)) for reason in ("created", "released", "reaped", "requeued")
    ]
