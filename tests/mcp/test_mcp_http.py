"""MCP over raw HTTP: the handshake era (sessions), the 2026-07-28 stateless era, and the
transport's refusals. The view is plain Django, so the test client drives it directly."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.test import Client

from admission.models import AdmissionPolicy
from queues import services
from queues.models import Todo
from switchboard import mcp
from switchboard.core import counters
from switchboard.core.verbs import load_verbs
from switchboard.embedded import free_port
from tests.conftest import FIXTURE, Personas, push, run_threads, self_budgeting
from tests.mcp.conftest import initialize

MODERN = "2026-07-28"
ACCEPT = "application/json, text/event-stream"


class Mcp:
    def __init__(self, client: Client, slug: str, token: str | None) -> None:
        self.client = client
        self.path = f"/mcp/{slug}"
        self.token = token
        self.session: str | None = None
        self.version: str | None = None

    def headers(self, **extra: str) -> dict[str, str]:
        headers = {"Accept": ACCEPT}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if self.session:
            headers["Mcp-Session-Id"] = self.session
        if self.version and self.version != MODERN:
            headers["MCP-Protocol-Version"] = self.version
        headers.update(extra)
        return headers

    def post(self, body: Any, *, raw: str | None = None, **headers: str) -> Any:
        data = raw if raw is not None else json.dumps(body)
        content_type = headers.pop("content_type", "application/json")
        return self.client.post(
            self.path, data, content_type=content_type, headers=self.headers(**headers)
        )

    def rpc(self, method: str, params: dict[str, Any] | None = None, id_: Any = 1) -> Any:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": id_, "method": method}
        if params is not None:
            message["params"] = params
        return self.post(message)

    def initialize(self, version: str = "2025-11-25") -> Any:
        response = self.rpc(
            "initialize",
            {
                "protocolVersion": version,
                "capabilities": {},
                "clientInfo": {"name": "test", "version": "0"},
            },
        )
        self.session = response["Mcp-Session-Id"]
        self.version = response.json()["result"]["protocolVersion"]
        assert (
            self.post({"jsonrpc": "2.0", "method": "notifications/initialized"}).status_code == 202
        )
        return response

    def modern(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        omit: tuple[str, ...] = (),
    ) -> Any:
        """A 2026-07-28 request with its envelope and the headers mirroring it (``headers``
        replacing any of them, ``omit`` leaving any out)."""
        meta = {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": {},
        }
        body: dict[str, Any] = {**(params or {}), "_meta": meta}
        message = {"jsonrpc": "2.0", "id": "m1", "method": method, "params": body}
        sent = {"MCP-Protocol-Version": MODERN, "Mcp-Method": method}
        if method == "tools/call":
            sent["Mcp-Name"] = (params or {}).get("name", "")
        if method == "resources/read":
            sent["Mcp-Name"] = (params or {}).get("uri", "")
        sent.update(headers or {})
        return self.post(message, **{k: v for k, v in sent.items() if k not in omit})


@pytest.fixture
def agent(personas: Personas, client: Client) -> Mcp:
    return Mcp(client, personas.agent.slug, personas.agent_token)


def held(personas: Personas) -> set[str]:
    return {name for name in load_verbs() if personas.agent.holds(name)}


def _call(session: Mcp, name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    """The tool result, with ``answer``: the JSON it carries (structured content, or on an error
    the text, since error results carry no structured content)."""
    response = session.rpc("tools/call", {"name": name, "arguments": arguments or {}})
    assert response.status_code == 200, response.content
    result: dict[str, Any] = response.json()["result"]
    answer = json.loads(result["content"][0]["text"])
    if result["isError"]:
        assert "structuredContent" not in result
    else:
        assert answer == result["structuredContent"]
    return {**result, "answer": answer}


def refusal(response: Any) -> dict[str, Any]:
    """The API error object a transport refusal carries as its JSON-RPC error's data."""
    body = response.json()
    assert body["jsonrpc"] == "2.0" and "id" in body
    data: dict[str, Any] = body["error"]["data"]
    return data


# --- the handshake ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"])
def test_initialize_answers_a_served_version_with_a_session(agent: Mcp, version: str) -> None:
    response = agent.initialize(version)
    assert response.status_code == 200
    result = response.json()["result"]
    assert result["protocolVersion"] == version
    assert result["capabilities"] == {
        "tools": {"listChanged": False},
        "resources": {"subscribe": True, "listChanged": False},
    }
    assert result["serverInfo"]["name"] == "switchboard"
    assert response["Mcp-Session-Id"]


def test_initialize_answers_the_latest_version_to_an_unknown_one(agent: Mcp) -> None:
    response = agent.initialize("1999-01-01")
    assert response.json()["result"]["protocolVersion"] == "2025-11-25"


def test_initialize_without_a_protocol_version_is_invalid_params(agent: Mcp) -> None:
    response = agent.rpc("initialize", {"capabilities": {}})
    assert response.json()["error"]["code"] == -32602
    assert response.json()["error"]["message"] == "params.protocolVersion is required"
    assert "Mcp-Session-Id" not in response
    wrong = agent.rpc("initialize", {"protocolVersion": 5, "capabilities": {}})
    assert wrong.json()["error"]["code"] == -32602
    assert "params.protocolVersion must be a string" in wrong.json()["error"]["message"]


