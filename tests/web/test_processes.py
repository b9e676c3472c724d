"""Several web processes serve one Switchboard: what they must share, they share through Redis
and PostgreSQL, never in process memory (issue 11).

Two server processes run at once and agents hit both in a race of real connections: the
endpoint's request rate is one bucket, an MCP session opened on one process serves on the
other, and the counters add up every process's claims. The README's production command
(gunicorn with uvicorn workers) serves REST, MCP and the console's event stream.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore

from queues import metrics, services
from switchboard.core import counters
from switchboard.liveserver import live_server
from tests.conftest import FIXTURE, Personas, database_url, push

MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture
def two_servers(tx_personas: Personas) -> Iterator[tuple[str, str]]:
    url = database_url()
    with live_server(url) as one, live_server(url) as two:
        yield one, two


def _race(calls: list[tuple[str, dict[str, str]]]) -> list[httpx.Response]:
    """Every POST at once, one connection each, released together."""
    answers: list[httpx.Response | None] = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def post(i: int, url: str, headers: dict[str, str]) -> None:
        with httpx.Client(timeout=30) as client:
            start.wait()
            answers[i] = client.post(url, headers=headers, json={})

    threads = [
        threading.Thread(target=post, args=(i, url, headers))
        for i, (url, headers) in enumerate(calls)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [a for a in answers if a is not None]


def test_the_endpoint_rate_is_one_bucket_across_processes(
    tx_personas: Personas, two_servers: tuple[str, str]
) -> None:
    _, token = services.endpoint_vend(
        actor=FIXTURE, owner=tx_personas.owner, name="Rated", queues=["inbox"], rps=0.1, burst=6
    )
    auth = {"Authorization": f"Bearer {token}"}
    calls = [(f"{base}/api/v1/agent/claim_next", auth) for base in two_servers for _ in range(8)]
    answers = _race(calls)
    admitted = [a for a in answers if a.status_code == 200]
    refused = [a for a in answers if a.status_code == 429]
    # One bucket of six for both processes (a bucket per process would admit twelve); the
    # refill is one per ten seconds, so at most one more within the race.
    assert 6 <= len(admitted) <= 7, [a.status_code for a in answers]
    assert len(admitted) + len(refused) == 16
    assert all(r.json()["code"] == "rate_limited" and r.headers["Retry-After"] for r in refused)


def _rpc(base: str, path: str, headers: dict[str, str], method: str, **params: Any) -> Any:
    message = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    return httpx.post(f"{base}{path}", headers=headers, content=json.dumps(message), timeout=30)


def test_an_mcp_session_opened_on_one_process_serves_on_the_other_while_both_run(
    tx_personas: Personas, two_servers: tuple[str, str]
) -> None:
    one, two = two_servers
    path = f"/mcp/{tx_personas.agent.slug}"
    auth = {**MCP_HEADERS, "Authorization": f"Bearer {tx_personas.agent_token}"}
    opened = _rpc(
        one, path, auth, "initialize",
        protocolVersion="2025-11-25", capabilities={}, clientInfo={"name": "t", "version": "0"},
    )  # fmt: skip
    session = {
        **auth,
        "Mcp-Session-Id": opened.headers["Mcp-Session-Id"],
        "MCP-Protocol-Version": "2025-11-25",
    }
    push(tx_personas, 1)
    called = _rpc(two, path, session, "tools/call", name="claim_next", arguments={})
    assert called.json()["result"]["structuredContent"]["empty"] is False
    assert _rpc(one, path, session, "ping").json()["result"] == {}
    assert httpx.delete(f"{two}{path}", headers=session, timeout=30).status_code == 204
    assert _rpc(one, path, session, "ping").status_code == 404


def _claimed_total() -> int:
    return sum(counters.read(metrics.CLAIMED).values())


def test_the_counters_add_up_every_process_s_claims(
    tx_personas: Personas, two_servers: tuple[str, str]
) -> None:
    push(tx_personas, 12)
    before = _claimed_total()
    auth = {"Authorization": f"Bearer {tx_personas.agent_token}"}
    calls = [(f"{base}/api/v1/agent/claim_next", auth) for base in two_servers for _ in range(6)]
    answers = _race(calls)
    assert [a.status_code for a in answers] == [200] * 12
    claimed = {a.json()["todo"]["id"] for a in answers if not a.json()["empty"]}
    assert len(claimed) == 12  # each todo went to exactly one agent, whichever process
    deadline = time.monotonic() + 10  # each process flushes its counters every 0.25 s
    while _claimed_total() - before < 12 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _claimed_total() - before == 12
    scraped = httpx.get(
        f"{two_servers[0]}/metrics",
        headers={"Authorization": f"Bearer {settings.METRICS_TOKEN}"},
        timeout=30,
    ).text
    line = next(
        x for x in scraped.splitlines() if x.startswith(metrics.CLAIMED + '{queue="inbox"}')
    )
    assert float(line.split()[-1]) == _claimed_total()


def _session_cookie(user: Any) -> dict[str, str]:
    store = SessionStore()
    store[SESSION_KEY] = str(user.pk)
    store[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    store[HASH_SESSION_KEY] = user.get_session_auth_hash()
    store.save()
    return {settings.SESSION_COOKIE_NAME: str(store.session_key)}


def test_the_production_command_serves_the_agent_api_and_the_live_stream(
    tx_personas: Personas,
) -> None:
    push(tx_personas, 1)
    auth = {"Authorization": f"Bearer {tx_personas.agent_token}"}
    with live_server(database_url(), workers=2, server="gunicorn") as base:
        claimed = httpx.post(f"{base}/api/v1/agent/claim_next", headers=auth, json={}, timeout=30)
        assert claimed.status_code == 200 and claimed.json()["empty"] is False
        path = f"/mcp/{tx_personas.agent.slug}"
        message = {
            "jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "complete", "arguments": {"id": claimed.json()["todo"]["id"]}},
        }  # fmt: skip
        opened = _rpc(
            base, path, {**MCP_HEADERS, **auth}, "initialize",
            protocolVersion="2025-11-25", capabilities={}, clientInfo={"name": "t", "version": "0"},
        )  # fmt: skip
        session = {**MCP_HEADERS, **auth, "Mcp-Session-Id": opened.headers["Mcp-Session-Id"]}
        done = httpx.post(f"{base}{path}", headers=session, content=json.dumps(message), timeout=30)
        assert done.json()["result"]["structuredContent"]["todo"]["state"] == "done"
        cookies = _session_cookie(tx_personas.owner)
        with (
            httpx.Client(cookies=cookies, timeout=30) as browser,
            browser.stream("GET", f"{base}/live?queue=inbox&here=/") as stream,
        ):
            assert stream.status_code == 200
            assert stream.headers["content-type"] == "text/event-stream"
            first = next(stream.iter_lines())
            assert first.startswith("retry:")
