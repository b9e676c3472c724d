"""The operator routes: endpoints (vend, list, revoke) and todos (create, list, get, retry,
release). Owners see and change their own; superusers all; auditors read all and change nothing;
foreign and unknown are both 404."""

from __future__ import annotations

import re
import uuid
from urllib.parse import quote

import pytest
from django.conf import settings
from django.test import Client

from queues import services
from queues.access import HumanActor
from queues.models import BASIC_VERBS, Endpoint, EndpointState, Todo, TodoState
from switchboard.core.errors import Forbidden, NotFound
from switchboard.ledger.models import LedgerEntry, LedgerKind
from tests.api.conftest import Api, human_token
from tests.conftest import FIXTURE, Personas, lapse, push


def test_an_owner_vends_an_endpoint_and_its_token_works_once_shown(
    personas: Personas, owner_api: Api, client: Client
) -> None:
    response = owner_api.post(
        "/api/v1/endpoints", {"name": "Night shift", "queues": ["inbox", "batch"], "rps": 0}
    )
    assert response.status_code == 201, response.content
    body = response.json()
    slug = body["endpoint"]["slug"]
    assert body["endpoint"]["owner"] == "olive"
    assert body["endpoint"]["scope_verbs"] == list(BASIC_VERBS)
    assert body["token"].startswith("sbk_")
    assert body["mcp_url"] == f"{settings.PUBLIC_URL}/mcp/{slug}"
    server = body["mcp_json"]["mcpServers"][f"switchboard-{slug}"]
    assert server == {
        "type": "http",
        "url": body["mcp_url"],
        "headers": {"Authorization": f"Bearer {body['token']}"},
    }
    families = {f["family"]: f for f in body["grantable"]}
    assert "lets the agent change its own budget" in families["policy"]["note"]
    assert families["policy"]["verbs"] == ["set_admission_policy", "clear_admission_policy"]

    agent = Api(client, body["token"])
    assert agent.verb("create_todo", {"queue": "batch", "title": "x"}).status_code == 200

    listed = owner_api.get("/api/v1/endpoints").json()["endpoints"]
    assert "token" not in listed[0]
    assert {e["slug"] for e in listed} == {"agent", personas.agent2.slug, slug}


def test_a_vend_with_bad_arguments_names_the_field(owner_api: Api) -> None:
    for body, field in [
        ({"name": "x", "queues": []}, "queues"),
        ({"name": "x", "queues": ["no spaces"]}, "queues"),
        ({"name": "x", "queues": ["inbox"], "verbs": ["launch_missiles"]}, "verbs"),
        ({"name": "", "queues": ["inbox"]}, "name"),
        ({"name": "x", "queues": ["inbox"], "rps": -1}, "rps"),
    ]:
        response = owner_api.post("/api/v1/endpoints", body)
        assert response.status_code == 400, (body, response.content)
        assert response.json()["field"] == field, response.json()


def test_only_a_superuser_vends_for_someone_else(
    personas: Personas, owner_api: Api, admin_api: Api
) -> None:
    body = {"name": "Theirs", "queues": ["inbox"], "owner": "otto"}
    assert owner_api.post("/api/v1/endpoints", body).status_code == 403
    made = admin_api.post("/api/v1/endpoints", body)
    assert made.status_code == 201 and made.json()["endpoint"]["owner"] == "otto"
    unknown = admin_api.post("/api/v1/endpoints", {**body, "owner": "nobody"})
    assert unknown.status_code == 400 and unknown.json()["field"] == "owner"


def test_auditors_read_every_endpoint_and_vend_or_revoke_none(
    personas: Personas, auditor_api: Api
) -> None:
    listed = auditor_api.get("/api/v1/endpoints").json()["endpoints"]
    assert {e["slug"] for e in listed} == {"agent", personas.agent2.slug, "foreign"}
    vend = auditor_api.post("/api/v1/endpoints", {"name": "x", "queues": ["inbox"]})
    assert vend.status_code == 403 and vend.json()["code"] == "forbidden"
    revoke = auditor_api.post("/api/v1/endpoints/agent/revoke")
    assert revoke.status_code == 403
    assert Endpoint.objects.get(slug="agent").state == EndpointState.ACTIVE


def test_owners_list_only_their_endpoints_and_superusers_all(
    personas: Personas, owner_api: Api, other_api: Api, admin_api: Api
) -> None:
    mine = {e["slug"] for e in owner_api.get("/api/v1/endpoints").json()["endpoints"]}
    theirs = {e["slug"] for e in other_api.get("/api/v1/endpoints").json()["endpoints"]}
    every = {e["slug"] for e in admin_api.get("/api/v1/endpoints").json()["endpoints"]}
    assert mine == {"agent", personas.agent2.slug} and theirs == {"foreign"}
    assert every == mine | theirs


