"""One validation at the edge: nothing that cannot be stored gets in, through any surface, and
each refusal names the field. A row stored behind the services' back never breaks the queue."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client

from queues import services
from queues.models import Todo
from switchboard.core import validation
from switchboard.core.errors import InvalidArgument
from switchboard.core.verbs import get as verb
from tests.api.conftest import Api, human_token
from tests.conftest import FIXTURE, Personas, push


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


def test_a_nul_in_the_query_or_path_is_a_json_400(personas: Personas) -> None:
    api = Api(Client(), human_token(personas.owner))
    response = api.get("/api/v1/todos", queue="in\x00box")
    assert refused_field(response) == "queue"
    response = api.client.get("/api/v1/admission/endpoint:agent/in%00box", headers=api._headers())
    assert refused_field(response) == "path"


def test_a_nul_in_a_page_form_is_refused_before_the_view(personas: Personas) -> None:
    client = Client()
    client.force_login(personas.pauser)
    response = client.post("/queues/inbox/pause", {"reason": "up\x00grade"})
    assert response.status_code == 400
    assert response.json()["field"] == "reason"


# --- numbers and types --------------------------------------------------------------------------


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e309", "-1e400"])
def test_non_finite_numbers_are_refused(agent_api: Api, literal: str) -> None:
    raw = f'{{"queue": "inbox", "title": "t", "payload": {{"x": [{literal}]}}}}'
    assert refused_field(agent_api.verb("create_todo", raw=raw)) == "payload.x.0"
    assert not Todo.objects.exists()


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


@pytest.mark.parametrize("depth", [300, 5000])
def test_a_poison_row_never_breaks_the_queue(
    personas: Personas, agent_api: Api, depth: int
) -> None:
    good, poison = push(personas, 2)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE queues_todo SET payload = %s::jsonb, created_at = created_at - interval '1h' "
            "WHERE id = %s",
            ["[" * depth + "]" * depth, poison.id],
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
