"""One validation at the edge: nothing that cannot be stored gets in, through any surface, and
each refusal names the field. A row stored behind the services' back never breaks the queue."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client

from admission.models import AdmissionPolicy
from queues import services
from queues.models import Todo
from switchboard.core import validation
from switchboard.core.errors import InvalidArgument
from switchboard.core.verbs import get as verb
from tests.api.conftest import Api, human_token, mcp_tool
from tests.conftest import FIXTURE, Personas, audit_rows, push, self_budgeting


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"n": value}
    return value


def refused_field(response: Any, status: int = 400) -> str:
    assert response.status_code == status, response.content
    body = response.json()
    assert body["code"] == "invalid_argument", body
    return str(body["field"])


def create(api: Api, **fields: Any) -> Any:
    return api.verb("create_todo", {"queue": "inbox", "title": "t", **fields})


# --- strings ------------------------------------------------------------------------------------


def test_a_nul_in_a_text_field_is_refused_naming_it(agent_api: Api) -> None:
    assert refused_field(create(agent_api, title="a\x00b")) == "title"
    assert refused_field(create(agent_api, kind="k\x00")) == "kind"
    assert refused_field(create(agent_api, idempotency_key="\x00")) == "idempotency_key"
    assert not Todo.objects.exists()


def test_a_nul_or_lone_surrogate_inside_json_is_refused_with_its_path(agent_api: Api) -> None:
    assert refused_field(create(agent_api, payload={"a": [1, "x\x00"]})) == "payload.a.1"
    raw = '{"queue": "inbox", "title": "t", "payload": {"s": "\\ud800"}}'
    assert refused_field(agent_api.verb("create_todo", raw=raw)) == "payload.s"
    raw = '{"queue": "inbox", "title": "t", "payload": {"\\u0000": 1}}'
    assert refused_field(agent_api.verb("create_todo", raw=raw)).startswith("payload.")
    assert not Todo.objects.exists()


def test_a_body_not_in_utf8_or_giving_a_name_twice_is_refused_naming_the_body(
    agent_api: Api,
) -> None:
    # json.loads reads UTF-16 and UTF-32 (RFC 8259: JSON between systems is UTF-8) and keeps
    # the last of two values of one name, where a proxy or a validator may act on the first:
    # both were taken, and acted on.
    text = '{"queue": "inbox", "title": "t"}'
    for encoding in ("utf-16", "utf-16-le", "utf-16-be", "utf-32"):
        refused = agent_api.verb("create_todo", raw=text.encode(encoding))
        assert refused_field(refused) == "body", encoding
        assert (
            refused.json()["error"]
            == "body: is not UTF-8 (RFC 8259: JSON between systems is UTF-8)"
        )
    for raw, name in [
        ('{"queue": "inbox", "title": "a", "title": "b"}', "title"),
        ('{"queue": "inbox", "title": "t", "payload": {"k": 1, "k": 2}}', "k"),
        ('{"queue": "inbox", "title": "t", "payload": [{"k": 1, "k": 1}]}', "k"),
    ]:
        refused = agent_api.verb("create_todo", raw=raw)
        assert refused_field(refused) == "body", raw
        assert f'"{name}" twice in one object' in refused.json()["error"], raw
    assert not Todo.objects.exists()
    # A UTF-8 byte order mark is ignored (RFC 8259 allows it), as before.
    made = agent_api.verb("create_todo", raw=b"\xef\xbb\xbf" + text.encode())
    assert made.status_code == 200, made.content and Todo.objects.count() == 1


def test_a_budgets_window_is_named_in_brackets_whatever_refuses_it(
    personas: Personas, owner_api: Api, agent_api: Api
) -> None:
    """The services name a budget's windows ``windows[1].tz``; the edge's walk of the JSON named
    what it refused (a NUL, a lone surrogate, a number past a double) ``windows.0.start``."""
    budgeter = Api(Client(), self_budgeting(personas)[1])
    url = "/api/v1/admission/endpoint:agent/inbox"
    window = '{"period": "hour", "tz": "UTC", "limit": 10, "start": "00:00"}'
    for bad, field in [
        (window.replace('"00:00"', '"\\u0000"'), "windows[0].start"),
        (window.replace('"00:00"', '"\\ud800"'), "windows[0].start"),
        (window.replace('"UTC"', '"UTC\\u0000"'), "windows[0].tz"),
        (window.replace("10", "1e999"), "windows[0].limit"),
    ]:
        body = f'{{"windows": [{window}, {bad}]}}'
        response = owner_api.client.put(
            url, body, content_type="application/json", headers=owner_api._headers()
        )
        assert refused_field(response) == field.replace("[0]", "[1]"), body
        policy = f'{{"queue": "inbox", "policy": {{"windows": [{bad}]}}}}'
        refused = budgeter.verb("set_admission_policy", raw=policy)
        assert refused_field(refused) == f"policy.{field}", policy
    # Inside a stored field a list keeps its dotted index, whatever its key is called.
    payload = {"windows": [{"start": "\x00"}]}
    assert refused_field(create(agent_api, payload=payload)) == "payload.windows.0.start"
    assert not AdmissionPolicy.objects.exists() and not Todo.objects.exists()


def test_a_nul_in_the_query_or_path_is_a_json_400(personas: Personas) -> None:
    api = Api(Client(), human_token(personas.owner))
    response = api.get("/api/v1/todos", queue="in\x00box")
    assert refused_field(response) == "queue"
    response = api.client.get("/api/v1/admission/endpoint:agent/in%00box", headers=api._headers())
    assert refused_field(response) == "path"


# --- numbers and types --------------------------------------------------------------------------


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e309", "-1e400"])
def test_non_finite_numbers_are_refused(agent_api: Api, literal: str) -> None:
    raw = f'{{"queue": "inbox", "title": "t", "payload": {{"x": [{literal}]}}}}'
    assert refused_field(agent_api.verb("create_todo", raw=raw)) == "payload.x.0"
    assert not Todo.objects.exists()


def test_an_integer_longer_than_python_reads_is_refused_in_plain_words(agent_api: Api) -> None:
    raw = '{"queue": "inbox", "title": "t", "payload": {"x": 1%s}}' % ("0" * 5000)
    response = agent_api.verb("create_todo", raw=raw)
    assert refused_field(response) == "body"
    assert response.json()["error"] == (
        "body: is not valid JSON (a number has more than 4300 digits)"
    )
    assert not Todo.objects.exists()
    # One Python reads is stored as it was sent, and read back the same.
    long = int("9" * 4000)
    created = create(agent_api, payload={"x": long})
    assert created.status_code == 200, created.content
    assert Todo.objects.get().payload == {"x": long}


@pytest.mark.parametrize(
    ("verb_name", "body", "field"),
    [
        ("claim_next", {"lease_ttl_seconds": True}, "lease_ttl_seconds"),
        ("claim_next", {"lease_ttl_seconds": "300"}, "lease_ttl_seconds"),
        ("claim_next", {"require_fence": "true"}, "require_fence"),
        ("claim_next", {"require_fence": 1}, "require_fence"),
        ("create_todo", {"queue": "inbox", "title": "t", "max_attempts": "3"}, "max_attempts"),
        ("create_todo", {"queue": "inbox", "title": 5}, "title"),
        ("list_todos", {"limit": True}, "limit"),
    ],
)
def test_types_are_strict(agent_api: Api, verb_name: str, body: Any, field: str) -> None:
    assert refused_field(agent_api.verb(verb_name, body)) == field


def test_a_vend_refuses_a_boolean_or_string_number(owner_api: Api) -> None:
    base = {"name": "n", "queues": ["inbox"]}
    assert refused_field(owner_api.post("/api/v1/endpoints", {**base, "burst": True})) == "burst"
    assert refused_field(owner_api.post("/api/v1/endpoints", {**base, "rps": "5"})) == "rps"


# --- depth and size -----------------------------------------------------------------------------


def test_json_deeper_than_the_limit_is_refused(agent_api: Api) -> None:
    field = refused_field(create(agent_api, payload=nested(validation.MAX_JSON_DEPTH)))
    assert field.startswith("payload.n.n")
    deep = '{"queue": "inbox", "title": "t", "payload": ' + "[" * 5000 + "]" * 5000 + "}"
    assert refused_field(agent_api.verb("create_todo", raw=deep)) == "body"
    assert create(agent_api, payload=nested(validation.MAX_JSON_DEPTH - 3)).status_code == 200


def test_the_deepest_payload_one_surface_stores_every_surface_carries(
    personas: Personas, agent_api: Api
) -> None:
    """The CLI stored a payload 64 levels deep, which REST (the body is a level) and MCP (three
    levels of message) then refused: a todo no other surface could make again."""
    p = personas
    deepest = nested(validation.MAX_STORED_JSON_DEPTH)
    deeper = json.dumps(nested(validation.MAX_STORED_JSON_DEPTH + 1))
    with pytest.raises(CommandError, match=r"payload.*nested deeper than 61 levels"):
        call_command("todo", "push", p.agent.slug, "inbox", "--title", "t", "--payload", deeper)
    call_command(
        "todo",
        "push",
        p.agent.slug,
        "inbox",
        "--title",
        "cli",
        "--payload",
        json.dumps(deepest),
        stdout=io.StringIO(),
    )
    assert refused_field(
        agent_api.verb(
            "create_todo", raw=f'{{"queue": "inbox", "title": "t", "payload": {deeper}}}'
        )
    ).startswith("payload.")
    assert create(agent_api, title="rest", payload=deepest).status_code == 200
    arguments = {"queue": "inbox", "title": "mcp", "payload": deepest}
    result = mcp_tool(p.agent.slug, p.agent_token, "create_todo", arguments)
    assert result["isError"] is False, result
    stored = Todo.objects.filter(title__in=["cli", "rest", "mcp"]).values_list("payload", flat=True)
    assert list(stored) == [deepest] * 3


def test_a_payload_over_the_size_limit_is_refused(agent_api: Api) -> None:
    big = {"blob": "x" * (validation.MAX_JSON_BYTES + 1)}
    response = create(agent_api, payload=big)
    assert refused_field(response) == "payload"
    assert response.json()["limit"] == validation.MAX_JSON_BYTES


def test_a_result_is_bounded_too(personas: Personas, agent_api: Api) -> None:
    todo = push(personas)[0]
    assert agent_api.verb("claim", {"id": str(todo.id)}).status_code == 200
    response = agent_api.verb("complete", {"id": str(todo.id), "result": nested(80)})
    assert refused_field(response).startswith("result.")
    todo.refresh_from_db()
    assert todo.state == "claimed"


# --- names --------------------------------------------------------------------------------------


def test_a_name_with_a_trailing_newline_is_refused_everywhere(
    personas: Personas, agent_api: Api, owner_api: Api
) -> None:
    assert refused_field(create(agent_api, queue="inbox\n")) == "queue"
    vend = owner_api.post("/api/v1/endpoints", {"name": "n", "queues": ["nlq\n"]})
    assert refused_field(vend) == "queues"
    client = Client()
    client.force_login(personas.admin)
    paused = client.post("/api/v1/queues/pol%0A/pause", {"reason": "r"}, "application/json")
    assert paused.status_code == 400, paused.content
    assert validation.fullmatch(r"^[a-z]+$", "abc\n") is False
    # A budget's read and clear refuse it too: they looked it up and said "no budget on ...".
    budget = "/api/v1/admission/endpoint:agent/inbox%0A"
    assert refused_field(owner_api.client.get(budget, headers=owner_api._headers())) == "queue"
    assert refused_field(owner_api.delete(budget)) == "queue"
    for subcommand in ("show", "clear"):
        err = io.StringIO()
        with pytest.raises(CommandError) as caught:
            call_command("queue", "budget", subcommand, "agent", "inbox\n", "--as", "olive", "--json",
                         stdout=io.StringIO(), stderr=err)  # fmt: skip
        assert caught.value.returncode == 1 and json.loads(err.getvalue())["field"] == "queue"


# --- query parameters ---------------------------------------------------------------------------


def test_every_get_operation_refuses_a_query_parameter_it_does_not_take(
    personas: Personas,
) -> None:
    """ninja reads the parameters an operation declares and would ignore the rest: a mistyped
    filter (``?stauts=revoked``) answered as if there were none. Every GET of the document,
    so one added later is held to it too. Each as whom its security names: an operator, or
    the agent (the agents' event stream checks the token first)."""
    operator = Api(Client(), human_token(personas.admin))
    agent = Api(Client(), personas.agent_token)
    todo = push(personas, 1)[0]
    values = {"id": str(todo.id), "scope": "endpoint:agent", "queue": "inbox"}
    document = operator.get("/api/v1/openapi.json").json()
    checked = []
    for path, operations in document["paths"].items():
        if "get" not in operations:
            continue
        agents = {"VerbAuth": []} in operations["get"].get("security", [])
        api = agent if agents else operator
        url = re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], path)
        answers = operations["get"]["responses"]["200"].get("content", {})
        if "text/event-stream" not in answers:  # a stream is not opened here; its refusal is
            assert api.get(url).status_code != 400, url  # the 400 below is the parameter's
        response = api.get(url, stauts="active")
        assert refused_field(response) == "stauts", url
        declared = sorted(
            p["name"] for p in operations["get"].get("parameters", []) if p["in"] == "query"
        )
        takes = ", ".join(declared) or "none"
        assert response.json()["error"] == (
            f"stauts: not a query parameter of this operation (it takes {takes})"
        ), url
        checked.append(url)
    assert len(checked) >= 9, checked
    assert "/api/v1/todos" in checked and "/api/v1/endpoints" in checked
    assert "/api/v1/agent/events" in checked