def test_ping_and_tools_within_a_session(personas: Personas, agent: Mcp) -> None:
    agent.initialize()
    assert agent.rpc("ping", id_="p").json() == {"jsonrpc": "2.0", "id": "p", "result": {}}
    tools = agent.rpc("tools/list").json()["result"]["tools"]
    names = [t["name"] for t in tools]
    assert set(names) == held(personas) and set(personas.agent.scope_verbs) <= set(names)
    create = next(t for t in tools if t["name"] == "create_todo")
    assert create["inputSchema"]["type"] == "object"
    assert set(create["inputSchema"]["required"]) == {"queue", "title"}
    assert create["outputSchema"]["type"] == "object"
    made = _call(agent, "create_todo", {"queue": "inbox", "title": "over mcp"})
    assert made["isError"] is False and made["structuredContent"]["created"] is True
    assert Todo.objects.get().source == "mcp"


def test_an_old_session_gets_no_output_schemas_or_structured_content(agent: Mcp) -> None:
    agent.initialize("2025-03-26")
    tools = agent.rpc("tools/list").json()["result"]["tools"]
    assert all("outputSchema" not in t for t in tools)
    result = agent.rpc("tools/call", {"name": "claim_next"}).json()["result"]
    assert "structuredContent" not in result
    assert json.loads(result["content"][0]["text"]) == {"empty": True}


READ_ONLY = {"get_todo", "list_todos", "admission_status", "limits_status"}
# Writers that replace or remove what someone set; the rest add or move work.
DESTRUCTIVE = {"set_admission_policy", "clear_admission_policy"}
IDEMPOTENT = {"heartbeat", "set_admission_policy", "clear_admission_policy"}


def test_every_tool_tells_hosts_what_it_does_to_the_world(db: None, client: Client) -> None:
    """Without annotations MCP's defaults say every tool may destroy and is not idempotent: a
    host that runs read-only tools without asking would ask its human before every get_todo."""
    endpoint, token = self_budgeting_everything(client)
    agent = Mcp(client, endpoint.slug, token)
    agent.initialize("2025-03-26")
    tools = {t["name"]: t for t in agent.rpc("tools/list").json()["result"]["tools"]}
    assert set(tools) == set(load_verbs())
    for name, tool in tools.items():
        hints = tool["annotations"]
        assert hints["openWorldHint"] is False, name
        assert hints["readOnlyHint"] is (name in READ_ONLY), name
        if name in READ_ONLY:
            assert "destructiveHint" not in hints and "idempotentHint" not in hints, name
        else:
            assert hints["destructiveHint"] is (name in DESTRUCTIVE), name
            assert hints["idempotentHint"] is (name in IDEMPOTENT), name
    agent.initialize("2024-11-05")  # a revision before annotations
    tools_then = agent.rpc("tools/list").json()["result"]["tools"]
    assert all("annotations" not in tool for tool in tools_then)


def self_budgeting_everything(client: Client) -> tuple[Any, str]:
    """An endpoint holding every verb there is."""
    from django.contrib.auth import get_user_model

    owner = get_user_model().objects.create_user("hinted")
    return services.endpoint_vend(
        actor=FIXTURE,
        owner=owner,
        name="Hinted",
        queues=["inbox"],
        verbs=list(load_verbs()),
        rps=0,
    )


def test_a_request_without_a_session_is_400_and_an_unknown_one_404(agent: Mcp) -> None:
    missing = agent.rpc("tools/list")
    assert missing.status_code == 400 and missing.json()["error"]["code"] == -32600
    # As every transport refusal: the API's error object as data, naming the header (sdk10).
    data = missing.json()["error"]["data"]
    assert (data["code"], data["field"]) == ("invalid_argument", "Mcp-Session-Id")
    agent.session = "not-a-session"
    unknown = agent.rpc("tools/list")
    assert unknown.status_code == 404
    data = unknown.json()["error"]["data"]
    assert (data["code"], data["field"]) == ("not_found", "Mcp-Session-Id")
    assert "initialize again" in data["error"]


def test_delete_ends_the_session(agent: Mcp) -> None:
    agent.initialize()
    deleted = agent.client.delete(agent.path, headers=agent.headers())
    assert deleted.status_code == 204 and "Content-Type" not in deleted
    assert agent.rpc("ping").status_code == 404
    again = agent.client.delete(agent.path, headers=agent.headers())
    assert again.status_code == 404 and again.json()["error"]["data"]["code"] == "not_found"
    agent.session = None
    unnamed = agent.client.delete(agent.path, headers=agent.headers())
    assert unnamed.status_code == 400
    assert unnamed.json()["error"]["data"]["field"] == "Mcp-Session-Id"


def test_a_session_belongs_to_its_endpoint(personas: Personas, agent: Mcp, client: Client) -> None:
    agent.initialize()
    other = Mcp(client, personas.agent2.slug, personas.agent2_token)
    other.session, other.version = agent.session, agent.version
    assert other.rpc("ping").status_code == 404


def test_a_served_but_not_negotiated_protocol_version_is_answered_by_its_rules(
    agent: Mcp,
) -> None:
    agent.initialize("2025-06-18")
    newer = agent.post(
        {"jsonrpc": "2.0", "id": 1, "method": "ping"}, **{"MCP-Protocol-Version": "2025-11-25"}
    )
    assert newer.status_code == 200 and newer.json() == {"jsonrpc": "2.0", "id": 1, "result": {}}
    older = agent.post(
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        **{"MCP-Protocol-Version": "2025-03-26"},
    )
    assert all("outputSchema" not in tool for tool in older.json()["result"]["tools"])


