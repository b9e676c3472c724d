"""The edge values, at every field of every operation: each REST body property, path and query
parameter in the OpenAPI document, and each MCP tool argument (through the verb registry). None
may answer 5xx, and none may store anything the edge refuses.

Schemathesis (test_schemathesis.py) explores the document's own shapes; this sends the values a
penetration tester starts with, exhaustively, as raw JSON so Python's encoder cannot clean them.
"""

from __future__ import annotations

import json
from typing import Any

from django.test import Client

from queues.models import Todo
from tests.api.conftest import human_token
from tests.conftest import Personas, push
from tests.mcp.test_mcp_http import Mcp

DEEP = "[" * 300 + "]" * 300
# Raw JSON text, sent as the value of one field at a time.
EDGE_JSON = [
    '"a\\u0000b"',
    '"\\ud800"',
    '"\\udfff tail"',
    "NaN",
    "Infinity",
    "-Infinity",
    "1e309",
    "-1e309",
    "1" + "0" * 400,
    "true",
    '"300"',
    '"inbox\\n"',
    '"00000000-0000-0000-0000-000000000000"',
    DEEP,
    '{"k\\u0000": 1}',
    '{"a": [1, {"b": NaN}]}',
    '""',
    "null",
    "-1",
    "0",
    "[]",
]
# Path and query values, percent-encoded as a client would send them.
EDGE_TEXT = ["a%00b", "inbox%0A", "%ED%A0%80", "..%2F..", "00000000-0000-0000-0000-000000000000"]


def _resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        node: Any = doc
        for part in schema["$ref"].lstrip("#/").split("/"):
            node = node[part]
        schema = node
    return schema


def _operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, op)
        for path, item in doc["paths"].items()
        for method, op in item.items()
        if method in ("get", "post", "put", "delete")
    ]


def _requests(doc: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    """(method, url, raw body) for every edge value at every field."""
    out: list[tuple[str, str, str | None]] = []
    for method, path, op in _operations(doc):
        params = op.get("parameters", [])
        path_params = {p["name"]: "inbox" for p in params if p["in"] == "path"}
        base = path.format(
            **{k: "endpoint:agent" if k == "scope" else v for k, v in path_params.items()}
        )
        for name in path_params:
            for value in EDGE_TEXT:
                filled = {k: ("endpoint:agent" if k == "scope" else "inbox") for k in path_params}
                filled[name] = value
                out.append((method, path.format(**filled), "{}" if method != "GET" else None))
        for param in params:
            if param["in"] == "query":
                for value in EDGE_TEXT:
                    out.append((method, f"{base}?{param['name']}={value}", None))
        body = op.get("requestBody", {}).get("content", {}).get("application/json")
        if body:
            schema = _resolve(doc, body["schema"])
            for prop in schema.get("properties", {}):
                for raw in EDGE_JSON:
                    out.append((method, base, f'{{"{prop}": {raw}}}'))
            out.append((method, base, DEEP))
            out.append((method, base, '{"x": 1e309, "y": NaN}'))
    return out


def test_no_edge_value_anywhere_is_a_server_error(personas: Personas) -> None:
    push(personas, 2)
    client = Client(raise_request_exception=False)
    doc = client.get("/api/v1/openapi.json").json()
    requests = _requests(doc)
    seen: list[tuple[int, str, str, str | None]] = []
    for token in (personas.agent_token, human_token(personas.owner), human_token(personas.admin)):
        headers = {"Authorization": f"Bearer {token}"}
        for method, url, raw in requests:
            path = url
            if method == "GET":
                response = client.get(path, headers=headers)
            else:
                response = client.generic(
                    method, path, raw or "", content_type="application/json", headers=headers
                )
            seen.append((response.status_code, method, path, raw))
            if response.status_code != 404:  # an edge path may match no route at all
                assert response["Content-Type"].startswith("application/json"), (path, raw)
    print(f"EDGE-FUZZ rest requests={len(seen)} 5xx={sum(1 for s in seen if s[0] >= 500)}")
    errors = [s for s in seen if s[0] >= 500]
    assert not errors, errors[:5]
    assert len(seen) > 2000
    assert any(s[0] == 400 for s in seen) and any(s[0] < 300 for s in seen)
    # Nothing the edge refuses was stored, whatever got through.
    for todo in Todo.objects.all():
        text = json.dumps([todo.title, todo.kind, todo.payload, todo.result, todo.queue])
        assert "\\u0000" not in text and "NaN" not in text and "Infinity" not in text


def test_no_edge_value_in_any_mcp_tool_argument_is_a_server_error(
    personas: Personas, client: Client
) -> None:
    push(personas, 2)
    session = Mcp(client, personas.agent.slug, personas.agent_token)
    session.initialize()
    tools = session.rpc("tools/list").json()["result"]["tools"]
    sent = 0
    for tool in tools:
        for prop in tool["inputSchema"].get("properties", {}):
            for raw in EDGE_JSON:
                message = (
                    f'{{"jsonrpc": "2.0", "id": {sent}, "method": "tools/call", "params": '
                    f'{{"name": "{tool["name"]}", "arguments": {{"{prop}": {raw}}}}}}}'
                )
                response = session.post(None, raw=message)
                sent += 1
                assert response.status_code < 500, (tool["name"], prop, raw, response.content)
                answer = response.json()
                assert answer.get("id") == sent - 1, answer
                assert "result" in answer or "error" in answer
    print(f"EDGE-FUZZ mcp tool calls={sent}")
    assert sent > 200
    for todo in Todo.objects.all():
        assert "\x00" not in todo.title