def test_an_unnamed_or_unprintable_query_parameter_is_refused(
    personas: Personas, owner_api: Api
) -> None:
    headers = owner_api._headers()
    for query, field in [("=1", "query"), ("&=x", "query"), ("%C2%BF=null", "\u00bf")]:
        response = owner_api.client.get(f"/api/v1/endpoints?{query}", headers=headers)
        assert refused_field(response) == field, query
    # The declared ones still filter, alone.
    services.endpoint_revoke(actor=FIXTURE, endpoint=personas.agent)
    listed = owner_api.get("/api/v1/endpoints", state="revoked").json()["endpoints"]
    assert [e["slug"] for e in listed] == ["agent"]


def test_a_write_with_a_parameter_it_does_not_take_changes_nothing(
    personas: Personas, owner_api: Api, agent_api: Api
) -> None:
    todo = push(personas, 1)[0]
    revoke = owner_api.client.post(
        "/api/v1/endpoints/agent/revoke?force=1", headers=owner_api._headers()
    )
    assert refused_field(revoke) == "force"
    discard = owner_api.client.post(
        f"/api/v1/todos/{todo.id}/discard?reason=typo", headers=owner_api._headers()
    )
    assert refused_field(discard) == "reason"
    claimed = agent_api.post("/api/v1/agent/claim_next?queue=inbox", {})
    assert refused_field(claimed) == "queue"
    personas.agent.refresh_from_db()
    todo.refresh_from_db()
    assert personas.agent.state == "active" and todo.state == "pending" and todo.attempt == 0


