"""Wakes and a pause: nothing rings while paused; resume rings once per endpoint with pending
todos, through the same two edges as a creation (the todo_ready notification at commit and the
ready hook through Celery).

What this proves and what it does not: notifications are read on a real LISTEN connection, and
the ready hook is really POSTed to an HTTP server the test runs, by the real Celery task running
eagerly (``task_always_eager``) from the transaction's on-commit hook. The broker hop to a
separate worker is not exercised here.
"""

from __future__ import annotations

import socket
import time
import uuid
from datetime import timedelta
from typing import Any

from django.utils import timezone

from queues import hook_tasks, hooks, services, wakes
from queues.cli_pause import resume_outcome
from queues.models import Endpoint, Todo, TodoState
from queues.services import Claimed, NothingClaimable
from tests.admission.conftest import budget
from tests.conftest import FIXTURE, Personas, push
from tests.limits.conftest import pool
from tests.pause.conftest import HookServer
from tests.pause.helpers import Listener, pause, resume


def _hooked(p: Personas, hook_server: HookServer) -> Endpoint:
    endpoint, _ = services.endpoint_vend(
        actor=FIXTURE,
        owner=p.owner,
        name="Hooked",
        queues=["inbox", "outbox"],
        rps=0,
        notify_url=hook_server.url,
    )
    return endpoint


def _ready(endpoint: Endpoint, queue: str = "inbox") -> str:
    return f"{endpoint.id}:{queue}"


def _verify_signature(endpoint: Endpoint, post: dict[str, Any]) -> bool:
    headers = {k.lower(): v for k, v in post["headers"].items()}
    expected = hooks.sign(
        endpoint.notify_secret,
        headers["webhook-id"],
        int(headers["webhook-timestamp"]),
        post["body"].encode(),
    )
    return bool(headers["webhook-signature"] == expected)


def test_nothing_rings_while_paused_on_any_wake_path(
    tx_personas: Personas, listener: Listener, hook_server: HookServer, eager_celery: None
) -> None:
    p = tx_personas
    hooked = _hooked(p, hook_server)
    # Control: a live queue rings and posts, so silence below means something.
    push(p, 1, queue="inbox", endpoint=hooked)
    assert listener.drain() == [_ready(hooked)]
    assert [b["reason"] for b in hook_server.bodies()] == ["created"]
    # Claims in flight before the pause, to be released and reaped while paused.
    push(p, 2, queue="inbox")
    held = [services.claim_next(actor=p.as_agent(), queue="inbox") for _ in range(2)]
    assert all(isinstance(h, Claimed) for h in held)
    ids = [h.todo.id for h in held if isinstance(h, Claimed)]
    retrying = push(p, 1, queue="inbox", endpoint=p.agent2)[0]
    assert isinstance(services.claim_next(actor=p.as_agent(p.agent2)), Claimed)
    services.fail(actor=p.as_agent(p.agent2), todo_id=retrying.id, error="flaky")
    listener.drain()
    hook_server.posts.clear()

    pause(p.pauser, "inbox")
    push(p, 2, queue="inbox")  # intake on three endpoints
    push(p, 1, queue="inbox", endpoint=p.agent2)
    push(p, 2, queue="inbox", endpoint=hooked)
    services.release(actor=p.as_agent(), todo_id=ids[0])  # rings after commit when live
    Todo.objects.filter(pk=ids[1]).update(lease_expires_at=timezone.now() - timedelta(hours=1))
    assert services.reap_expired() == 1  # rings for the requeued todo when live
    Todo.objects.filter(pk=retrying.id).update(next_retry_at=timezone.now() - timedelta(hours=1))
    assert services.requeue_due_retries() == 1  # rings when live

    assert listener.drain() == []
    assert hook_server.posts == []


def test_resume_rings_once_per_endpoint_with_pending_todos_then_the_backlog_claims(
    tx_personas: Personas, listener: Listener, hook_server: HookServer, eager_celery: None
) -> None:
    p = tx_personas
    hooked = _hooked(p, hook_server)
    pause(p.pauser, "inbox")
    push(p, 2, queue="inbox")
    push(p, 1, queue="inbox", endpoint=p.agent2)
    oldest_hooked = push(p, 3, queue="inbox", endpoint=hooked)[0]
    push(p, 1, queue="outbox", endpoint=hooked)  # another queue: rings on its own
    assert listener.drain() == [_ready(hooked, "outbox")]
    hook_server.posts.clear()

    result = resume(p.pauser, "inbox")

    # foreign shares the name but holds no pending todo on it: not rung.
    assert sorted(listener.drain()) == sorted([_ready(p.agent), _ready(p.agent2), _ready(hooked)])
    assert sorted(result.woken) == sorted([p.agent.slug, p.agent2.slug, hooked.slug])
    [post] = hook_server.posts
    assert post["path"] == "/hook"
    assert hook_server.bodies() == [
        {
            "type": "todo.ready",
            "endpoint": hooked.slug,
            "queue": "inbox",
            "todo": str(oldest_hooked.id),
            "title": oldest_hooked.title,
            "reason": "resumed",
        }
    ]
    assert _verify_signature(hooked, post)
    # Nothing is re-fired or scheduled: a second look hears nothing more.
    assert listener.drain() == []
    assert len(hook_server.posts) == 1

    drained = {}
    for endpoint in (p.agent, p.agent2, hooked):
        agent = p.as_agent(endpoint)
        while isinstance(got := services.claim_next(actor=agent, queue="inbox"), Claimed):
            drained[got.todo.id] = services.complete(actor=agent, todo_id=got.todo.id).state
        assert isinstance(got, NothingClaimable)
    assert len(drained) == 6
    assert set(drained.values()) == {TodoState.DONE}