@pytest.mark.parametrize("header", ["2000-01-01", "2099-01-01", "not-a-version"])
def test_an_unsupported_protocol_version_header_is_400_within_a_session(
    agent: Mcp, header: str
) -> None:
    agent.initialize()
    response = agent.post(
        {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, **{"MCP-Protocol-Version": header}
    )
    assert response.status_code == 400
    assert response.json()["id"] == 3 and response.json()["error"]["code"] < 0


def test_an_unknown_method_is_method_not_found(agent: Mcp) -> None:
    agent.initialize()
    response = agent.rpc("prompts/list", id_=7)
    assert response.status_code == 200
    assert response.json() == {
        "jsonrpc": "2.0",
        "id": 7,
        "error": {"code": -32601, "message": "Method not found: prompts/list"},
    }


def test_the_endpoints_todos_are_resources_listed_read_and_subscribed(
    personas: Personas, agent: Mcp
) -> None:
    """The stream's notifications/resources/updated named resources the server did not offer
    (no resources capability; resources/read was -32601): now they are the todos."""
    mine = push(personas, 3)
    (theirs,) = push(personas, 1, endpoint=personas.foreign)
    agent.initialize()
    templates = agent.rpc("resources/templates/list").json()["result"]["resourceTemplates"]
    assert [t["uriTemplate"] for t in templates] == ["switchboard://todos/{id}"]
    listed = agent.rpc("resources/list").json()["result"]
    uris = {r["uri"] for r in listed["resources"]}
    assert uris == {f"switchboard://todos/{t.id}" for t in mine} and "nextCursor" not in listed
    assert {r["title"] for r in listed["resources"]} == {t.title for t in mine}

    uri = f"switchboard://todos/{mine[0].id}"
    [content] = agent.rpc("resources/read", {"uri": uri}).json()["result"]["contents"]
    assert (content["uri"], content["mimeType"]) == (uri, "application/json")
    as_tool = _call(agent, "get_todo", {"id": str(mine[0].id)})["answer"]
    assert json.loads(content["text"]) == as_tool
    for missing in (
        f"switchboard://todos/{theirs.id}",  # another endpoint's: not found, as get_todo's 404
        "switchboard://todos/not-a-uuid",
        "file:///etc/passwd",
    ):
        error = agent.rpc("resources/read", {"uri": missing}, id_="r").json()["error"]
        assert error["code"] == -32602 and error["data"] == {"uri": missing}, missing
    assert agent.rpc("resources/subscribe", {"uri": uri}).json()["result"] == {}
    assert agent.rpc("resources/unsubscribe", {"uri": uri}).json()["result"] == {}
    bad = agent.rpc("resources/subscribe", {"uri": "x://y"}).json()["error"]
    assert bad["code"] == -32602


def test_reading_a_todo_resource_takes_the_get_todo_grant_and_the_rate(
    personas: Personas, client: Client
) -> None:
    (todo,) = push(personas, 1)
    endpoint, token = services.endpoint_vend(
        actor=FIXTURE,
        owner=personas.owner,
        name="Drain only",
        queues=["inbox"],
        verbs=["claim_next"],
        rps=0.001,
        burst=1,
    )
    drainer = Mcp(client, endpoint.slug, token)
    drainer.initialize()
    refused = drainer.rpc("resources/list")
    assert refused.status_code == 200  # the request's own error, as a tool's refusal is
    error = refused.json()["error"]
    assert error["code"] == mcp.SERVER_ERROR and error["data"]["verb"] == "list_todos"
    limited = drainer.rpc("resources/read", {"uri": f"switchboard://todos/{todo.id}"})
    assert limited.status_code == 429  # the one token went to resources/list
    assert drainer.rpc("resources/templates/list").status_code == 200  # discovery is free


def test_a_refused_resource_call_in_a_batch_costs_the_others_nothing(
    personas: Personas, client: Client
) -> None:
    """The batch [claim_next, resources/list] without list_todos' grant was one transport 403:
    the claim had committed, and its answer (the todo, the attempt) was thrown away."""
    (todo,) = push(personas, 1)
    endpoint, token = services.endpoint_vend(
        actor=FIXTURE, owner=personas.owner, name="Drainer", queues=["inbox"], verbs=["claim_next"]
    )
    Todo.objects.filter(pk=todo.pk).update(endpoint=endpoint)
    drainer = Mcp(client, endpoint.slug, token)
    drainer.initialize("2025-03-26")
    answers = drainer.post(
        [
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "claim_next"}},
            {"jsonrpc": "2.0", "id": 2, "method": "resources/list"},
            {"jsonrpc": "2.0", "id": 3, "method": "resources/read", "params": {"uri": "x"}},
        ]
    )
    assert answers.status_code == 200
    claimed, listed, read = answers.json()
    held = json.loads(claimed["result"]["content"][0]["text"])
    assert held["todo"]["id"] == str(todo.id) and held["attempt"] == 1
    assert listed["error"]["data"]["code"] == "forbidden"
    assert read["error"]["data"]["verb"] == "get_todo"


def test_a_todo_resource_is_read_only_as_the_server_spells_it(
    personas: Personas, agent: Mcp
) -> None:
    (todo,) = push(personas, 1)
    agent.initialize()
    canonical = f"switchboard://todos/{todo.id}"
    assert "result" in agent.rpc("resources/read", {"uri": canonical}).json()
    for other in (
        canonical.upper().replace("SWITCHBOARD://TODOS/", "switchboard://todos/"),
        f"switchboard://todos/{todo.id.hex}",
        f"switchboard://todos/{{{todo.id}}}",
        f"switchboard://todos/urn:uuid:{todo.id}",
    ):
        error = agent.rpc("resources/read", {"uri": other}).json()["error"]
        assert error["code"] == -32602 and error["data"] == {"uri": other}, other


