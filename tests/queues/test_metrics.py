"""/metrics: the bearer token, the Switchboard series, counters that move only after commit."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.test import Client
from django.utils import timezone

from queues import pauses, services
from queues.models import Todo
from queues.services import Claimed
from switchboard.console.collectors import OTHER
from switchboard.core import counters
from tests.conftest import FIXTURE, Personas, push

TOKEN = "test-metrics-token"


def scrape() -> str:
    response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    return response.content.decode()


def test_metrics_needs_the_bearer_token(db: None, settings: object) -> None:
    client = Client()
    missing = client.get("/metrics")
    assert missing.status_code == 401 and b"a bearer token is required" in missing.content
    assert missing["WWW-Authenticate"] == 'Bearer realm="metrics"'
    wrong = client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong")
    assert wrong.status_code == 401 and b"not the metrics token" in wrong.content
    assert wrong["WWW-Authenticate"] == 'Bearer realm="metrics", error="invalid_token"'
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200


def test_a_scrape_reads_and_another_method_is_not_allowed(db: None) -> None:
    # POST was the CSRF check's 403, "this page is out of date" (a machine path's JSON).
    client = Client(enforce_csrf_checks=True)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    head = client.head("/metrics", headers=auth)
    assert head.status_code == 200 and head["Content-Type"].startswith("text/plain")
    for method in ("post", "put", "delete", "patch"):
        refused = getattr(client, method)("/metrics", headers=auth)
        assert refused.status_code == 405, method
        assert refused["Allow"] == "GET, HEAD", method


def test_metrics_refuses_everyone_when_no_token_is_configured(db: None, settings: object) -> None:
    settings.METRICS_TOKEN = ""  # type: ignore[attr-defined]
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 403


def test_the_switchboard_series_after_a_claim_cycle(tx_personas: Personas) -> None:
    p = tx_personas
    push(p, 3)
    push(p, 1, queue="outbox")
    claimed = services.claim_next(actor=p.as_agent(), queue="inbox")
    assert isinstance(claimed, Claimed)
    services.complete(actor=p.as_agent(), todo_id=claimed.todo.id)
    second = services.claim_next(actor=p.as_agent(), queue="inbox")
    assert isinstance(second, Claimed)
    services.fail(actor=p.as_agent(), todo_id=second.todo.id, error="x")
    text = scrape()
    assert 'switchboard_todos_created_total{queue="inbox",source="api"} 3.0' in text
    assert 'switchboard_todos_claimed_total{queue="inbox"} 2.0' in text
    assert 'switchboard_todos_completed_total{outcome="done",queue="inbox"} 1.0' in text
    assert 'switchboard_todos_completed_total{outcome="failed",queue="inbox"} 1.0' in text
    assert 'switchboard_todo_attempts_total{attempt_bucket="1",queue="inbox"} 2.0' in text
    assert 'switchboard_queue_todos{queue="inbox",state="pending"} 1.0' in text
    assert 'switchboard_queue_todos{queue="inbox",state="failed"} 1.0' in text
    assert 'switchboard_queue_todos{queue="outbox",state="pending"} 1.0' in text
    assert 'switchboard_queue_oldest_pending_seconds{queue="inbox"}' in text
    assert 'switchboard_queue_paused{queue="inbox"} 0.0' in text
    # No endpoint or owner label anywhere.
    assert "endpoint=" not in text and "owner=" not in text


def test_a_rolled_back_claim_counts_nothing(tx_personas: Personas) -> None:
    p = tx_personas
    push(p, 1)
    with pytest.raises(RuntimeError), transaction.atomic():
        claimed = services.claim_next(actor=p.as_agent())
        assert isinstance(claimed, Claimed)
        raise RuntimeError("roll it back")
    assert counters.value("switchboard_todos_claimed_total", {"queue": "inbox"}) == 0
    claimed = services.claim_next(actor=p.as_agent())
    assert isinstance(claimed, Claimed)
    assert counters.value("switchboard_todos_claimed_total", {"queue": "inbox"}) == 1


def test_the_queue_label_is_capped_with_an_overflow_bucket(
    tx_personas: Personas, settings: object
) -> None:
    settings.METRICS_MAX_QUEUES = 1  # type: ignore[attr-defined]
    p = tx_personas
    push(p, 2, queue="inbox")
    push(p, 1, queue="outbox")
    text = scrape()
    assert f'switchboard_queue_todos{{queue="{OTHER}",state="pending"}} 1.0' in text
    assert 'switchboard_queue_todos{queue="inbox",state="pending"} 2.0' in text
    assert 'switchboard_todos_created_total{queue="__other__",source="api"} 1.0' in text
    assert 'queue="outbox"' not in text


def test_the_overflow_bucket_counts_its_queues_flags_and_keeps_the_oldest_age(
    tx_personas: Personas, settings: object
) -> None:
    # A flag or a condition read 1 under __other__ however many of its queues had it.
    settings.METRICS_MAX_QUEUES = 1  # type: ignore[attr-defined]
    p = tx_personas
    push(p, 3, queue="inbox")
    others, _ = services.endpoint_vend(
        actor=FIXTURE, owner=p.owner, name="Others", queues=["q1", "q2", "q3"], rps=0
    )
    for queue in ("q1", "q2", "q3"):
        push(p, 1, queue=queue, endpoint=others)
    for queue in ("q1", "q2"):
        pauses.queue_pause(actor=p.as_human(p.admin), queue=queue, reason="draining")
    text = scrape()
    assert f'switchboard_queue_paused{{queue="{OTHER}"}} 2.0' in text
    assert f'switchboard_queue_condition{{condition="paused",queue="{OTHER}"}} 2.0' in text
    # q3, and the agent's outbox (in its scope, with no todo); its quarantine queue apart.
    assert f'switchboard_queue_condition{{condition="healthy",queue="{OTHER}"}} 2.0' in text
    assert f'switchboard_queue_condition{{condition="quarantine",queue="{OTHER}"}} 1.0' in text
    assert f'switchboard_queue_todos{{queue="{OTHER}",state="pending"}} 3.0' in text
    oldest = Todo.objects.filter(queue__in=["q1", "q2", "q3"]).order_by("created_at").first()
    assert oldest is not None
    (age,) = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(f'switchboard_queue_oldest_pending_seconds{{queue="{OTHER}"}}')
    ]
    assert age >= (timezone.now() - oldest.created_at).total_seconds() - 1
