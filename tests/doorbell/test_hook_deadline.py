"""A slow receiver cannot hold the server: each hook attempt has HOOK_TIMEOUT_SECONDS in all
(a receiver trickling its answer a byte at a time is cut off), Celery's time limit backs that
up, and hooks travel on a queue of their own (``hooks``) that the sweeps' worker never takes,
so a slow hook never delays a reap."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings as django_settings

from queues import hookguard, hooks, services, tasks
from queues.hook_tasks import deliver_ready_hook
from queues.models import Endpoint, Todo, TodoState
from switchboard.celery import app
from switchboard.core.errors import InvalidArgument
from tests.celery_worker import real_worker
from tests.conftest import Personas, claim_and_lapse, push
from tests.doorbell.streams import wait_for
from tests.pause.conftest import HookServer

ANSWER = b"HTTP/1.1 204 No Content\r\n\r\n"


@dataclass
class TrickleServer:
    """A receiver that answers one byte at a time, each byte well within the per-read timeout
    but the whole answer far beyond the attempt's deadline."""

    url: str
    answers: list[str] = field(default_factory=list)  # per connection: "whole" or "cut off"


@pytest.fixture(params=[(b"", ANSWER)])
def trickle_server(request: Any, settings: Any) -> Iterator[TrickleServer]:
    """``request.param``: what is sent at once, then what is sent a byte at a time."""
    at_once, answer_bytes = request.param
    settings.HOOK_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    listener = socket.create_server(("127.0.0.1", 0))
    receiver = TrickleServer(url=f"http://127.0.0.1:{listener.getsockname()[1]}/hook")
    handlers: list[threading.Thread] = []

    def answer(conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                conn.sendall(at_once)
                for byte in answer_bytes:
                    conn.sendall(bytes([byte]))
                    time.sleep(0.25)
            except OSError:
                receiver.answers.append("cut off")
            else:
                receiver.answers.append("whole")

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            handler = threading.Thread(target=answer, args=(conn,), daemon=True)
            handlers.append(handler)
            handler.start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield receiver
    finally:
        listener.close()
        for handler in handlers:
            handler.join(timeout=15)


def test_a_receiver_trickling_its_answer_is_cut_off_at_the_deadline_and_the_endpoint_shows_it(
    tx_personas: Personas, trickle_server: TrickleServer, celery_worker: Any, settings: Any
) -> None:
    p = tx_personas
    settings.HOOK_TIMEOUT_SECONDS = 1
    settings.HOOK_RETRY_SECONDS = 0
    services.endpoint_update(
        endpoint=p.agent, actor=p.as_human(p.owner), notify_url=trickle_server.url
    )
    push(p, 1)

    assert wait_for(lambda: Endpoint.objects.get(pk=p.agent.pk).hook_failed_at is not None)
    p.agent.refresh_from_db()
    assert p.agent.hook_error == "the hook did not answer within 1 s"
    assert wait_for(lambda: len(trickle_server.answers) == django_settings.HOOK_ATTEMPTS)
    assert trickle_server.answers == ["cut off"] * django_settings.HOOK_ATTEMPTS


# A status line at once, then header lines slowly and never the blank line ending them.
HEAD_NEVER_ENDING = (b"HTTP/1.1 204 No Content\r\n", b"X-Slow: 1\r\n" * 40)


@pytest.mark.parametrize("trickle_server", [HEAD_NEVER_ENDING], indirect=True)
def test_a_head_still_arriving_at_the_deadline_is_not_an_answer(
    trickle_server: TrickleServer, settings: Any
) -> None:
    # The timer shut the socket under the headers; http.client took the end of the stream for
    # their end, and the attempt counted as delivered (204) after the deadline.
    settings.HOOK_TIMEOUT_SECONDS = 1
    with pytest.raises(TimeoutError, match="did not answer within 1 s"):
        hooks.post(trickle_server.url, b"{}", {"content-type": "application/json"})


def test_a_url_http_client_cannot_send_is_a_failed_delivery_not_a_task_error(
    tx_personas: Personas, hook_server: HookServer
) -> None:
    # A URL stored before the checks that refuse it now: the attempt raised UnicodeEncodeError,
    # which nothing caught, so it was never retried and the endpoint never showed it.
    p = tx_personas
    services.endpoint_update(
        endpoint=p.agent, actor=p.as_human(p.owner), notify_url=hook_server.url
    )
    Endpoint.objects.filter(pk=p.agent.pk).update(notify_url=hook_server.url + "/hoök")
    [todo] = push(p, 1)
    with pytest.raises(hooks.HookDeliveryError, match="ascii"):
        hooks.deliver_ready(
            endpoint_id=str(p.agent.pk), queue="inbox", todo_id=str(todo.id), reason="created"
        )


def test_the_hook_task_gives_up_as_a_failed_delivery_at_celerys_time_limit(
    tx_personas: Personas,
    hook_server: HookServer,
    celery_worker: Any,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The backstop for what the attempt's own deadline does not bound: the soft limit (above
    the attempt's deadline, below the hard one) counts as a failed attempt."""
    p = tx_personas
    settings.HOOK_RETRY_SECONDS = 0
    assert (
        settings.HOOK_TIMEOUT_SECONDS
        < deliver_ready_hook.soft_time_limit
        < deliver_ready_hook.time_limit
    )
    services.endpoint_update(
        endpoint=p.agent, actor=p.as_human(p.owner), notify_url=hook_server.url
    )

    def hangs(*args: Any) -> int:
        raise SoftTimeLimitExceeded

    monkeypatch.setattr(hooks, "post", hangs)
    push(p, 1)
    assert wait_for(lambda: Endpoint.objects.get(pk=p.agent.pk).hook_failed_at is not None)
    p.agent.refresh_from_db()
    assert p.agent.hook_error == "the delivery exceeded its time limit"


@contextmanager
def worker_of(queue: str) -> Iterator[Any]:
    """A real worker on the real broker consuming only ``queue``, as ``manage.py serve`` runs
    one per queue."""
    try:
        with real_worker(queues=[queue]) as worker:
            yield worker
    finally:
        # The choice is the app's (a worker's -Q selects on it): later workers of this test
        # process consume every queue again, as a worker started without -Q does.
        app.amqp.queues._consume_from = None


def test_hooks_wait_on_their_own_queue_while_the_sweeps_worker_reaps(
    tx_personas: Personas, hook_server: HookServer
) -> None:
    p = tx_personas
    services.endpoint_update(
        endpoint=p.agent, actor=p.as_human(p.owner), notify_url=hook_server.url
    )
    waiting, lapsed = push(p, 2)  # two hooks ("created") enqueued before the sweep
    claim_and_lapse(p, [lapsed])
    with worker_of("celery"):
        tasks.reap_expired.delay()
        assert wait_for(lambda: Todo.objects.get(pk=lapsed.pk).state == TodoState.PENDING)
    assert hook_server.posts == []  # the sweeps' worker took none of the hooks queued first

    with worker_of("hooks"):
        assert wait_for(lambda: len(hook_server.posts) == 3)
    assert sorted((b["reason"], b["todo"]) for b in hook_server.bodies()) == sorted(
        [("created", str(waiting.id)), ("created", str(lapsed.id)), ("reaped", str(lapsed.id))]
    )
    assert Endpoint.objects.get(pk=p.agent.pk).hook_failed_at is None


@contextmanager
def resolver_hanging_for(name: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """``name``'s lookups hang until the test sets the event it yields (then answer 1.1.1.1);
    other names resolve as before. The outside world's resolver, the one thing mocked."""
    release = threading.Event()
    real = socket.getaddrinfo

    def getaddrinfo(host: str, *args: Any, **kwargs: Any) -> Any:
        if host == name:
            release.wait(20)
            host = "1.1.1.1"
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    try:
        yield release
    finally:
        release.set()


def test_a_resolver_that_does_not_answer_cannot_hold_the_attempt_past_its_deadline(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # getaddrinfo takes no timeout: the lookup held the hook worker for as long as the system's
    # resolver kept retrying, outside the attempt's deadline.
    settings.HOOK_TIMEOUT_SECONDS = 0.5
    with resolver_hanging_for("hooks.invalid", monkeypatch) as release:
        # Within what is left of the attempt's 0.5 s when the lookup starts.
        with pytest.raises(hookguard.UnsafeHookAddress, match=r"did not resolve within 0\.\d+ s"):
            hooks.post("http://hooks.invalid/hook", b"{}", {"content-type": "application/json"})
        assert not release.is_set()  # the attempt ended while the lookup still hung


def test_a_resolver_that_does_not_answer_cannot_hold_the_request_setting_the_url(
    personas: Personas, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = personas
    settings.HOOK_TIMEOUT_SECONDS = 0.5
    with resolver_hanging_for("hooks.invalid", monkeypatch) as release:
        with pytest.raises(InvalidArgument) as refused:
            services.endpoint_update(
                endpoint=p.agent, actor=p.as_human(p.owner), notify_url="http://hooks.invalid/"
            )
        assert not release.is_set()
    assert refused.value.field == "notify_url"
    assert "hooks.invalid did not resolve within 0.5 s" in refused.value.message
    p.agent.refresh_from_db()
    assert p.agent.notify_url == ""


def test_a_lookup_the_deadline_abandoned_does_not_take_the_next_attempts_time(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Lookups that hang fill the pool's threads; a later lookup of a name that answers still
    # gets through once they do, and an address literal never waits for the pool.
    settings.HOOK_TIMEOUT_SECONDS = 0.3
    with resolver_hanging_for("hooks.invalid", monkeypatch) as release:
        for _ in range(hookguard.RESOLVER_THREADS):
            with pytest.raises(hookguard.UnsafeHookAddress, match="did not resolve"):
                hookguard.resolve("hooks.invalid", 80, timeout=0.3)
        assert hookguard.resolve("1.1.1.1", 80, timeout=0.3) == [
            hookguard.ipaddress.ip_address("1.1.1.1")
        ]
        release.set()
        assert hookguard.resolve("hooks.invalid", 80, timeout=5) == [
            hookguard.ipaddress.ip_address("1.1.1.1")
        ]