def test_a_notification_runs_nothing_and_is_charged_nothing(
    personas: Personas, client: Client
) -> None:
    endpoint, token = services.endpoint_vend(
        actor=FIXTURE, owner=personas.owner, name="Quiet", queues=["inbox"], rps=1e-6, burst=1
    )
    quiet = Mcp(client, endpoint.slug, token)
    quiet.initialize("2025-03-26")
    note = {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "claim_next"}}
    for _ in range(3):
        assert quiet.post(note).status_code == 202
    assert quiet.post([note, note]).status_code == 202
    quiet.initialize()
    assert _call(quiet, "claim_next")["isError"] is False  # the one token is still there


def test_malformed_json_is_a_parse_error(agent: Mcp) -> None:
    response = agent.post(None, raw='{"jsonrpc": "2.0", "id": 1,')
    assert response.status_code == 400
    assert response.json()["error"]["code"] == -32700 and response.json()["id"] is None
    # It says why, in the client's terms (not Python's advice on its integer limit).
    response = agent.post(
        None, raw='{"jsonrpc": "2.0", "id": 1%s, "method": "ping"}' % ("0" * 5000)
    )
    assert response.status_code == 400 and response.json()["error"] == {
        "code": -32700,
        "message": "Parse error: the body is not JSON (a number has more than 4300 digits)",
    }


def test_a_body_not_in_utf8_or_giving_a_name_twice_is_a_parse_error_and_runs_nothing(
    personas: Personas, agent: Mcp
) -> None:
    [todo] = push(personas, 1)
    agent.initialize()
    call = '{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": %s}'
    for raw, why in [
        (call % '{"name": "claim", "arguments": {"id": "%s"}}' % todo.id, "is not UTF-8"),
        (call % '{"name": "claim", "name": "claim", "arguments": {}}', '"name" twice'),
        (
            call % '{"name": "claim", "arguments": {"id": "%s", "id": "%s"}}' % (todo.id, todo.id),
            '"id" twice',
        ),
    ]:
        body = raw.encode("utf-16") if why == "is not UTF-8" else raw
        response = agent.post(None, raw=body)
        assert response.status_code == 400, raw
        error = response.json()["error"]
        assert error["code"] == -32700 and why in error["message"], error
    todo.refresh_from_db()
    assert todo.state == "pending"


@pytest.mark.parametrize(
    "message",
    [
        {"jsonrpc": "1.0", "id": 1, "method": "ping"},
        {"jsonrpc": "2.0", "id": 1},
        {"jsonrpc": "2.0", "id": 1, "method": 5},
        {"jsonrpc": "2.0", "id": True, "method": "ping"},
        {"jsonrpc": "2.0", "id": 1, "method": "ping", "params": [1]},
        "ping",
    ],
)
def test_an_invalid_request_is_invalid_request(agent: Mcp, message: Any) -> None:
    agent.initialize()
    response = agent.post(message)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == -32600


def test_bad_tool_params_are_invalid_params(agent: Mcp) -> None:
    agent.initialize()
    for params in (
        {},
        {"name": 3},
        {"name": "launch_missiles"},
        {"name": "claim", "arguments": []},
    ):
        response = agent.rpc("tools/call", params)
        assert response.json()["error"]["code"] == -32602, params


def test_a_tools_list_cursor_is_invalid_params_in_both_eras(agent: Mcp) -> None:
    # The list is one page and no cursor is ever given out: one sent was answered with the
    # first page again, where the specification's pagination says -32602.
    assert "nextCursor" not in agent.modern("tools/list").json()["result"]
    refused = agent.modern("tools/list", {"cursor": "zzz"})
    assert refused.json()["error"]["code"] == -32602
    assert "cursor" in refused.json()["error"]["message"]
    agent.initialize()
    assert agent.rpc("tools/list", {"cursor": "zzz"}).json()["error"]["code"] == -32602
    assert agent.rpc("tools/list", {"cursor": None}).json()["result"]["tools"]
    assert "nextCursor" not in agent.rpc("tools/list").json()["result"]


def test_a_refusal_is_a_tool_result_with_is_error(personas: Personas, agent: Mcp) -> None:
    agent.initialize()
    (theirs,) = push(personas, 1, endpoint=personas.foreign)
    missing = _call(agent, "complete", {"id": str(theirs.id)})
    assert missing["isError"] is True
    assert missing["answer"]["code"] == "not_found"
    invalid = _call(agent, "create_todo", {"queue": "inbox"})
    assert invalid["isError"] is True
    assert invalid["answer"] == {
        "error": "title: Field required",
        "code": "invalid_argument",
        "field": "title",
        "errors": [{"field": "title", "message": "Field required"}],
    }
    scope = _call(agent, "create_todo", {"queue": "elsewhere", "title": "x"})
    assert scope["answer"]["code"] == "forbidden"


def test_a_verb_outside_the_grant_is_hidden_and_forbidden(
    personas: Personas, client: Client
) -> None:
    endpoint, token = services.endpoint_vend(
        actor=FIXTURE,
        owner=personas.owner,
        name="Reader",
        queues=["inbox"],
        verbs=["list_todos"],
        rps=0,
    )
    reader = Mcp(client, endpoint.slug, token)
    reader.initialize()
    tools = reader.rpc("tools/list").json()["result"]["tools"]
    assert [t["name"] for t in tools] == ["list_todos"]
    refused = _call(reader, "claim_next", {})
    assert refused["isError"] is True and refused["answer"]["code"] == "forbidden"


