"""Fail fast, change nothing, say when to retry: the request deadline, the Redis breaker and the
idempotent counter flushes. (Real outages under load: tests/faults.)"""

from __future__ import annotations

import socket
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from queues import metrics, services
from queues.models import Attempt, Todo
from switchboard.core import availability, counters, ratelimit
from tests.api.conftest import Api
from tests.conftest import Personas, push


def test_a_claim_past_the_request_deadline_is_refused_and_changes_nothing(
    personas: Personas,
) -> None:
    todo = push(personas)[0]
    with availability.request_deadline(time.monotonic() - 60):
        with pytest.raises(availability.Unavailable) as caught:
            services.claim_next(actor=personas.as_agent())
        with pytest.raises(availability.Unavailable):
            services.claim(actor=personas.as_agent(), todo_id=todo.id)
        with pytest.raises(availability.Unavailable):
            push(personas)
    assert caught.value.as_dict()["code"] == "unavailable"
    todo.refresh_from_db()
    assert (todo.state, todo.attempt) == ("pending", 0)
    assert not Attempt.objects.exists()
    assert Todo.objects.count() == 1


def test_over_rest_a_late_request_is_503_unavailable_with_retry_after(
    personas: Personas, client: Client, settings: Any
) -> None:
    push(personas)
    settings.REQUEST_DEADLINE_SECONDS = -1
    response = Api(client, personas.agent_token).verb("claim_next")
    assert response.status_code == 503
    assert response.json()["code"] == "unavailable"
    assert int(response["Retry-After"]) >= 1
    assert not Attempt.objects.exists()


@pytest.fixture
def stalled_redis(settings: Any) -> Iterator[None]:
    """A Redis that accepts the connection and never answers (as a SIGSTOPped one does)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    settings.REDIS_URL = f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    settings.REDIS_TIMEOUT_SECONDS = 0.5
    counters.reset_client()
    try:
        yield
    finally:
        counters.reset_client()
        availability.redis_breaker.reset()
        listener.close()


def test_a_stalled_redis_costs_one_request_its_timeout_not_every_request(
    stalled_redis: None,
) -> None:
    started = time.monotonic()
    assert ratelimit.take("stall", rate=10, burst=10) == (True, 0)
    first = time.monotonic() - started
    started = time.monotonic()
    for _ in range(50):
        assert ratelimit.take("stall", rate=10, burst=10) == (True, 0)
    rest = time.monotonic() - started
    assert first >= 0.5  # the one that found out waited its timeout...
    assert rest < 0.5  # ...and the fifty after it did not wait on Redis at all


def test_metrics_reports_unreadable_counters_as_collection_errors(
    stalled_redis: None, client: Client
) -> None:
    response = client.get("/metrics", headers={"Authorization": "Bearer test-metrics-token"})
    assert response.status_code == 200
    text = response.content.decode()
    errors = [
        line for line in text.splitlines() if line.startswith("switchboard_metrics_collection_")
    ]
    assert any('collector="counters"' in line and not line.endswith(" 0.0") for line in errors)


def test_a_flush_resent_after_its_answer_was_lost_is_applied_once(db: None) -> None:
    key = counters.label_key({"queue": "inbox", "source": "api"})
    batch = Counter({(metrics.CREATED, key): 3})
    counters._unacknowledged.append(("flush-1", batch.copy()))
    counters.flush()
    # Redis applied it, but say the answer was lost: the same flush is sent again.
    counters._unacknowledged.append(("flush-1", batch.copy()))
    counters.flush()
    assert counters.value(metrics.CREATED, {"queue": "inbox", "source": "api"}) == 3
    counters._unacknowledged.append(("flush-2", batch.copy()))
    counters.flush()
    assert counters.value(metrics.CREATED, {"queue": "inbox", "source": "api"}) == 6


def test_the_last_flush_at_a_stop_tries_redis_though_a_stall_opened_the_breaker(
    db: None,
) -> None:
    # regress9b: a stop moments after a stall kept the increments and exited without a word.
    key = counters.label_key({"queue": "inbox", "source": "api"})
    counters._unacknowledged.append(("flush-stop", Counter({(metrics.CREATED, key): 4})))
    availability.redis_breaker.failed()  # Redis stalled a moment ago; it answers now
    counters.flush()
    assert counters._unacknowledged  # an ordinary flush skips Redis while the breaker is open
    assert counters.flush_at_exit() == 0
    assert counters.value(metrics.CREATED, {"queue": "inbox", "source": "api"}) == 4


def test_increments_a_stop_cannot_send_are_said_lost(stalled_redis: None, monkeypatch: Any) -> None:
    said: list[str] = []
    monkeypatch.setattr(counters.log, "warning", lambda msg, *args: said.append(msg % args))
    key = counters.label_key({"queue": "inbox", "source": "api"})
    counters._unacknowledged.append(("flush-lost", Counter({(metrics.CREATED, key): 5})))
    try:
        assert counters.flush_at_exit() == 5
        assert counters.flush_at_exit() == 0  # the next exit hook: said once, not waited again
    finally:
        counters._unacknowledged.clear()  # not to be sent to the next test's Redis
    lost = [line for line in said if "lost at exit" in line]
    assert lost == [said[-1]]
    assert lost[0].startswith("5 counter increments lost at exit: Redis did not answer")
