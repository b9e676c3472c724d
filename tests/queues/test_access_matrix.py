"""One access layer: each "may this actor see or change X" question has one answer in
``queues.access``, and every surface (services, pages, the admin) gives that answer.

Personas: the endpoint's owner, another owner, an auditor, an admin (superuser), a pauser (holds
queues.pause_queue) and the agent (the owner's endpoint).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from admission import services as admission_services
from queues import access, pauses, services
from queues.access import Actor, AgentActor, HumanActor
from queues.models import Verb
from switchboard.core.errors import Conflict, Forbidden, NotFound
from tests.admission.conftest import budget
from tests.conftest import FIXTURE, Personas

PERSONAS = ["owner", "other_owner", "auditor", "admin", "pauser", "agent"]


def actor_of(p: Personas, name: str) -> Actor:
    if name == "agent":
        return p.as_agent()
    return p.as_human(getattr(p, name))


def outcome(call: Any) -> str:
    try:
        call()
    except Forbidden:
        return "forbidden"
    except NotFound:
        return "not_found"
    except Conflict:
        return "conflict"
    return "ok"


# --- budgets ---------------------------------------------------------------------------------

MAY_CHANGE_POLICY = {
    "owner": True,
    "other_owner": False,
    "auditor": False,
    "admin": True,
    "pauser": False,
    "agent": True,
}


@pytest.mark.parametrize("name", PERSONAS)
def test_who_may_change_a_budget_on_the_owners_endpoint(personas: Personas, name: str) -> None:
    actor = actor_of(personas, name)
    assert access.may_change_policy(actor, personas.agent, "inbox") is MAY_CHANGE_POLICY[name]
    assert access.may_change_policy(actor, personas.agent, "quarantine") is False


SET_POLICY_OUTCOME = {
    "owner": "ok",
    "other_owner": "not_found",  # another owner's endpoint does not leak its existence
    "auditor": "forbidden",
    "admin": "ok",
    "pauser": "not_found",
    "agent": "forbidden",  # the agent's grant lacks set_admission_policy
}


@pytest.mark.parametrize("name", PERSONAS)
def test_the_budget_service_gives_the_same_answer(personas: Personas, name: str) -> None:
    actor = actor_of(personas, name)
    got = outcome(
        lambda: admission_services.policy_set(
            actor=actor,
            endpoint=personas.agent,
            queue="inbox",
            max_in_flight=3,
            max_claims_per_window=None,
            window=None,
        )
    )
    assert got == SET_POLICY_OUTCOME[name]


def test_an_agent_granted_the_verb_sets_budgets_in_its_scope_only(personas: Personas) -> None:
    endpoint, _ = services.endpoint_vend(
        actor=FIXTURE,
        owner=personas.owner,
        name="Budgeter",
        queues=["inbox"],
        verbs=[Verb.CLAIM_NEXT, Verb.SET_ADMISSION_POLICY],
        rps=0,
    )
    agent = AgentActor(endpoint)
    set_inbox = lambda: admission_services.policy_set(  # noqa: E731
        actor=agent,
        endpoint=endpoint,
        queue="inbox",
        max_in_flight=1,
        max_claims_per_window=None,
        window=None,
    )
    set_outbox = lambda: admission_services.policy_set(  # noqa: E731
        actor=agent,
        endpoint=endpoint,
        queue="outbox",
        max_in_flight=1,
        max_claims_per_window=None,
        window=None,
    )
    assert outcome(set_inbox) == "ok"
    assert outcome(set_outbox) == "forbidden"
    assert access.may_change_policy(agent, personas.agent, "inbox") is False


@pytest.mark.parametrize("name", [n for n in PERSONAS if n != "agent"])
def test_the_budget_page_offers_the_editor_exactly_when_the_access_layer_allows(
    personas: Personas, name: str
) -> None:
    client = Client()
    client.force_login(getattr(personas, name))
    url = f"/budgets/{personas.agent.slug}/inbox"
    page = client.get(url)
    if name in ("other_owner", "pauser"):
        assert page.status_code == 404
        return
    assert page.status_code == 200
    assert page.context["can_write"] is MAY_CHANGE_POLICY[name]
    posted = client.post(url, {"max_in_flight": "2", "action": "preview"})
    assert (posted.status_code != 403) is MAY_CHANGE_POLICY[name]


# --- pausing ---------------------------------------------------------------------------------

CAN_PAUSE = {
    "owner": False,
    "other_owner": False,
    "auditor": False,
    "admin": True,
    "pauser": True,
    "agent": False,
}


@pytest.mark.parametrize("name", PERSONAS)
def test_who_may_pause_a_queue(personas: Personas, name: str) -> None:
    actor = actor_of(personas, name)
    assert access.can_pause(actor) is CAN_PAUSE[name]
    got = outcome(lambda: pauses.queue_pause(actor=actor, queue="inbox", reason="r", create=True))  # type: ignore[arg-type]
    assert got == ("ok" if CAN_PAUSE[name] else "forbidden")


def test_an_auditor_holding_the_pause_permission_still_may_not_pause(personas: Personas) -> None:
    personas.auditor.user_permissions.add(Permission.objects.get(codename="pause_queue"))
    assert access.can_pause(HumanActor(personas.auditor)) is False


@pytest.mark.parametrize("name", ["auditor", "pauser"])
def test_the_admin_pause_form_asks_the_access_layer(personas: Personas, name: str) -> None:
    """The admin's pause check used to forget auditors: a staff auditor holding
    queues.pause_queue (and the admin's view permission) got the pause form."""
    user = getattr(personas, name)
    user.is_staff = True
    user.save()
    user.user_permissions.add(
        Permission.objects.get(codename="pause_queue"),
        Permission.objects.get(codename="view_queuepause"),
    )
    client = Client()
    client.force_login(user)
    response = client.get("/admin/queues/queuepause/add/")
    assert response.status_code == (200 if name == "pauser" else 403)


ADMIN_LISTS = [
    ("/admin/queues/endpoint/", "view_endpoint"),
    ("/admin/queues/todo/", "view_todo"),
    ("/admin/queues/attempt/", "view_attempt"),
    ("/admin/queues/humantoken/", "view_humantoken"),
    ("/admin/ledger/ledgerentry/", "view_ledgerentry"),
    ("/admin/admission/admissionpolicy/", "view_admissionpolicy"),
    ("/admin/admission/admissionwindow/", "view_admissionwindow"),
]


@pytest.mark.parametrize("name", ["other_owner", "auditor", "admin"])
def test_the_admin_lists_what_the_access_layer_lets_the_human_read(
    personas: Personas, name: str
) -> None:
    """A staff owner holding the admin's view permissions used to see every owner's endpoints,
    todos (payloads included), attempts, token names and ledger rows there, where the console
    and the API answer not found. Every list now asks the access layer."""
    p = personas
    olives = budget(p, per="day", limit=9)
    created = services.todo_create(
        actor=p.as_agent(), endpoint=p.agent, queue="inbox", title="olives-secret-todo"
    )
    todo = created.todo
    services.claim(actor=p.as_agent(), todo_id=todo.id, claimant="olives-worker")
    services.complete(actor=p.as_agent(), todo_id=todo.id)  # its attempt's row; a window's
    services.human_token_create(user=p.owner, name="olives-token", actor=p.as_human())
    for other in (p.agent2, p.foreign):  # a list filter shows once it has two choices
        services.todo_create(actor=p.as_agent(other), endpoint=other, queue="inbox", title="x")
    budget(p, endpoint=p.foreign, max_in_flight=1)  # otto's own budget, set by a superuser
    user = getattr(p, name)
    user.is_staff = True
    user.save()
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=[perm for _, perm in ADMIN_LISTS])
    )
    client = Client()
    client.force_login(user)
    marks = {
        "/admin/queues/endpoint/": p.agent.slug,
        "/admin/queues/todo/": "olives-secret-todo",
        "/admin/queues/attempt/": "olives-worker",
        "/admin/queues/humantoken/": "olives-token",
        "/admin/ledger/ledgerentry/": f"endpoint:{p.agent.slug}",
        "/admin/admission/admissionpolicy/": f"/admin/admission/admissionpolicy/{olives.pk}/",
        "/admin/admission/admissionwindow/": f"budget on endpoint:{p.agent.slug}/inbox",
    }
    sees = {}
    for url, _ in ADMIN_LISTS:
        response = client.get(url)
        assert response.status_code == 200, url
        sees[url] = marks[url] in response.content.decode()
    expected = name != "other_owner"  # the auditor and the superuser read every row
    assert sees == {url: expected for url, _ in ADMIN_LISTS}
    # The lists' filters name only what the list holds (not every endpoint and owner).
    todos = client.get("/admin/queues/todo/").content.decode()
    assert (f"endpoint__id__exact={p.agent.id}" in todos) is expected
    endpoints = client.get("/admin/queues/endpoint/").content.decode()
    assert (f"owner__id__exact={p.owner.pk}" in endpoints) is expected
    budgets = client.get("/admin/admission/admissionpolicy/").content.decode()
    assert (f"endpoint__owner__id__exact={p.owner.pk}" in budgets) is expected
    # A row outside the list is not reachable by its address either.
    page = client.get(f"/admin/queues/todo/{todo.id}/change/")
    assert (page.status_code == 200) is expected
    # Nor offered by a form: the budget form's endpoint choices.
    user.user_permissions.add(Permission.objects.get(codename="add_admissionpolicy"))
    form = client.get("/admin/admission/admissionpolicy/add/").content.decode()
    assert (f'value="{p.agent.id}"' in form) is expected