def test_batches_are_served_only_where_the_revision_has_them(agent: Mcp) -> None:
    agent.initialize("2025-03-26")
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "ping"},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "nope"},
    ]
    answers = agent.post(batch).json()
    assert answers[0] == {"jsonrpc": "2.0", "id": 1, "result": {}}
    assert answers[1]["id"] == 2 and answers[1]["error"]["code"] == -32601
    assert len(answers) == 2
    assert agent.post([]).status_code == 400
    only_notes = agent.post([{"jsonrpc": "2.0", "method": "notifications/cancelled"}])
    assert only_notes.status_code == 202

    agent.initialize("2025-11-25")
    refused = agent.post(batch)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == -32600


def test_a_client_response_is_accepted_without_an_answer(agent: Mcp) -> None:
    agent.initialize()
    response = agent.post({"jsonrpc": "2.0", "id": 9, "result": {}})
    assert response.status_code == 202 and response.content == b""
    assert "Content-Type" not in response  # no content to describe (it said text/html)


# --- transport refusals -------------------------------------------------------------------------


def test_get_without_a_session_is_not_allowed(agent: Mcp) -> None:
    response = agent.client.get(agent.path, headers=agent.headers())
    assert response.status_code == 405
    assert response["Allow"] == "POST, DELETE"
    assert response.json()["error"]["data"]["code"] == "method_not_allowed"


def test_the_get_stream_needs_a_known_session_and_an_event_stream_accept(agent: Mcp) -> None:
    agent.initialize()
    unknown = agent.client.get(agent.path, headers=agent.headers(**{"Mcp-Session-Id": "nope"}))
    assert unknown.status_code == 404
    assert unknown.json()["error"]["data"]["field"] == "Mcp-Session-Id"
    json_only = agent.client.get(agent.path, headers=agent.headers(Accept="application/json"))
    assert json_only.status_code == 406
    assert json_only.json()["error"]["data"]["field"] == "Accept"


def test_other_methods_are_not_allowed(agent: Mcp) -> None:
    response = agent.client.put(agent.path, headers=agent.headers())
    assert response.status_code == 405
    assert response["Allow"] == "GET, POST, DELETE"
    data = response.json()["error"]["data"]
    assert (data["code"], data["method"]) == ("method_not_allowed", "PUT")


def test_an_unknown_or_missing_token_is_401(personas: Personas, client: Client) -> None:
    for token in ("sbk_nope", None):
        response = Mcp(client, personas.agent.slug, token).rpc("ping")
        assert response.status_code == 401
        assert refusal(response)["code"] == "unauthorized"
        assert response.json()["id"] == 1
        assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_revoked_token_is_401(personas: Personas, agent: Mcp) -> None:
    services.endpoint_revoke(actor=FIXTURE, endpoint=personas.agent)
    assert agent.rpc("ping").status_code == 401


def test_a_valid_token_on_another_endpoints_url_is_403(personas: Personas, client: Client) -> None:
    for slug in (personas.foreign.slug, personas.agent2.slug, "no-such-slug"):
        refused = Mcp(client, slug, personas.agent_token).rpc("initialize", {})
        assert refused.status_code == 403, slug
        assert refusal(refused)["code"] == "forbidden"


def test_the_endpoint_rate_limit_charges_tool_calls_not_the_handshake(
    personas: Personas, client: Client
) -> None:
    endpoint, token = services.endpoint_vend(
        actor=FIXTURE, owner=personas.owner, name="Chatty", queues=["inbox"], rps=0.1, burst=2
    )
    chatty = Mcp(client, endpoint.slug, token)
    for _ in range(3):
        chatty.initialize()
        assert chatty.rpc("ping").status_code == 200
        assert chatty.rpc("tools/list").status_code == 200
        assert chatty.modern("server/discover").status_code == 200
        assert chatty.modern("tools/list").status_code == 200
    assert _call(chatty, "claim_next")["isError"] is False
    assert chatty.modern("tools/call", {"name": "claim_next", "arguments": {}}).status_code == 200
    limited = chatty.rpc("tools/call", {"name": "claim_next", "arguments": {}}, id_="c3")
    assert limited.status_code == 429 and refusal(limited)["code"] == "rate_limited"
    assert limited.json()["id"] == "c3"
    assert int(limited["Retry-After"]) >= 1
    assert chatty.rpc("ping").status_code == 200


def test_each_tool_call_of_a_batch_is_charged_to_the_endpoint_rate(
    personas: Personas, client: Client
) -> None:
    """A batch is one HTTP request holding many calls: charged once, it ran any number of
    tool calls for one token of the rate."""
    endpoint, token = services.endpoint_vend(
        actor=FIXTURE, owner=personas.owner, name="Batcher", queues=["inbox"], rps=0.1, burst=2
    )
    batcher = Mcp(client, endpoint.slug, token)
    batcher.initialize("2025-03-26")
    creates = [
        {
            "jsonrpc": "2.0",
            "id": i,
            "method": "tools/call",
            "params": {"name": "create_todo", "arguments": {"queue": "inbox", "title": f"t{i}"}},
        }
        for i in range(5)
    ]
    response = batcher.post([*creates, {"jsonrpc": "2.0", "id": "p", "method": "ping"}])
    assert response.status_code == 200
    answers = {answer["id"]: answer for answer in response.json()}
    assert [answers[i]["result"]["isError"] for i in (0, 1)] == [False, False]
    for i in (2, 3, 4):
        error = answers[i]["error"]
        assert error["code"] == mcp.SERVER_ERROR and error["data"]["code"] == "rate_limited"
        assert error["data"]["retry_after"] >= 1
    assert answers["p"]["result"] == {}  # what is not charged still runs
    assert Todo.objects.filter(endpoint=endpoint).count() == 2


