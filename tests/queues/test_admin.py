"""The admin: vend shows the token once, todo actions go through the services, attempts are
read-only."""

from __future__ import annotations

import re
from typing import Any

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
    # A fresh round of attempts; the attempt number goes on.
    assert (failed.state, failed.attempt, failed.max_attempts) == (TodoState.PENDING, 1, 6)


def test_todos_are_not_added_in_the_admin(personas: Personas) -> None:
    # The add form had no endpoint or queue (both read-only), so a superuser's save was a 500 on
    # the todo's queue CHECK; a todo is pushed through the services, never made here.
    client = admin_client(personas)
    form = {"title": "by hand", "payload": "{}", "priority": "0", "max_attempts": "3"}
    assert client.get("/admin/queues/todo/add/").status_code == 403
    assert client.post("/admin/queues/todo/add/", form).status_code == 403
    assert b"/admin/queues/todo/add/" not in client.get("/admin/queues/todo/").content
    assert not Todo.objects.exists()


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


def _staff(codenames: list[str]) -> Any:
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user("stan", password="pw-stan-123", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return user


# A person the owner or user field does not offer (only a superuser is offered anyone else).
NOT_OFFERED = "Select a valid choice. That choice is not one of the available choices."


def _errors(response: Any) -> list[str]:
    return re.findall(r'class="errorlist[^"]*"[^>]*>\s*<li>(.*?)</li>', response.content.decode())


def test_a_refused_vend_or_change_is_an_error_on_the_form_and_writes_nothing(
    personas: Personas,
) -> None:
    # The services' refusals were raised as ValidationError from save_model, where the admin has
    # no page for them: each of these was a 500. Now the write is the form's last check.
    from switchboard.ledger.models import LedgerEntry

    p = personas
    client = admin_client(p)
    entries = LedgerEntry.objects.count()
    vend = {"name": "Hooked", "owner": p.owner.pk, "queues": "inbox", "verbs": ["claim_next"]}
    response = client.post(
        "/admin/queues/endpoint/add/", {**vend, "notify_url": "http://127.0.0.1:9/hook"}
    )
    assert response.status_code == 200
    assert _errors(response) == [
        "notify_url is refused: the host 127.0.0.1 is a loopback address (127.0.0.1)"
    ]
    assert not Endpoint.objects.filter(name="Hooked").exists()

    change = {
        "name": "Agent",
        "owner": p.owner.pk,
        "notify_url": "",
        "default_lease_ttl_seconds": "",
        "rate_limit_rps": "",
        "rate_limit_burst": "0",
    }
    url = f"/admin/queues/endpoint/{p.agent.pk}/change/"
    response = client.post(url, change)
    assert response.status_code == 200
    assert _errors(response) == ["burst must be between 1 and 1000000"]
    # Beside its field: the rate_limit_burst row carries the error.
    assert re.search(r"errors field-rate_limit_burst", response.content.decode())
    response = client.post(
        url, {**change, "rate_limit_burst": "", "notify_url": "https://10.1.2.3/"}
    )
    assert _errors(response) == [
        "notify_url is refused: the host 10.1.2.3 is a private address (10.1.2.3)"
    ]
    assert LedgerEntry.objects.count() == entries  # none of the four refusals wrote a row

    services.endpoint_revoke(endpoint=p.agent2, actor=p.as_human(p.admin))
    entries = LedgerEntry.objects.count()
    response = client.post(
        f"/admin/queues/endpoint/{p.agent2.pk}/change/",
        {**change, "name": "Renamed", "rate_limit_burst": ""},
    )
    assert response.status_code == 200 and _errors(response) == ["the endpoint is revoked"]

    stan = _staff(["view_endpoint", "add_endpoint", "change_endpoint"])
    own, _ = services.endpoint_vend(actor=p.as_human(stan), owner=stan, name="Stan", queues=["a"])
    entries = LedgerEntry.objects.count()
    as_stan = Client()
    as_stan.force_login(stan)
    response = as_stan.post(
        f"/admin/queues/endpoint/{own.pk}/change/",
        {**change, "name": "Stan", "owner": p.owner.pk, "rate_limit_burst": ""},
    )
    assert _errors(response) == [NOT_OFFERED]  # only oneself is offered
    response = as_stan.post("/admin/queues/endpoint/add/", {**vend, "name": "For olive"})
    assert _errors(response) == [NOT_OFFERED]  # only oneself is offered

    p.agent.refresh_from_db()
    own.refresh_from_db()
    assert p.agent.rate_limit_burst is None and p.agent.notify_url == ""
    assert own.owner == stan and not Endpoint.objects.filter(name="For olive").exists()
    assert LedgerEntry.objects.count() == entries

    # And a change the service takes still lands, through it (its ledger row).
    response = client.post(url, {**change, "rate_limit_rps": "5", "rate_limit_burst": "10"})
    assert response.status_code == 302
    p.agent.refresh_from_db()
    assert (p.agent.rate_limit_rps, p.agent.rate_limit_burst) == (5.0, 10)
    assert LedgerEntry.objects.count() == entries + 1


def test_a_token_for_someone_else_is_refused_on_the_form(personas: Personas) -> None:
    from queues.models import HumanToken

    stan = _staff(["view_humantoken", "add_humantoken"])
    client = Client()
    client.force_login(stan)
    response = client.post(
        "/admin/queues/humantoken/add/", {"user": personas.owner.pk, "name": "x"}
    )
    assert response.status_code == 200
    assert _errors(response) == [NOT_OFFERED]  # only oneself is offered
    assert not HumanToken.objects.exists()
    response = client.post("/admin/queues/humantoken/add/", {"user": stan.pk, "name": "mine"})
    assert response.status_code == 302
    assert HumanToken.objects.get().user == stan


def test_a_crafted_changelist_lookup_or_selection_is_refused_not_a_500(
    personas: Personas,
) -> None:
    # A year Python's dates cannot hold, and action selections whose ids are not ids: the list's
    # invalid-lookup answer (?e=1) and a message, where each was a 500.
    from queues.models import HumanToken

    p = personas
    push(p, 1)
    services.human_token_create(user=p.admin, name="t", actor=p.as_human(p.admin))
    client = admin_client(p)
    year = "9" * 20
    for url in (
        "/admin/queues/endpoint/?created_at__year=-1",
        f"/admin/queues/endpoint/?created_at__year={year}",
        f"/admin/queues/todo/?created_at__year={year}",
        "/admin/queues/humantoken/?created_at__year=-1",
        "/admin/admission/admissionpolicy/?created_at__year=-1",
        f"/admin/ledger/ledgerentry/?at__year={year}",
        # The year after 9999 ends Django's range: not a date Python holds.
        "/admin/ledger/ledgerentry/?at__year=9999",
        "/admin/queues/todo/?created_at__year=9999",
        "/admin/admission/admissionwindow/?window_start__year=9999",
    ):
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].endswith("?e=1"), url
    for url, action in (
        ("/admin/queues/endpoint/", "revoke"),
        ("/admin/queues/todo/", "retry"),
        ("/admin/queues/humantoken/", "revoke"),
        ("/admin/admission/admissionpolicy/", "clear"),
    ):
        for selected in ("not-an-id", "", "00000000-0000-0000-0000-00000000000g"):
            response = client.post(
                url, {"action": action, "_selected_action": [selected]}, follow=True
            )
            assert response.status_code == 200, (url, selected)
            shown = [str(m) for m in response.context["messages"]]
            assert shown == ["Nothing done: the selection names no such item."], (url, shown)
    p.agent.refresh_from_db()
    assert p.agent.state == "active" and HumanToken.objects.get().revoked_at is None
    # A real selection still acts (confirmed: the revoke asks first).
    client.post(
        "/admin/queues/endpoint/",
        {"action": "revoke", "_selected_action": [str(p.agent2.pk)], "post": "yes"},
    )
    p.agent2.refresh_from_db()
    assert p.agent2.state == "revoked"