# --- endpoints, todos and tokens ---------------------------------------------------------------
# --- endpoints, todos and tokens ---------------------------------------------------------------

TODO_WRITE = {
    "owner": "ok",
    "other_owner": "forbidden",
    "auditor": "forbidden",
    "admin": "ok",
    "pauser": "forbidden",
    "agent": "ok",
}


@pytest.mark.parametrize("name", PERSONAS)
def test_who_may_change_the_owners_endpoint_todos(personas: Personas, name: str) -> None:
    actor = actor_of(personas, name)
    got = outcome(lambda: access.check_todo_write(actor, personas.agent))
    assert got == TODO_WRITE[name]
    if isinstance(actor, HumanActor):
        assert access.may_act(actor, personas.agent) is (TODO_WRITE[name] == "ok")
    pushed = outcome(
        lambda: services.todo_create(actor=actor, endpoint=personas.agent, queue="inbox", title="t")
    )
    assert pushed == TODO_WRITE[name]


ACTS_FOR_OWNER = {
    "owner": "ok",
    "other_owner": "forbidden",
    "auditor": "forbidden",
    "admin": "ok",
    "pauser": "forbidden",
}


@pytest.mark.parametrize("name", list(ACTS_FOR_OWNER))
def test_who_may_make_a_token_for_the_owner(personas: Personas, name: str) -> None:
    actor = HumanActor(getattr(personas, name))
    got = outcome(lambda: services.human_token_create(user=personas.owner, actor=actor))
    assert got == ACTS_FOR_OWNER[name]


@pytest.mark.parametrize("name", list(ACTS_FOR_OWNER))
def test_who_may_revoke_the_owners_endpoint(personas: Personas, name: str) -> None:
    actor = HumanActor(getattr(personas, name))
    got = outcome(lambda: services.endpoint_revoke(endpoint=personas.agent, actor=actor))
    assert got == ACTS_FOR_OWNER[name]


@pytest.mark.parametrize("name", PERSONAS)
def test_an_agent_reaches_only_its_scope(personas: Personas, name: str) -> None:
    actor = actor_of(personas, name)
    got = outcome(lambda: access.check_scope(actor, "nightly"))
    assert got == ("forbidden" if name == "agent" else "ok")