def test_every_write_that_takes_no_body_refuses_one_and_changes_nothing(
    personas: Personas, owner_api: Api
) -> None:
    """ninja reads no body where an operation declares none: a retry, a discard or a resume
    sent ``{"dry_run": true}`` acted, and a release sent ``{"attempt": 99}`` released whichever
    attempt held the claim. Every operation of the document without a request body, so one
    added later is held to it too; refused after the path's own checks, before the view."""
    todo = push(personas, 1)[0]
    values = {
        "id": str(todo.id),
        "slug": "agent",
        "queue": "inbox",
        "scope": "endpoint:agent",
        "kind": "pool",
        "name": "gpu",
    }
    document = owner_api.get("/api/v1/openapi.json").json()
    ledger = audit_rows().count()
    checked = []
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            if method in ("get", "head") or "requestBody" in operation:
                continue
            url = re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], path)
            send = getattr(owner_api.client, method)
            for body, field in [('{"dry_run": true}', "dry_run"), ("not json {", "body")]:
                response = send(
                    url, body, content_type="application/json", headers=owner_api._headers()
                )
                assert refused_field(response) == field, (method, url, response.content)
                assert response.json()["error"] == f"{field}: this operation takes no body"
            checked.append(f"{method} {path}")
    assert len(checked) >= 7, checked
    assert "post /api/v1/todos/{id}/release" in checked
    assert "delete /api/v1/admission/{scope}/{queue}" in checked
    todo.refresh_from_db()
    personas.agent.refresh_from_db()
    assert todo.state == "pending" and personas.agent.state == "active"
    assert audit_rows().count() == ledger


