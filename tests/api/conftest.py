"""Helpers for the REST tests: agents post verbs with their bearer token, humans with theirs."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from queues import services
from tests.conftest import FIXTURE, Personas
from tests.mcp.conftest import live_url  # noqa: F401  (a live server, for schemathesis)


class Api:
    """A Django test client speaking JSON, with a bearer token when given one."""

    def __init__(self, client: Client, token: str | None = None) -> None:
        self.client = client
        self.token = token

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = dict(extra or {})
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def post(
        self, path: str, body: Any = None, *, raw: str | bytes | None = None, **kw: Any
    ) -> Any:
        data = raw if raw is not None else ("" if body is None else json.dumps(body))
        return self.client.post(
            path, data, content_type="application/json", headers=self._headers(kw.get("headers"))
        )

    def get(self, path: str, **params: Any) -> Any:
        return self.client.get(path, params, headers=self._headers())

    def put(self, path: str, body: Any, **headers: str) -> Any:
        return self.client.put(
            path, json.dumps(body), content_type="application/json", headers=self._headers(headers)
        )

    def patch(self, path: str, body: Any, **headers: str) -> Any:
        return self.client.patch(
            path, json.dumps(body), content_type="application/json", headers=self._headers(headers)
        )

    def delete(self, path: str, **headers: str) -> Any:
        return self.client.delete(path, headers=self._headers(headers))

    def verb(self, name: str, body: Any = None, **kw: Any) -> Any:
        return self.post(f"/api/v1/agent/{name}", body, **kw)


MODERN = "2026-07-28"


def mcp_tool(slug: str, token: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One 2026-07-28 (stateless) ``tools/call`` through the test client: its result."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments, "_meta": meta},
    }
    answer = Client().post(
        f"/mcp/{slug}",
        json.dumps(call),
        content_type="application/json",
        headers={
            "Authorization": f"Bearer {token}",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": MODERN,
            "Mcp-Method": "tools/call",
            "Mcp-Name": name,
        },
    )
    assert answer.status_code == 200, answer.content
    result: dict[str, Any] = answer.json()["result"]
    return result


@pytest.fixture
def agent_api(personas: Personas, client: Client) -> Api:
    return Api(client, personas.agent_token)


def human_token(user: Any) -> str:
    return services.human_token_create(actor=FIXTURE, user=user, name="test")[1]


@pytest.fixture
def owner_api(personas: Personas) -> Api:
    return Api(Client(), human_token(personas.owner))


@pytest.fixture
def other_api(personas: Personas) -> Api:
    return Api(Client(), human_token(personas.other_owner))


@pytest.fixture
def auditor_api(personas: Personas) -> Api:
    return Api(Client(), human_token(personas.auditor))


@pytest.fixture
def admin_api(personas: Personas) -> Api:
    return Api(Client(), human_token(personas.admin))