def test_racing_batches_run_exactly_the_burst_of_tool_calls(
    tx_personas: Personas, live_url: str
) -> None:
    """Six clients at once, each a batch of eight create_todo on its own session, against a
    burst of five that does not refill during the test: five calls run, over every batch."""
    endpoint, token = services.endpoint_vend(
        actor=FIXTURE, owner=tx_personas.owner, name="Racer", queues=["inbox"], rps=1e-6, burst=5
    )
    url = f"{live_url}/mcp/{endpoint.slug}"
    headers = {"Authorization": f"Bearer {token}", "Accept": ACCEPT}

    def session() -> str:
        opened = httpx.post(url, json=initialize("2025-03-26"), headers=headers, timeout=30)
        return str(opened.headers["Mcp-Session-Id"])

    sessions = [session() for _ in range(6)]
    batch = [
        {
            "jsonrpc": "2.0",
            "id": i,
            "method": "tools/call",
            "params": {"name": "create_todo", "arguments": {"queue": "inbox", "title": f"t{i}"}},
        }
        for i in range(8)
    ]

    def send(i: int) -> list[dict[str, Any]]:
        answer = httpx.post(
            url,
            json=batch,
            headers={
                **headers,
                "Mcp-Session-Id": sessions[i],
                "MCP-Protocol-Version": "2025-03-26",
            },
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        answers: list[dict[str, Any]] = answer.json()
        return answers

    answers = [a for batch_answers in run_threads(6, send) for a in batch_answers]
    ran = [a for a in answers if "result" in a]
    limited = [a for a in answers if "error" in a]
    assert (len(ran), len(limited)) == (5, 43)
    assert all(a["error"]["data"]["code"] == "rate_limited" for a in limited)
    assert Todo.objects.filter(endpoint=endpoint).count() == 5


def test_a_session_without_batches_takes_none_whatever_its_header_names(agent: Mcp) -> None:
    agent.initialize("2025-11-25")
    batch = [{"jsonrpc": "2.0", "id": 1, "method": "ping"}]
    refused = agent.post(batch, **{"MCP-Protocol-Version": "2025-03-26"})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == -32600
    assert "2025-11-25" in refused.json()["error"]["message"]
    # A session that has them, with a header naming a revision that has not: the header's.
    agent.initialize("2025-03-26")
    refused = agent.post(batch, **{"MCP-Protocol-Version": "2025-06-18"})
    assert refused.json()["error"]["message"].endswith("protocol 2025-06-18")


def test_a_session_naming_a_revision_nobody_serves_is_told_which_are(agent: Mcp) -> None:
    agent.initialize("2025-11-25")
    unsupported = {"MCP-Protocol-Version": "2099-01-01"}
    stream = agent.client.get(
        agent.path, headers=agent.headers(Accept="text/event-stream", **unsupported)
    )
    assert stream.status_code == 400 and stream.json()["error"]["code"] == -32022
    ended = agent.client.delete(agent.path, headers=agent.headers(**unsupported))
    assert ended.status_code == 400 and agent.rpc("ping").status_code == 200  # still open
    message = {"jsonrpc": "2.0", "id": 7, "method": "tools/list"}
    response = agent.post(message, **{"MCP-Protocol-Version": "1999-01-01"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert response.json()["id"] == 7
    assert error["code"] == mcp.UNSUPPORTED_PROTOCOL_VERSION
    assert error["data"]["requested"] == "1999-01-01"
    assert "2025-11-25" in error["data"]["supported"]


def test_it_needs_to_be_allowed_to_answer_json(agent: Mcp) -> None:
    response = agent.post({"jsonrpc": "2.0", "id": 1, "method": "ping"}, Accept="text/event-stream")
    assert response.status_code == 406 and refusal(response)["field"] == "Accept"
    assert response.json()["id"] == 1
    typed = agent.post(None, raw="ping", content_type="text/plain")
    assert typed.status_code == 415 and refusal(typed)["field"] == "Content-Type"


def test_a_foreign_origin_is_refused(agent: Mcp) -> None:
    response = agent.post({"jsonrpc": "2.0", "id": 1, "method": "ping"}, Origin="https://evil.test")
    assert response.status_code == 403
    same = agent.post(
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "x"}},
        Origin="http://testserver",
    )
    assert same.status_code == 200


def test_a_body_over_one_mebibyte_is_413(agent: Mcp) -> None:
    response = agent.post(None, raw=json.dumps({"pad": "a" * (1024 * 1024)}))
    assert response.status_code == 413
    assert refusal(response)["code"] == "invalid_argument" and refusal(response)["field"] == "body"


# --- 2026-07-28 ---------------------------------------------------------------------------------


def test_discover_names_the_versions_and_the_tools_capability(agent: Mcp) -> None:
    response = agent.modern("server/discover")
    assert response.status_code == 200
    result = response.json()["result"]
    assert result["supportedVersions"][0] == MODERN
    assert set(mcp.HANDSHAKE_VERSIONS) <= set(result["supportedVersions"])
    assert result["capabilities"] == {
        "tools": {"listChanged": False},
        "resources": {"subscribe": True, "listChanged": False},
    }
    assert result["resultType"] == "complete"
    assert result["ttlMs"] == 0 and result["cacheScope"] == "private"
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "switchboard"
    assert "Mcp-Session-Id" not in response


def test_modern_requests_need_no_session(personas: Personas, agent: Mcp) -> None:
    tools = agent.modern("tools/list").json()["result"]
    assert {t["name"] for t in tools["tools"]} == held(personas)
    made = agent.modern(
        "tools/call", {"name": "create_todo", "arguments": {"queue": "inbox", "title": "t"}}
    )
    result = made.json()["result"]
    assert result["resultType"] == "complete" and result["isError"] is False
    assert result["structuredContent"]["todo"]["title"] == "t"


def test_a_modern_request_without_its_envelope_is_invalid_params(agent: Mcp) -> None:
    response = agent.post(
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        **{"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/list"},
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == -32602


def test_modern_headers_must_match_the_body(agent: Mcp) -> None:
    wrong_method = agent.modern("tools/list", headers={"Mcp-Method": "tools/call"})
    assert wrong_method.status_code == 400 and wrong_method.json()["error"]["code"] == -32020
    wrong_name = agent.modern(
        "tools/call", {"name": "claim_next", "arguments": {}}, {"Mcp-Name": "complete"}
    )
    assert wrong_name.json()["error"]["code"] == -32020


def test_a_resource_read_must_name_its_uri_in_mcp_name(agent: Mcp, personas: Personas) -> None:
    # 2026-07-28 mirrors a resources/read's params.uri in Mcp-Name, as a tools/call's name: a
    # proxy routing on the header must not be told one resource while another is read.
    mine, another = push(personas, 2)
    uri, other = (f"switchboard://todos/{t.id}" for t in (mine, another))
    read = agent.modern("resources/read", {"uri": uri})
    assert read.status_code == 200, read.content
    assert read.json()["result"]["contents"][0]["uri"] == uri
    for headers, says in [
        ({"Mcp-Name": other}, "the Mcp-Name header does not match params.uri"),
        ({"Mcp-Name": ""}, "the Mcp-Name header does not match params.uri"),
    ]:
        refused = agent.modern("resources/read", {"uri": uri}, headers)
        assert refused.status_code == 400, refused.content
        assert refused.json()["error"] == {"code": -32020, "message": says}
    for omit, says in [
        (("Mcp-Method", "Mcp-Name"), "the Mcp-Method header is missing"),
        (("Mcp-Name",), "the Mcp-Name header is missing (it gives params.uri)"),
    ]:
        refused = agent.modern("resources/read", {"uri": uri}, omit=omit)
        assert refused.status_code == 400, refused.content
        assert refused.json()["error"] == {"code": -32020, "message": says}


def test_an_unsupported_modern_version_names_the_supported_ones(agent: Mcp) -> None:
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "server/discover",
        "params": {
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2099-01-01",
                "io.modelcontextprotocol/clientCapabilities": {},
            }
        },
    }
    response = agent.post(
        message, **{"MCP-Protocol-Version": "2099-01-01", "Mcp-Method": "server/discover"}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == -32022
    assert MODERN in error["data"]["supported"] and error["data"]["requested"] == "2099-01-01"


def test_ping_is_gone_in_2026_and_unknown_methods_are_404(agent: Mcp) -> None:
    response = agent.modern("ping")
    assert response.status_code == 404 and response.json()["error"]["code"] == -32601


def test_modern_batches_are_invalid_and_notifications_accepted(agent: Mcp) -> None:
    headers = {"MCP-Protocol-Version": MODERN}
    batch = agent.post([{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}], **headers)
    assert batch.status_code == 400 and batch.json()["error"]["code"] == -32600
    assert "batches are not part of protocol 2026-07-28" in batch.json()["error"]["message"]
    note = agent.post({"jsonrpc": "2.0", "method": "notifications/cancelled"}, **headers)
    assert note.status_code == 202 and "Content-Type" not in note


# --- failures nobody planned for ------------------------------------------------------------------


def _broken_verb(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("a bug in a verb")


def test_an_unexpected_failure_is_a_json_rpc_internal_error_with_the_id(
    agent: Mcp, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mcp.verbs, "call_json", _broken_verb)
    agent.initialize()
    response = agent.rpc("tools/call", {"name": "claim_next", "arguments": {}}, id_="boom")
    assert response["Content-Type"] == "application/json"
    assert response.json()["id"] == "boom" and response.json()["error"]["code"] == -32603
    modern = agent.modern("tools/call", {"name": "claim_next", "arguments": {}})
    assert modern.json()["id"] == "m1" and modern.json()["error"]["code"] == -32603


def test_a_failure_before_dispatch_is_a_json_rpc_500_not_a_page(
    agent: Mcp, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mcp, "_authenticate", _broken_verb)
    response = agent.rpc("tools/list", id_=41)
    assert response.status_code == 500 and response["Content-Type"] == "application/json"
    assert response.json() == {
        "jsonrpc": "2.0",
        "id": 41,
        "error": {"code": -32603, "message": mcp.INTERNAL_FAILURE},
    }


def test_one_failing_message_of_a_batch_costs_the_others_nothing(
    agent: Mcp, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mcp.verbs, "call_json", _broken_verb)
    agent.initialize("2025-03-26")
    answers = agent.post(
        [
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "claim_next"}},
            {"jsonrpc": "2.0", "id": 2, "method": "ping"},
        ]
    ).json()
    assert answers[0]["id"] == 1 and answers[0]["error"]["code"] == -32603
    assert answers[1] == {"jsonrpc": "2.0", "id": 2, "result": {}}