def test_a_fence_sent_in_a_body_is_refused_pointing_at_the_query(
    personas: Personas, owner_api: Api, agent_api: Api
) -> None:
    todo = push(personas, 1)[0]
    assert agent_api.verb("claim", {"id": str(todo.id)}).status_code == 200
    url = f"/api/v1/todos/{todo.id}/release"
    fenced = owner_api.post(url, {"attempt": 99})
    assert refused_field(fenced) == "attempt"
    assert fenced.json()["error"] == (
        "attempt: this operation takes no body; give it in the query, ?attempt="
    )
    todo.refresh_from_db()
    assert todo.state == "claimed" and todo.attempt == 1
    # In the query, where the operation takes it, the fence holds.
    stale = owner_api.post(f"{url}?attempt=99")
    assert stale.status_code == 409 and stale.json()["reason"] == "fence_mismatch"
    # A body that says nothing (no body, white space, an empty object) is no body.
    for empty in ["", " \n", "{}", "{ }"]:
        assert agent_api.verb("claim", {"id": str(todo.id)}).status_code in (200, 409)
        attempt = Todo.objects.get(id=todo.id).attempt
        released = owner_api.post(f"{url}?attempt={attempt}", raw=empty)
        assert released.status_code == 200, (empty, released.content)
        assert released.json()["todo"]["state"] == "pending"


