"""The doorbell over MCP: agents on both official SDKs, connected with the handshake, receive a
notifications/resources/updated naming the todo, queue and reason on the GET stream the SDK opens
after connecting, with no polling; on the 2026-07-28 revision the Python SDK's ``listen`` receives
the same on its ``subscriptions/listen`` stream (the TypeScript SDK negotiates 2025-11-25). Rings are counted exactly: a todo waiting before the agent
connects proves the stream is attached (its attach ring), and a sentinel todo closes the count."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
from django.db import connection
from mcp import Client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from mcp.client.subscriptions import ResourceUpdated
from mcp.types import ResourceUpdatedNotification, SubscriptionFilter

from queues import services
from switchboard import mcp
from tests.conftest import FIXTURE, Personas, push
from tests.mcp.conftest import NODE, initialize


def _pushed(p: Personas, n: int = 1, queue: str = "inbox") -> list[str]:
    """Push from a worker thread (the SDK's event loop must not run the ORM), committed."""
    try:
        return [str(t.id) for t in push(p, n, queue=queue)]
    finally:
        connection.close()


def _ring(params: dict[str, Any]) -> tuple[str, str, str]:
    meta = params["_meta"][mcp.READY_META]
    assert params["uri"] == f"{mcp.TODO_URI}{meta['todo']}"
    return meta["todo"], meta["queue"], meta["reason"]


def test_a_python_sdk_agent_is_told_of_new_work_on_its_stream(
    tx_personas: Personas, live_url: str
) -> None:
    p = tx_personas
    (waiting,) = push(p, 1)
    url = f"{live_url}/mcp/{p.agent.slug}"
    rings: list[tuple[str, str, str]] = []

    async def agent() -> None:
        send, receive = anyio.create_memory_object_stream[dict[str, Any]](100)

        async def on_message(message: Any) -> None:
            if isinstance(message, ResourceUpdatedNotification):
                await send.send(message.params.model_dump(by_alias=True))

        http = create_mcp_http_client(headers={"Authorization": f"Bearer {p.agent_token}"})
        transport = streamable_http_client(url, http_client=http)
        async with (
            send,
            receive,
            http,
            Client(transport, mode="legacy", message_handler=on_message),
        ):
            with anyio.fail_after(30):
                assert _ring(await receive.receive()) == (str(waiting.id), "inbox", "waiting")
                first, second = await anyio.to_thread.run_sync(_pushed, p, 2)
                (sentinel,) = await anyio.to_thread.run_sync(_pushed, p, 1, "outbox")
                while True:
                    ring = _ring(await receive.receive())
                    if ring[0] == sentinel:
                        break
                    rings.append(ring)
        assert rings == [(first, "inbox", "created"), (second, "inbox", "created")]

    anyio.run(agent)


def test_a_typescript_sdk_agent_is_told_of_new_work_on_its_stream(
    tx_personas: Personas, live_url: str, js_clients: Path
) -> None:
    p = tx_personas
    (waiting,) = push(p, 1)
    env = {**os.environ, "MCP_URL": f"{live_url}/mcp/{p.agent.slug}", "MCP_TOKEN": p.agent_token}
    agent = subprocess.Popen(
        [NODE, str(js_clients / "listen.mjs")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[dict[str, Any]] = queue.Queue()

    def read() -> None:
        assert agent.stdout is not None
        for line in agent.stdout:
            lines.put(json.loads(line))

    threading.Thread(target=read, daemon=True).start()
    try:
        assert lines.get(timeout=30) == {"connected": "2025-11-25"}
        assert _ring(lines.get(timeout=30)) == (str(waiting.id), "inbox", "waiting")
        first, second = push(p, 2)
        (sentinel,) = push(p, 1, queue="outbox")
        rings = []
        while (ring := _ring(lines.get(timeout=30)))[0] != str(sentinel.id):
            rings.append(ring)
        assert rings == [(str(first.id), "inbox", "created"), (str(second.id), "inbox", "created")]
    finally:
        agent.terminate()
        _, errors = agent.communicate(timeout=15)
        print(errors)  # shown when the test fails


def test_a_python_sdk_agent_on_the_2026_revision_listens_and_is_told_of_new_work(
    tx_personas: Personas, live_url: str
) -> None:
    """The 2026-07-28 revision has no GET stream: the SDK's ``Client.listen`` sends
    ``subscriptions/listen`` and iterates the response stream (no handshake, no polling)."""
    p = tx_personas
    (waiting,) = push(p, 1)
    url = f"{live_url}/mcp/{p.agent.slug}"
    told: list[str] = []

    async def agent() -> None:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {p.agent_token}"})
        async with http, Client(streamable_http_client(url, http_client=http)) as client:
            assert client.session.protocol_version == "2026-07-28"
            async with client.listen(resource_subscriptions=[mcp.TODO_URI]) as subscription:
                assert subscription.honored.resource_subscriptions == [mcp.TODO_URI]
                with anyio.fail_after(30):
                    first_event = await subscription.__anext__()
                    assert first_event == ResourceUpdated(uri=f"{mcp.TODO_URI}{waiting.id}")
                    first, second = await anyio.to_thread.run_sync(_pushed, p, 2)
                    (sentinel,) = await anyio.to_thread.run_sync(_pushed, p, 1, "outbox")
                    async for event in subscription:
                        assert isinstance(event, ResourceUpdated)
                        if event.uri == f"{mcp.TODO_URI}{sentinel}":
                            break
                        told.append(event.uri)
        assert told == [f"{mcp.TODO_URI}{first}", f"{mcp.TODO_URI}{second}"]

    anyio.run(agent)


def test_a_listen_for_nothing_this_server_sends_is_acknowledged_empty_and_closed_gracefully(
    tx_personas: Personas, live_url: str
) -> None:
    p = tx_personas
    url = f"{live_url}/mcp/{p.agent.slug}"

    async def agent() -> None:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {p.agent_token}"})
        async with (
            http,
            Client(streamable_http_client(url, http_client=http)) as client,
            client.listen(tools_list_changed=True) as subscription,
        ):
            assert subscription.honored == SubscriptionFilter()
            with anyio.fail_after(30):
                assert [event async for event in subscription] == []

    anyio.run(agent)


def _listen(p: Personas) -> tuple[dict[str, Any], dict[str, str]]:
    """A ``subscriptions/listen`` to the todos (the 2026-07-28 revision), as the wire has it."""
    meta = {mcp.PROTOCOL_VERSION_KEY: "2026-07-28", mcp.CLIENT_CAPABILITIES_KEY: {}}
    body = {
        "jsonrpc": "2.0",
        "id": "listen-7",
        "method": "subscriptions/listen",
        "params": {
            "notifications": {"resourceSubscriptions": [mcp.TODO_URI], "toolsListChanged": True},
            "_meta": meta,
        },
    }
    headers = {
        "Authorization": f"Bearer {p.agent_token}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "subscriptions/listen",
    }
    return body, headers


def test_the_listen_stream_on_the_wire_acknowledges_first_and_stamps_every_frame(
    tx_personas: Personas, live_url: str
) -> None:
    p = tx_personas
    (waiting,) = push(p, 1)
    body, headers = _listen(p)
    url = f"{live_url}/mcp/{p.agent.slug}"
    with httpx.Client(timeout=httpx.Timeout(10.0, read=30.0)) as http:
        refused = http.post(url, json=body, headers={**headers, "Accept": "application/json"})
        assert refused.status_code == 406
        with http.stream("POST", url, json=body, headers=headers) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            frames = (
                json.loads(line[5:]) for line in response.iter_lines() if line.startswith("data:")
            )
            ack = next(frames)
            assert ack["method"] == "notifications/subscriptions/acknowledged"
            assert ack["params"] == {
                "notifications": {"resourceSubscriptions": [mcp.TODO_URI]},
                "_meta": {mcp.SUBSCRIPTION_ID_KEY: "listen-7"},
            }
            ring = next(frames)
            assert ring["method"] == "notifications/resources/updated"
            assert ring["params"]["_meta"][mcp.SUBSCRIPTION_ID_KEY] == "listen-7"
            assert _ring(ring["params"]) == (str(waiting.id), "inbox", "waiting")


def _handshake(http: httpx.Client, url: str, bearer: dict[str, str]) -> dict[str, str]:
    """A handshake session's headers (2025-11-25), for its GET stream and its DELETE."""
    opened = http.post(
        url, json=initialize(), headers={**bearer, "Accept": "application/json, text/event-stream"}
    )
    return {
        **bearer,
        "Mcp-Session-Id": opened.headers["Mcp-Session-Id"],
        "MCP-Protocol-Version": "2025-11-25",
    }


def _data(lines: Iterator[str]) -> Iterator[Any]:
    return (json.loads(line[5:]) for line in lines if line.startswith("data:"))


def _rest(lines: Iterator[str], seconds: float = 20.0) -> list[Any]:
    """The frames left on a stream that must end: one still open after ``seconds`` fails the
    test at its next line (a keepalive comes every 15 s, so a plain read would wait for ever)."""
    left: list[Any] = []
    deadline = time.monotonic() + seconds
    for line in lines:
        assert time.monotonic() < deadline, f"the stream did not end: {left}"
        left.extend(_data(iter([line])))
    return left


def test_a_revoke_ends_a_listen_with_the_refusal_and_a_handshake_stream_too(
    tx_personas: Personas, live_url: str
) -> None:
    # A revoked agent's listen went on (keepalives for ever). It now ends with the answer its
    # next request would get, and the handshake revisions' GET stream ends as well.
    p = tx_personas
    (waiting,) = push(p, 1)
    body, headers = _listen(p)
    url = f"{live_url}/mcp/{p.agent.slug}"
    bearer = {"Authorization": f"Bearer {p.agent_token}"}
    with httpx.Client(timeout=httpx.Timeout(10.0, read=30.0)) as http:
        session = _handshake(http, url, bearer)
        with (
            http.stream("POST", url, json=body, headers=headers) as listen,
            http.stream("GET", url, headers={**session, "Accept": "text/event-stream"}) as get,
        ):
            listened, streamed = listen.iter_lines(), get.iter_lines()
            frames, got = _data(listened), _data(streamed)
            assert next(frames)["method"] == "notifications/subscriptions/acknowledged"
            assert _ring(next(frames)["params"])[0] == str(waiting.id)
            assert _ring(next(got)["params"])[0] == str(waiting.id)  # attached
            services.endpoint_revoke(endpoint=p.agent, actor=FIXTURE)
            assert _rest(listened) == [
                {
                    "jsonrpc": "2.0",
                    "id": "listen-7",
                    "error": {
                        "code": -32000,
                        "message": "the bearer token is unknown or revoked",
                        "data": {
                            "error": "the bearer token is unknown or revoked",
                            "code": "unauthorized",
                        },
                    },
                }
            ]
            assert _rest(streamed) == []  # the stream ended
        assert http.post(url, json=body, headers=headers).status_code == 401


def test_a_deleted_session_ends_its_get_stream(tx_personas: Personas, live_url: str) -> None:
    # A DELETE ended the session (every request of it answered 404) but its GET stream went on,
    # keepalives and rings, for as long as the client kept it open. It now ends at the next
    # keepalive, at most 15 s later.
    p = tx_personas
    (waiting,) = push(p, 1)
    url = f"{live_url}/mcp/{p.agent.slug}"
    bearer = {"Authorization": f"Bearer {p.agent_token}"}
    with httpx.Client(timeout=httpx.Timeout(10.0, read=30.0)) as http:
        session = _handshake(http, url, bearer)
        with http.stream("GET", url, headers={**session, "Accept": "text/event-stream"}) as get:
            streamed = get.iter_lines()
            assert _ring(next(_data(streamed))["params"])[0] == str(waiting.id)  # attached
            assert http.delete(url, headers=session).status_code == 204
            assert _rest(streamed, seconds=25) == []  # the stream ended
        assert http.get(url, headers={**session, "Accept": "text/event-stream"}).status_code == 404