def test_a_redis_that_does_not_answer_is_a_503_json_rpc_error_with_retry_after(
    agent: Mcp, settings: Any
) -> None:
    agent.initialize()
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    counters.reset_client()
    try:
        response = agent.rpc("tools/list", id_="r1")
    finally:
        counters.reset_client()  # the settings fixture restores REDIS_URL after the test
    assert response.status_code == 503 and int(response["Retry-After"]) >= 1
    assert response.json()["id"] == "r1" and refusal(response)["code"] == "unavailable"


def test_get_answers_405_as_json_rpc(agent: Mcp) -> None:
    response = agent.client.get(agent.path, headers=agent.headers())
    assert response.status_code == 405 and response.json()["error"]["code"] == -32000


def test_the_servers_empty_answers_carry_no_content_type(
    tx_personas: Personas, live_url: str
) -> None:
    """Through the web server's own answer path (not Django's): a 202 and a 204 said
    ``Content-Type: text/html`` of an empty body (sdk10)."""
    url = f"{live_url}/mcp/{tx_personas.agent.slug}"
    headers = {"Authorization": f"Bearer {tx_personas.agent_token}", "Accept": ACCEPT}
    opened = httpx.post(url, json=initialize(), headers=headers, timeout=30)
    headers["Mcp-Session-Id"] = opened.headers["Mcp-Session-Id"]
    headers["MCP-Protocol-Version"] = opened.json()["result"]["protocolVersion"]
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    accepted = httpx.post(url, json=note, headers=headers, timeout=30)
    assert accepted.status_code == 202 and accepted.content == b""
    assert "content-type" not in accepted.headers
    assert accepted.headers["X-Content-Type-Options"] == "nosniff"  # the rest still sent
    ended = httpx.delete(url, headers=headers, timeout=30)
    assert ended.status_code == 204 and "content-type" not in ended.headers
    gone = httpx.delete(url, headers=headers, timeout=30)
    assert gone.status_code == 404 and gone.json()["error"]["data"]["code"] == "not_found"