def test_who_asks_and_the_declared_parameters_are_answered_first(
    personas: Personas, owner_api: Api
) -> None:
    """As a body's refusal: the credentials (401), the grant (403) and the parameters the
    operation declares come before a parameter it does not take."""
    anonymous = Client().get("/api/v1/endpoints?stauts=1")
    assert anonymous.status_code == 401, anonymous.content
    _, reader = services.endpoint_vend(
        actor=FIXTURE, owner=personas.owner, name="Reader", queues=["inbox"], verbs=["list_todos"]
    )
    ungranted = Api(Client(), reader).post("/api/v1/agent/claim_next?queue=inbox", {})
    assert ungranted.status_code == 403 and ungranted.json()["code"] == "forbidden"
    both = owner_api.get("/api/v1/todos", state="bogus", stauts="x")
    assert refused_field(both) == "state"


def test_a_parameter_of_one_value_given_twice_is_refused(owner_api: Api) -> None:
    """ninja took the last of ``?state=pending&state=done``: a page of done todos for a client
    that meant both."""
    twice = owner_api.client.get(
        "/api/v1/todos?state=pending&state=done", headers=owner_api._headers()
    )
    assert refused_field(twice) == "state"
    assert twice.json()["error"] == "state: given 2 times; it takes one value"
    assert owner_api.get("/api/v1/todos", state="pending").status_code == 200


def test_a_form_posted_to_the_api_is_refused_naming_the_body(
    owner_api: Api, agent_api: Api
) -> None:
    """A multipart body was parsed by the edge check from its stream, and the API's body bound
    then could not read it: a 500. Now the operation hears it is not JSON."""
    form = {"queue": "inbox", "title": "t"}
    multipart = owner_api.client.post("/api/v1/todos", form, headers=owner_api._headers())
    assert refused_field(multipart) == "body"
    urlencoded = owner_api.client.post(
        "/api/v1/todos",
        "queue=inbox&title=t",
        content_type="application/x-www-form-urlencoded",
        headers=owner_api._headers(),
    )
    assert refused_field(urlencoded) == "body"
    verb_form = agent_api.client.post(
        "/api/v1/agent/create_todo", form, headers=agent_api._headers()
    )
    assert refused_field(verb_form) == "body"
    # Past Django's in-memory bound the form is not read ahead: the API's bound answers it.
    big = owner_api.client.post(
        "/api/v1/todos",
        {"queue": "inbox", "title": "x" * (3 * 1024 * 1024)},
        headers=owner_api._headers(),
    )
    assert refused_field(big, 413) == "body"
    assert not Todo.objects.exists()