def test_revoking_dead_letters_live_todos_and_kills_the_token(
    personas: Personas, owner_api: Api, client: Client
) -> None:
    push(personas, 2)
    response = owner_api.post("/api/v1/endpoints/agent/revoke")
    assert response.status_code == 200, response.content
    assert response.json()["dead_lettered"] == 2
    assert response.json()["endpoint"]["state"] == "revoked"
    todo = Todo.objects.filter(endpoint=personas.agent).first()
    assert todo is not None and todo.dead_letter and todo.result == {"error": "endpoint_revoked"}
    assert Api(client, personas.agent_token).verb("list_todos").status_code == 401


def test_a_foreign_or_unknown_endpoint_is_not_found(owner_api: Api) -> None:
    for slug in ("foreign", "no-such-endpoint"):
        response = owner_api.post(f"/api/v1/endpoints/{slug}/revoke")
        assert response.status_code == 404 and response.json()["code"] == "not_found"
    assert Endpoint.objects.get(slug="foreign").state == EndpointState.ACTIVE


def test_an_operator_creates_lists_and_reads_todos_of_owned_endpoints(
    personas: Personas, owner_api: Api
) -> None:
    body = {"endpoint": "agent", "queue": "inbox", "title": "by hand", "idempotency_key": "k"}
    made = owner_api.post("/api/v1/todos", body)
    assert made.status_code == 201 and made.json()["created"] is True
    again = owner_api.post("/api/v1/todos", body)
    assert again.status_code == 200 and again.json()["created"] is False
    todo_id = made.json()["todo"]["id"]
    push(personas, 1, endpoint=personas.agent2)
    push(personas, 1, endpoint=personas.foreign)

    listed = owner_api.get("/api/v1/todos").json()
    assert len(listed["todos"]) == 2 and listed["next_cursor"] is None
    only = owner_api.get("/api/v1/todos", endpoint="agent", state="pending").json()["todos"]
    assert [t["id"] for t in only] == [todo_id]
    assert owner_api.get(f"/api/v1/todos/{todo_id}").json()["todo"]["title"] == "by hand"
    page = owner_api.get("/api/v1/todos", limit=1).json()
    assert len(page["todos"]) == 1 and page["next_cursor"]