def test_resume_of_a_never_paused_queue_rings_nothing(
    tx_personas: Personas, listener: Listener, hook_server: HookServer, eager_celery: None
) -> None:
    p = tx_personas
    hooked = _hooked(p, hook_server)
    push(p, 1, queue="inbox", endpoint=hooked)
    listener.drain()
    hook_server.posts.clear()

    result = resume(p.pauser, "inbox")

    assert result.resumed is False
    assert listener.drain() == []
    assert hook_server.posts == []


def test_resume_of_a_queue_with_nothing_pending_rings_nothing(
    tx_personas: Personas, listener: Listener, hook_server: HookServer, eager_celery: None
) -> None:
    p = tx_personas
    _hooked(p, hook_server)
    pause(p.pauser, "inbox")

    result = resume(p.pauser, "inbox")

    assert result.resumed is True
    assert (result.woken, result.held) == ([], [])
    assert listener.drain() == []
    assert hook_server.posts == []


def test_a_resume_says_which_identities_a_budget_still_holds_and_rings_none_of_them(
    tx_personas: Personas, listener: Listener, hook_server: HookServer, eager_celery: None
) -> None:
    # The CLI said "rang: no endpoint has pending todos" and the console "its todos are handed
    # out again" while the budget held every pending todo.
    p = tx_personas
    push(p, 2, queue="inbox")
    push(p, 1, queue="inbox", endpoint=p.agent2)
    budget(p, "inbox", per="day", limit=0)  # agent's identity admits nothing today
    pause(p.pauser, "inbox")
    listener.drain()

    result = resume(p.pauser, "inbox")

    assert result.resumed is True
    assert (result.woken, result.held) == ([p.agent2.slug], [p.agent.slug])
    assert listener.drain() == [f"{p.agent2.id}:inbox"]
    text = resume_outcome(result)
    assert text == (
        f"rang: {p.agent2.slug}; still held by a budget or a named limit (rung when it frees): "
        f"{p.agent.slug}"
    )


def test_a_resume_counts_work_its_named_limits_hold_as_held_not_woken(
    tx_personas: Personas, listener: Listener, hook_server: HookServer, eager_celery: None
) -> None:
    # Its pending todos all named a full pool: the resume answered woken and rang "resumed",
    # and the claim that followed found nothing.
    p = tx_personas
    pool("gpu", slots=1)
    first, _second = push(p, 2, queue="inbox", pool="gpu")
    services.claim(actor=p.as_agent(), todo_id=first.id)
    [free] = push(p, 1, queue="inbox", endpoint=p.agent2)
    pause(p.pauser, "inbox")
    listener.drain()

    result = resume(p.pauser, "inbox")

    assert (result.woken, result.held) == ([p.agent2.slug], [p.agent.slug])
    assert listener.drain() == [f"{p.agent2.id}:inbox"]
    assert free.id


def test_a_broker_that_does_not_answer_costs_one_hand_off_its_bound_then_none(
    db: None, settings: Any, monkeypatch: Any
) -> None:
    """A frozen broker (it holds the connection and never answers): the first hooked write
    pays the Redis bound, the ones after it within the breaker's open period nothing
    (regress9b: each paid the bound, and under many writers every claim waited behind them)."""
    with socket.socket() as frozen:
        frozen.bind(("127.0.0.1", 0))
        frozen.listen(16)  # the kernel accepts; nobody reads or answers
        conf = hook_tasks.deliver_ready_hook.app.conf
        monkeypatch.setitem(conf, "broker_url", f"redis://127.0.0.1:{frozen.getsockname()[1]}/0")
        monkeypatch.setitem(conf, "broker_write_url", None)
        settings.REDIS_TIMEOUT_SECONDS = 0.5
        settings.REDIS_BREAKER_OPEN_SECONDS = 30
        wakes.broker_breaker.reset()
        try:
            started = time.monotonic()
            wakes._enqueue_hook(uuid.uuid4(), "inbox", None, "created")
            first = time.monotonic() - started
            started = time.monotonic()
            for _ in range(20):
                wakes._enqueue_hook(uuid.uuid4(), "inbox", None, "created")
            rest = time.monotonic() - started
        finally:
            wakes.broker_breaker.reset()
    assert 0.4 < first < 3, first
    assert rest < 0.2, rest