def test_a_chunked_body_over_one_mebibyte_is_a_413_json_rpc_error(
    tx_personas: Personas, live_url: str
) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "pad": "'
        for _ in range(2 * 1024):
            yield b"a" * 1024
        yield b'"}'

    response = httpx.post(
        f"{live_url}/mcp/{tx_personas.agent.slug}",
        content=chunks(),  # no Content-Length: sent chunked
        headers={
            "Authorization": f"Bearer {tx_personas.agent_token}",
            "Accept": ACCEPT,
            "Content-Type": "application/json",
        },
        timeout=30,
    )
    assert response.status_code == 413
    assert response.json()["error"]["data"]["field"] == "body"


def test_a_nul_in_the_query_is_refused_before_any_view_as_a_json_rpc_error(agent: Mcp) -> None:
    response = agent.client.post(
        f"{agent.path}?x=a%00b", "{}", content_type="application/json", headers=agent.headers()
    )
    assert response.status_code == 400 and response["Content-Type"] == "application/json"
    body = response.json()
    assert body["jsonrpc"] == "2.0" and body["id"] is None
    assert body["error"]["data"]["code"] == "invalid_argument"
    assert body["error"]["data"]["field"] == "x"


@pytest.mark.parametrize("path", ["/mcp/anything", "/api/v1/agent/claim_next"])
def test_a_host_this_server_does_not_serve_is_a_json_refusal_not_a_page(
    client: Client, path: str, settings: Any
) -> None:
    settings.DEBUG = False
    response = client.post(path, "{}", content_type="application/json", HTTP_HOST="evil.example")
    assert response.status_code == 400 and response["Content-Type"] == "application/json"
    body = response.json()
    error = body["error"]["data"] if path.startswith("/mcp/") else body
    assert error["code"] == "invalid_argument" and error["field"] == "host"


def test_a_budget_write_over_a_moved_version_is_an_error_result_naming_the_version_now(
    personas: Personas, client: Client
) -> None:
    endpoint, token = self_budgeting(personas)
    session = Mcp(client, endpoint.slug, token)
    session.initialize()
    tool = next(t for t in session.rpc("tools/list").json()["result"]["tools"]
                if t["name"] == "set_admission_policy")  # fmt: skip
    assert "if_version" in tool["inputSchema"]["properties"]
    first = _call(session, "set_admission_policy",
                  {"queue": "inbox", "policy": {"max_in_flight": 1}, "if_version": "none"})  # fmt: skip
    assert not first["isError"]
    read = first["answer"]["policy"]["version"]
    moved = _call(session, "set_admission_policy",
                  {"queue": "inbox", "policy": {"max_in_flight": 2}, "if_version": read})  # fmt: skip
    now = moved["answer"]["policy"]["version"]
    stale = _call(session, "set_admission_policy",
                  {"queue": "inbox", "policy": {"max_in_flight": 3}, "if_version": read})  # fmt: skip
    assert stale["isError"]
    assert stale["answer"]["code"] == "precondition_failed" and stale["answer"]["version"] == now
    assert AdmissionPolicy.objects.get(endpoint=endpoint).max_in_flight == 2
