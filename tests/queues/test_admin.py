"""The admin: vend shows the token once, todo actions go through the services, attempts are
read-only."""

from __future__ import annotations

import re

from django.test import Client

from queues import services
from queues.models import Attempt, Endpoint, Todo, TodoState
from tests.conftest import Personas, push


def admin_client(p: Personas) -> Client:
    client = Client()
    client.force_login(p.admin)
    return client


def test_vending_in_the_admin_shows_the_token_once_and_stores_its_hash(personas: Personas) -> None:
    client = admin_client(personas)
    response = client.post(
        "/admin/queues/endpoint/add/",
        {
            "name": "Night shift",
            "owner": personas.owner.pk,
            "queues": "inbox, nightly",
            "verbs": ["claim_next", "complete"],
        },
        follow=True,
    )
    assert response.status_code == 200
    body = response.content.decode()
    match = re.search(r"sbk_[A-Za-z0-9_-]{20,}", body)
    assert match, "the token is shown after the vend"
    endpoint = Endpoint.objects.get(name="Night shift")
    assert endpoint.scope_queues == ["inbox", "nightly"]
    assert endpoint.scope_verbs == ["claim_next", "complete"]
    assert endpoint.token_hash == services.hash_token(match.group(0))
    again = client.get(f"/admin/queues/endpoint/{endpoint.pk}/change/").content.decode()
    assert match.group(0) not in again


def test_the_admin_refuses_a_bad_vend_naming_the_problem(personas: Personas) -> None:
    response = admin_client(personas).post(
        "/admin/queues/endpoint/add/",
        {"name": "Bad", "owner": personas.owner.pk, "queues": "no spaces!", "verbs": ["claim"]},
    )
    assert response.status_code == 200
    assert "queues must be" in response.content.decode()
    assert not Endpoint.objects.filter(name="Bad").exists()


def test_todo_actions_retry_and_release_go_through_the_services(personas: Personas) -> None:
    claimed, failed = push(personas, 2)
    services.claim(actor=personas.as_agent(), todo_id=claimed.id)
    services.claim(actor=personas.as_agent(), todo_id=failed.id)
    services.fail(actor=personas.as_agent(), todo_id=failed.id)
    client = admin_client(personas)
    for action, todo in (("release", claimed), ("retry", failed)):
        response = client.post(
            "/admin/queues/todo/",
            {"action": action, "_selected_action": [str(todo.pk)]},
            follow=True,
        )
        assert response.status_code == 200
    claimed.refresh_from_db()
    failed.refresh_from_db()
    assert claimed.state == TodoState.PENDING and claimed.attempt == 1
    assert failed.state == TodoState.PENDING and failed.attempt == 0


def test_attempts_are_read_only_in_the_admin(personas: Personas) -> None:
    (todo,) = push(personas, 1)
    services.claim(actor=personas.as_agent(), todo_id=todo.id)
    services.complete(actor=personas.as_agent(), todo_id=todo.id)
    attempt = Attempt.objects.get(todo=todo)
    client = admin_client(personas)
    assert client.get("/admin/queues/attempt/add/").status_code == 403
    page = client.get(f"/admin/queues/attempt/{attempt.pk}/change/")
    assert page.status_code == 200
    assert b'name="claimant"' not in page.content
    response = client.post(f"/admin/queues/attempt/{attempt.pk}/delete/", {"post": "yes"})
    assert response.status_code == 403
    assert Attempt.objects.filter(pk=attempt.pk).exists()
    assert Todo.objects.filter(pk=todo.pk).exists()


def test_the_admin_pauses_and_resumes_through_the_service(personas: Personas) -> None:
    from queues.models import QueuePause
    from switchboard.ledger.models import LedgerEntry, LedgerKind

    push(personas, 1)
    client = Client()
    client.force_login(personas.admin)
    response = client.post(
        "/admin/queues/queuepause/add/", {"queue": "inbox", "reason": "upgrade"}, follow=True
    )
    assert response.status_code == 200
    pause = QueuePause.objects.get(queue="inbox")
    assert pause.reason == "upgrade" and pause.paused_by == personas.admin
    assert LedgerEntry.objects.filter(kind=LedgerKind.QUEUE_PAUSE, queue="inbox").count() == 1
    refused = client.post("/admin/queues/queuepause/add/", {"queue": "typo", "reason": "x"})
    assert refused.status_code == 200 and b"create" in refused.content.lower()
    assert not QueuePause.objects.filter(queue="typo").exists()
    client.post(
        "/admin/queues/queuepause/",
        {"action": "resume", "_selected_action": ["inbox"]},
        follow=True,
    )
    assert not QueuePause.objects.filter(queue="inbox").exists()
    assert LedgerEntry.objects.filter(kind=LedgerKind.QUEUE_RESUME, queue="inbox").count() == 1


def test_the_admin_pause_form_is_for_pausers_only(personas: Personas) -> None:
    from django.contrib.auth.models import Permission

    personas.owner.is_staff = True
    personas.owner.save()
    personas.owner.user_permissions.add(Permission.objects.get(codename="view_queuepause"))
    client = Client()
    client.force_login(personas.owner)
    assert client.get("/admin/queues/queuepause/add/").status_code == 403