def test_a_cursor_goes_into_a_query_string_as_it_is(personas: Personas, owner_api: Api) -> None:
    """The cursor was ``<ISO instant>|<id>``: pasted into a URL unencoded, its ``+00:00`` came
    back as a space and the server refused its own cursor. Two of the three todos share their
    creation instant, so the page boundary falls between equal instants."""
    todos = push(personas, 3)
    Todo.objects.filter(id__in=[t.id for t in todos[1:]]).update(created_at=todos[0].created_at)
    expected = [str(t.id) for t in Todo.objects.order_by("created_at", "id")]
    seen: list[str] = []
    url = "/api/v1/todos?limit=1"
    while True:
        page = owner_api.client.get(url, headers=owner_api._headers()).json()
        seen += [t["id"] for t in page["todos"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
        assert re.fullmatch(r"[0-9]+_[0-9a-f]{32}", cursor) and quote(cursor, safe="") == cursor
        url = f"/api/v1/todos?limit=1&cursor={cursor}"
    assert seen == expected
    # One an older server gave out still reads; what no server gave out is refused.
    first = Todo.objects.get(id=expected[0])
    old = f"{first.created_at.isoformat()}|{first.id}"
    rest = owner_api.get("/api/v1/todos", cursor=old).json()["todos"]
    assert [t["id"] for t in rest] == expected[1:]
    hex_id = first.id.hex
    for bad in [
        "nonsense",
        f"-5_{hex_id}",
        f"{10**20}_{hex_id}",
        f"\u0661\u0662_{hex_id}",
        "12_abc",
    ]:
        refused = owner_api.get("/api/v1/todos", cursor=bad)
        assert refused.status_code == 400, (bad, refused.content)
        assert refused.json()["field"] == "cursor"


def test_an_operator_and_the_agent_read_the_same_instants_of_a_todo(
    personas: Personas, owner_api: Api, client: Client
) -> None:
    """The operator's answers cut instants to milliseconds (Django's encoder) where the agent's
    kept microseconds: a client comparing updated_at across the two saw a change that was not."""
    [todo] = push(personas, 1)
    services.claim(actor=personas.as_agent(), todo_id=todo.id)
    agent = Api(client, personas.agent_token).verb("get_todo", {"id": str(todo.id)}).json()
    operator = owner_api.get(f"/api/v1/todos/{todo.id}").json()
    listed = owner_api.get("/api/v1/todos").json()
    for field in ("created_at", "updated_at", "lease_expires_at"):
        assert operator["todo"][field] == agent["todo"][field], field
        assert listed["todos"][0][field] == agent["todo"][field], field
        assert agent["todo"][field].endswith("Z")


def test_todo_filters_and_ids_are_validated(owner_api: Api) -> None:
    assert owner_api.get("/api/v1/todos", state="sleeping").json()["field"] == "state"
    assert owner_api.get("/api/v1/todos", limit=0).json()["field"] == "limit"
    bad_id = owner_api.get("/api/v1/todos/not-a-uuid")
    assert bad_id.status_code == 400 and bad_id.json()["field"] == "id"
    assert owner_api.get("/api/v1/todos", endpoint="foreign").status_code == 404


def test_a_foreign_todo_is_not_found_for_an_owner(personas: Personas, owner_api: Api) -> None:
    (theirs,) = push(personas, 1, endpoint=personas.foreign)
    for method, path in [
        ("get", f"/api/v1/todos/{theirs.id}"),
        ("post", f"/api/v1/todos/{theirs.id}/retry"),
        ("post", f"/api/v1/todos/{theirs.id}/release"),
        ("get", f"/api/v1/todos/{uuid.uuid4()}"),
    ]:
        response = getattr(owner_api, method)(path)
        assert response.status_code == 404, (path, response.content)
    created = owner_api.post(
        "/api/v1/todos", {"endpoint": "foreign", "queue": "inbox", "title": "sneaky"}
    )
    assert created.status_code == 404
    # The slug came in the body: the refusal names its field, as every other refusal does.
    assert (created.json()["code"], created.json()["field"]) == ("not_found", "endpoint")
    listed = owner_api.get("/api/v1/todos", endpoint="foreign")
    assert (listed.status_code, listed.json()["field"]) == (404, "endpoint")
    # In the path the slug is the resource itself: no field.
    assert "field" not in owner_api.get("/api/v1/endpoints/foreign").json()
    assert Todo.objects.filter(endpoint=personas.foreign).count() == 1


def test_an_operator_retries_a_failed_todo_and_releases_a_claim(
    personas: Personas, owner_api: Api
) -> None:
    first, second = push(personas, 2)
    actor = personas.as_agent()
    services.claim(actor=actor, todo_id=first.id)
    services.fail(actor=actor, todo_id=first.id, error="boom")
    retried = owner_api.post(f"/api/v1/todos/{first.id}/retry")
    assert retried.status_code == 200, retried.content
    answered = retried.json()["todo"]
    assert (answered["state"], answered["attempt"], answered["max_attempts"]) == ("pending", 1, 6)

    services.claim(actor=actor, todo_id=second.id, require_fence=True)
    released = owner_api.post(f"/api/v1/todos/{second.id}/release")
    assert released.status_code == 200 and released.json()["todo"]["state"] == "pending"

    not_failed = owner_api.post(f"/api/v1/todos/{second.id}/retry")
    assert not_failed.status_code == 409 and not_failed.json()["code"] == "conflict"


def test_an_operators_release_naming_an_attempt_releases_only_that_claim(
    personas: Personas, owner_api: Api
) -> None:
    """persons11: a person's release of the claim they saw, sent after an agent took the todo
    over, released the agent's newer claim (the body's attempt was not read). ``?attempt=``
    names the claim, as the console's Release sends it."""
    (todo,) = push(personas, 1)
    agent = personas.as_agent()
    services.claim(actor=agent, todo_id=todo.id)
    lapse(todo)
    services.claim(actor=agent, todo_id=todo.id)  # the takeover: attempt 2
    stale = owner_api.post(f"/api/v1/todos/{todo.id}/release?attempt=1")
    assert stale.status_code == 409 and stale.json()["reason"] == "superseded", stale.content
    assert Todo.objects.get(pk=todo.pk).state == TodoState.CLAIMED
    for bad in ("0", "x", "1.5"):
        refused = owner_api.post(f"/api/v1/todos/{todo.id}/release?attempt={bad}")
        assert refused.status_code == 400 and refused.json()["field"] == "attempt", bad
    released = owner_api.post(f"/api/v1/todos/{todo.id}/release?attempt=2")
    assert released.status_code == 200 and released.json()["todo"]["state"] == "pending"


def test_auditors_read_every_todo_and_change_none(personas: Personas, auditor_api: Api) -> None:
    (todo,) = push(personas, 1)
    services.claim(actor=personas.as_agent(), todo_id=todo.id)
    assert auditor_api.get(f"/api/v1/todos/{todo.id}").status_code == 200
    assert len(auditor_api.get("/api/v1/todos").json()["todos"]) == 1
    for path in (f"/api/v1/todos/{todo.id}/release", f"/api/v1/todos/{todo.id}/retry"):
        response = auditor_api.post(path)
        assert response.status_code == 403 and response.json()["code"] == "forbidden"
    created = auditor_api.post(
        "/api/v1/todos", {"endpoint": "agent", "queue": "inbox", "title": "x"}
    )
    assert created.status_code == 403
    assert Todo.objects.get(pk=todo.pk).state == TodoState.CLAIMED


def test_humans_without_credentials_or_with_a_revoked_token_are_unauthorized(
    personas: Personas,
) -> None:
    assert Api(Client()).get("/api/v1/endpoints").status_code == 401
    token = human_token(personas.owner)
    row = personas.owner.api_tokens.get()
    services.human_token_revoke(actor=FIXTURE, token=row)
    response = Api(Client(), token).get("/api/v1/todos")
    assert response.status_code == 401 and response.json()["code"] == "unauthorized"


def test_an_agent_token_is_no_operator_credential(personas: Personas, client: Client) -> None:
    response = Api(client, personas.agent_token).get("/api/v1/endpoints")
    assert response.status_code == 401


def test_a_browser_session_works_and_its_writes_need_csrf(personas: Personas) -> None:
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(personas.owner)
    assert browser.get("/api/v1/todos").status_code == 200
    body = '{"endpoint": "agent", "queue": "inbox", "title": "from the page"}'
    refused = browser.post("/api/v1/todos", body, content_type="application/json")
    assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
    browser.get("/admin/login/")  # sets the CSRF cookie
    csrf = browser.cookies["csrftoken"].value
    made = browser.post(
        "/api/v1/todos", body, content_type="application/json", headers={"X-CSRFToken": csrf}
    )
    assert made.status_code == 201, made.content


def test_the_openapi_document_and_its_docs_page_are_served(db: None, client: Client) -> None:
    doc = client.get("/api/v1/openapi.json")
    assert doc.status_code == 200 and doc.json()["info"]["title"] == "Switchboard"
    assert client.get("/api/v1/docs").status_code == 200


def test_the_todo_services_decide_not_found_before_forbidden_for_an_auditor(
    personas: Personas, auditor_api: Api
) -> None:
    (todo,) = push(personas, 1)
    auditor = HumanActor(personas.auditor, via="api")
    for act in (services.todo_retry, services.todo_release, services.todo_discard):
        with pytest.raises(NotFound):
            act(actor=auditor, todo_id=uuid.uuid4())
        with pytest.raises(Forbidden, match="auditors read"):
            act(actor=auditor, todo_id=todo.id)
    for action in ("retry", "release", "discard"):
        unknown = auditor_api.post(f"/api/v1/todos/{uuid.uuid4()}/{action}")
        assert unknown.status_code == 404 and unknown.json()["code"] == "not_found"
        seen = auditor_api.post(f"/api/v1/todos/{todo.id}/{action}")
        assert seen.status_code == 403
        assert seen.json()["error"] == "auditors read; they do not change endpoints or todos"
    assert Todo.objects.get(pk=todo.pk).state == TodoState.PENDING


def _claimed_by_worker(p: Personas, max_attempts: int) -> Todo:
    [todo] = push(p, 1, max_attempts=max_attempts)
    services.claim(actor=p.as_agent(), todo_id=todo.id, claimant="worker-7")
    return todo


def test_the_operator_api_release_is_ledgered_and_the_last_attempt_dead_letters(
    personas: Personas, owner_api: Api
) -> None:
    p = personas
    again, last = _claimed_by_worker(p, 3), _claimed_by_worker(p, 1)
    for todo in (again, last):
        response = owner_api.post(f"/api/v1/todos/{todo.id}/release")
        assert response.status_code == 200, response.content

    rows = list(LedgerEntry.objects.filter(kind=LedgerKind.TODO_RELEASE).order_by("seq"))
    assert [(r.after["state"], r.after.get("dead_letter")) for r in rows] == [  # type: ignore[index, union-attr]
        ("pending", None),
        ("failed", True),
    ]
    assert {r.before["owner"] for r in rows} == {"worker-7"}  # type: ignore[index]
