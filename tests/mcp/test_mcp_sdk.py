"""The official MCP SDK client against a live server: an agent does its whole job over MCP.

``mode="auto"`` probes ``server/discover`` and speaks 2026-07-28 (stateless); ``mode="legacy"``
runs the ``initialize`` handshake and a session. Both must work end to end.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from mcp.types import CallToolResult, TextContent, TextResourceContents

from queues import services
from queues.models import Todo, TodoState
from tests.conftest import FIXTURE, Personas

EXPECTED_VERSION = {"auto": "2026-07-28", "legacy": "2025-11-25"}


def error_of(result: CallToolResult) -> dict[str, Any]:
    """The API error object an isError result carries as its text."""
    (block,) = result.content
    assert isinstance(block, TextContent)
    error: dict[str, Any] = json.loads(block.text)
    return error


@contextlib.asynccontextmanager
async def connect(url: str, token: str, mode: str) -> AsyncIterator[Client]:
    """A connected SDK client; its HTTP client is ours to close (the SDK closes only one it
    made itself), else its sockets are left to the garbage collector."""
    async with (
        create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode) as client,
    ):
        yield client


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_an_agent_does_its_whole_job_over_mcp(
    tx_personas: Personas, live_url: str, mode: str
) -> None:
    url = f"{live_url}/mcp/{tx_personas.agent.slug}"
    seen: dict[str, Any] = {}

    async def job() -> None:
        async with connect(url, tx_personas.agent_token, mode) as client:
            seen["version"] = client.session.protocol_version
            tools = await client.list_tools()
            seen["tools"] = {t.name for t in tools.tools}
            assert all(t.output_schema for t in tools.tools)

            made = await client.call_tool("create_todo", {"queue": "inbox", "title": "over mcp"})
            assert made.is_error is False
            assert made.structured_content is not None
            todo_id = made.structured_content["todo"]["id"]

            # The todo as a resource: on 2026-07-28 the SDK repeats the URI in Mcp-Name, which
            # the server checks against the body.
            uri = f"switchboard://todos/{todo_id}"
            read = await client.read_resource(uri)
            (content,) = read.contents
            assert str(content.uri) == uri and isinstance(content, TextResourceContents)
            assert json.loads(content.text)["todo"]["title"] == "over mcp"

            claimed = await client.call_tool("claim_next", {"lease_ttl_seconds": 60})
            assert claimed.structured_content is not None
            assert claimed.structured_content["empty"] is False
            assert claimed.structured_content["todo"]["id"] == todo_id

            beat = await client.call_tool("heartbeat", {"id": todo_id, "lease_ttl_seconds": 300})
            assert beat.is_error is False

            done = await client.call_tool("complete", {"id": todo_id, "result": {"ok": 1}})
            assert done.structured_content is not None
            assert done.structured_content["todo"]["state"] == "done"

            empty = await client.call_tool("claim_next", {})
            assert empty.structured_content == {"empty": True}

            again = await client.call_tool("complete", {"id": todo_id})
            assert again.is_error is True and again.structured_content is None
            assert error_of(again)["code"] == "conflict"

    anyio.run(job)
    assert seen["version"] == EXPECTED_VERSION[mode]
    assert set(tx_personas.agent.scope_verbs) <= seen["tools"]
    todo = Todo.objects.get()
    assert todo.state == TodoState.DONE and todo.result == {"ok": 1} and todo.source == "mcp"


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_the_sdk_sees_only_granted_tools_and_a_refusal_as_is_error(
    tx_personas: Personas, live_url: str, mode: str
) -> None:
    endpoint, token = services.endpoint_vend(
        actor=FIXTURE,
        owner=tx_personas.owner,
        name="Reader",
        queues=["inbox"],
        verbs=["list_todos"],
        rps=0,
    )
    url = f"{live_url}/mcp/{endpoint.slug}"
    seen: dict[str, Any] = {}

    async def look() -> None:
        async with connect(url, token, mode) as client:
            seen["tools"] = [t.name for t in (await client.list_tools()).tools]
            listed = await client.call_tool("list_todos", {"state": "pending"})
            seen["listed"] = listed.structured_content
            refused = await client.call_tool("claim_next", {})
            seen["refused"] = (refused.is_error, error_of(refused))

    anyio.run(look)
    assert seen["tools"] == ["list_todos"]
    assert seen["listed"] == {"todos": [], "paused_queues": [], "next_cursor": None}
    is_error, error = seen["refused"]
    assert is_error is True and error["code"] == "forbidden"