def test_a_method_a_path_does_not_take_is_refused_as_the_error_object(
    personas: Personas, agent_api: Api
) -> None:
    """ninja's 405 was the plain text "Method not allowed", which a client reading the error
    object cannot parse; ``DELETE /limits/queues/<name>`` (the queue priority's path, PUT
    only) is where a client naming a limit's kind meets it."""
    admin = Api(Client(), human_token(personas.admin))
    cases = [
        (agent_api, "get", "/api/v1/agent/claim_next", ["POST"]),
        (admin, "patch", "/api/v1/todos", ["GET", "HEAD", "POST"]),
        (admin, "delete", "/api/v1/limits/queues/inbox", ["PUT"]),
    ]
    for api, method, path, allowed in cases:
        response = getattr(api.client, method)(path, headers=api._headers())
        assert response.status_code == 405, (path, response.content)
        assert response["Allow"] == ", ".join(allowed)
        assert response.json() == {
            "error": f"{method.upper()} is not a method of this path; it takes "
            + ", ".join(allowed),
            "code": "method_not_allowed",
            "method": method.upper(),
            "allowed": allowed,
        }
    # A limit's kind is one of three in the document, so no client is led to that path.
    document = admin.get("/api/v1/openapi.json").json()
    delete = document["paths"]["/api/v1/limits/{kind}/{name}"]["delete"]
    kind = next(p for p in delete["parameters"] if p["name"] == "kind")
    assert kind["schema"]["enum"] == ["pool", "tag", "rate"]


def test_every_path_that_takes_get_answers_head_as_its_get_without_the_body(
    personas: Personas,
) -> None:
    """RFC 9110: a server that serves GET serves HEAD; ninja answered 405 on every GET route."""
    push(personas, 2)
    admin = Api(Client(), human_token(personas.admin))
    document = admin.get("/api/v1/openapi.json").json()
    paths = [
        path.replace("{scope}", "endpoint:agent").replace("{queue}", "inbox")
        for path, operations in document["paths"].items()
        if "get" in operations and "{" not in path.replace("{scope}", "").replace("{queue}", "")
    ]
    assert "/api/v1/todos" in paths and len(paths) >= 6
    for path in paths:
        # Some answers tick with the clock (a queue's oldest_pending_seconds, whose digits come
        # and go): the GET just before or just after holds the same body as the HEAD's, in one
        # of a few tries (a run saw 630, 631, 630 bytes for GET, HEAD, GET).
        for _ in range(5):
            got = admin.client.get(path, headers=admin._headers())
            head = admin.client.head(path, headers=admin._headers())
            again = admin.client.get(path, headers=admin._headers())
            if int(head["Content-Length"]) in {len(got.content), len(again.content)}:
                break
        assert head.status_code == got.status_code, (path, head.content)
        assert head.content == b"", path
        assert head["Content-Type"] == got["Content-Type"], path
        assert int(head["Content-Length"]) in {len(got.content), len(again.content)}, path
    # A path that takes no GET still refuses HEAD, as the error object.
    refused = admin.client.head("/api/v1/limits/queues/inbox", headers=admin._headers())
    assert refused.status_code == 405 and refused["Allow"] == "PUT"


