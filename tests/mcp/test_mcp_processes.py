"""MCP sessions live in Redis, so a handshake client may land on any web process.

This is why /mcp stays on the hand-written layer: the official package's session manager keeps
sessions in the memory of the process that opened them (issue 10's evaluation: a TypeScript SDK
agent against two worker processes failed 4 runs of 6 with "Session not found").
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from switchboard.liveserver import live_server
from tests.conftest import Personas

HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def rpc(base: str, path: str, headers: dict[str, str], method: str, **params: Any) -> Any:
    message = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    return httpx.post(f"{base}{path}", headers=headers, content=json.dumps(message), timeout=30)


def test_a_session_opened_on_one_process_serves_on_another(
    tx_personas: Personas, live_url: str
) -> None:
    path = f"/mcp/{tx_personas.agent.slug}"
    auth = {**HEADERS, "Authorization": f"Bearer {tx_personas.agent_token}"}
    opened = rpc(
        live_url, path, auth, "initialize",
        protocolVersion="2025-11-25", capabilities={}, clientInfo={"name": "t", "version": "0"},
    )  # fmt: skip
    session = {**auth, "Mcp-Session-Id": opened.headers["Mcp-Session-Id"]}
    session["MCP-Protocol-Version"] = "2025-11-25"
    with live_server() as other:
        listed = rpc(other, path, session, "tools/list")
        assert listed.status_code == 200 and listed.json()["result"]["tools"]
        called = rpc(other, path, session, "tools/call", name="claim_next", arguments={})
        assert called.json()["result"]["structuredContent"] == {"empty": True}
        ended = httpx.delete(f"{other}{path}", headers=session, timeout=30)
        assert ended.status_code == 204
    assert rpc(live_url, path, session, "ping").status_code == 404