def test_a_list_is_not_filtered_through_a_relation_it_does_not_offer(personas: Personas) -> None:
    # Django 5.2.19 let a changelist's query string follow a reverse relation one step
    # (CVE-2026-127929): a staff member who may only view people learned from
    # "?endpoints=<id>" who owns an endpoint they cannot see, and from "?api_tokens=<id>"
    # whose a token is. 5.2.20 refuses such a lookup.
    p = personas
    token, _ = services.human_token_create(user=p.other_owner, name="t", actor=p.as_human(p.admin))
    client = Client()
    client.force_login(_staff(["view_user"]))
    # What the list offers still filters.
    offered = client.get("/admin/auth/user/?is_superuser__exact=1")
    assert offered.status_code == 200
    assert [u.username for u in offered.context["cl"].result_list] == [p.admin.username]
    for lookup in (
        f"endpoints={p.foreign.pk}",
        f"endpoints__exact={p.foreign.pk}",
        f"endpoints__id={p.foreign.pk}",
        f"api_tokens={token.pk}",
    ):
        # Refused as Django refuses every lookup a list does not offer: a bad request, on the
        # console's page for one.
        response = client.get(f"/admin/auth/user/?{lookup}")
        assert response.status_code == 400, lookup
        assert "The request is malformed." in response.content.decode(), lookup


def test_the_owner_and_user_fields_offer_only_oneself_unless_superuser(personas: Personas) -> None:
    # The vend and token forms listed every user to a staff owner, who may name only themselves.
    stan = _staff(["view_endpoint", "add_endpoint", "view_humantoken", "add_humantoken"])
    client = Client()
    client.force_login(stan)
    for url, field in (
        ("/admin/queues/endpoint/add/", "owner"),
        ("/admin/queues/humantoken/add/", "user"),
    ):
        html = client.get(url).content.decode()
        select = html[html.index(f'name="{field}"') :]
        select = select[: select.index("</select>")]
        offered = re.findall(r'<option value="(\d+)"', select)
        assert offered == [str(stan.pk)], (url, offered)
    html = admin_client(personas).get("/admin/queues/endpoint/add/").content.decode()
    select = html[html.index('name="owner"') :]
    assert str(personas.owner.pk) in select[: select.index("</select>")]