def test_a_path_no_route_serves_is_refused_as_the_error_object(agent_api: Api) -> None:
    """Django's 404 page was HTML under /api and /mcp too (a mistyped verb, a trailing slash)."""
    for path in ["/api/v1/agent/claim_nxt", "/api/v1/agent/claim_next/", "/api/v2/todos"]:
        response = agent_api.post(path, {})
        assert response.status_code == 404, (path, response.content)
        assert response.json() == {
            "error": f"no such path: POST {path}",
            "code": "not_found",
            "path": path,
        }
    rpc = agent_api.post("/mcp/agent/extra", {"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert rpc.status_code == 404
    assert rpc.json()["error"]["data"]["code"] == "not_found", rpc.content
    page = Client().get("/no/such/page")
    assert page.status_code == 404 and page["Content-Type"].startswith("text/html")


# --- the other surfaces -------------------------------------------------------------------------


def test_mcp_tool_arguments_get_the_same_check(personas: Personas) -> None:
    spec = verb("create_todo")
    assert spec is not None
    cases = [
        ({"queue": "inbox", "title": "t", "payload": {"x": float("nan")}}, "payload.x"),
        ({"queue": "inbox", "title": "t", "payload": [float("inf")]}, "payload.0"),
        ({"queue": "inbox", "title": "t\x00"}, "title"),
        ({"queue": "inbox", "title": "t", "payload": nested(70)}, "payload.n"),
        ({"queue": "inbox", "title": "t", "max_attempts": True}, "max_attempts"),
    ]
    for arguments, field in cases:
        with pytest.raises(InvalidArgument) as caught:
            spec.parse(arguments)
        assert caught.value.field.startswith(field), (arguments, caught.value.field)


def test_mcp_refuses_a_nan_argument_as_an_error_result(personas: Personas, client: Client) -> None:
    from tests.mcp.test_mcp_http import Mcp

    session = Mcp(client, personas.agent.slug, personas.agent_token)
    session.initialize()
    raw = (
        '{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "create_todo", '
        '"arguments": {"queue": "inbox", "title": "t", "payload": {"x": NaN}}}}'
    )
    response = session.post(None, raw=raw)
    assert response.status_code == 200, response.content
    answer = response.json()
    assert answer["id"] == 7
    assert answer["result"]["isError"] is True
    assert "payload.x" in answer["result"]["content"][0]["text"]
    assert not Todo.objects.exists()


def test_the_cli_refuses_a_non_finite_payload_with_exit_1(personas: Personas) -> None:
    err = io.StringIO()
    with pytest.raises(CommandError) as caught:
        call_command(
            "todo",
            "push",
            personas.agent.slug,
            "inbox",
            "--title",
            "t",
            "--payload",
            '{"x": NaN}',
            "--json",
            stdout=io.StringIO(),
            stderr=err,
        )
    assert caught.value.returncode == 1
    assert json.loads(err.getvalue())["field"] == "payload.x"
    assert not Todo.objects.exists()


def test_the_services_refuse_what_the_edge_refuses(personas: Personas) -> None:
    with pytest.raises(InvalidArgument) as caught:
        push(personas, payload={"deep": nested(80)})
    assert caught.value.field.startswith("payload.deep")
    with pytest.raises(InvalidArgument):
        services.endpoint_vend(actor=FIXTURE, owner=personas.owner, name="n\x00", queues=["inbox"])


# --- defence in depth: a row nobody could render --------------------------------------------------


POISONS = {
    "nested 300 deep": "[" * 300 + "]" * 300,
    "nested 5000 deep": "[" * 5000 + "]" * 5000,
    # jsonb keeps the number and writes it out as 5,001 digits, longer than Python reads.
    "an integer of 5001 digits": '{"n": 1e5000}',
    "a negative one": "[-1e5000]",
    # Python reads this one as a float, which overflows: not a number JSON can say.
    "a decimal beyond a double": '{"n": 1' + "0" * 400 + ".5}",
}


@pytest.mark.parametrize("poison_json", POISONS.values(), ids=POISONS.keys())
def test_a_poison_row_never_breaks_the_queue(
    personas: Personas, agent_api: Api, poison_json: str
) -> None:
    good, poison = push(personas, 2)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE queues_todo SET payload = %s::jsonb, created_at = created_at - interval '1h' "
            "WHERE id = %s",
            [poison_json, poison.id],
        )

    listed = agent_api.verb("list_todos", {"queue": "inbox"})
    assert listed.status_code == 200, listed.content
    shown = {t["id"]: t["payload"] for t in listed.json()["todos"]}
    assert shown[str(poison.id)] == validation.UNREADABLE
    assert shown[str(good.id)] == {}
    assert agent_api.verb("get_todo", {"id": str(poison.id)}).status_code == 200

    claimed = agent_api.verb("claim_next", {"queue": "inbox"})
    assert claimed.status_code == 200, claimed.content
    body = claimed.json()
    assert (body["todo"]["id"], body["attempt"]) == (str(poison.id), 1)
    assert body["todo"]["payload"] == validation.UNREADABLE
    # The agent received it, so the attempt was not burned: it can fail it like any other.
    failed = agent_api.verb("fail", {"id": str(poison.id), "error": "unreadable payload"})
    assert failed.status_code == 200, failed.content
    assert agent_api.verb("claim_next", {"queue": "inbox"}).json()["todo"]["id"] == str(good.id)
