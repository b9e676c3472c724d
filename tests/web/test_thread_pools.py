"""A web process serves the agents' synchronous requests on ``AGENT_THREADS`` threads of their
own and every other one on ``WEB_THREADS`` (``switchboard.asgi.OneHopHandler``): the agents'
requests never hold more than their few threads, and neither side's load holds the other's."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psycopg
import pytest
from django.db import connection

from switchboard.asgi import OneHopHandler
from switchboard.liveserver import live_server
from tests.conftest import Personas, database_url, lock_waiters, push
from tests.inprocess import agent_scope, idle_in_pool, settle


def test_agents_waiting_on_a_lock_hold_only_their_threads_and_the_console_still_answers(
    tx_personas: Personas,
) -> None:
    push(tx_personas, 1)
    auth = {"Authorization": f"Bearer {tx_personas.agent_token}"}
    with live_server(database_url(), env={"AGENT_THREADS": "2", "WEB_THREADS": "2"}) as base:
        claimed = httpx.post(f"{base}/api/v1/agent/claim_next", headers=auth, json={}, timeout=30)
        assert claimed.status_code == 200
        todo_id = claimed.json()["todo"]["id"]
        with psycopg.connect(database_url()) as holder, ThreadPoolExecutor(3) as pool:
            holder.execute("SELECT 1 FROM queues_todo WHERE id = %s FOR UPDATE", [todo_id])

            def complete(_: int) -> httpx.Response:
                return httpx.post(
                    f"{base}/api/v1/agent/complete",
                    headers=auth,
                    json={"id": todo_id},
                    timeout=60,
                )

            completing = [pool.submit(complete, n) for n in range(3)]
            # Two of the three wait on the lock, one in each agent thread; the third waits for
            # a thread, not in the database.
            assert settle(lambda: lock_waiters() == 2, timeout=15)
            time.sleep(0.5)
            assert lock_waiters() == 2
            assert not any(f.done() for f in completing)
            # Both agent threads are held: the console is served by threads of its own.
            page = httpx.get(f"{base}/login/", timeout=10)
            assert page.status_code == 200 and "<form" in page.text
            assert lock_waiters() == 2
            holder.rollback()  # the lock goes: all three are answered, the first completes it
            answers = sorted(f.result(timeout=30).status_code for f in completing)
    assert answers[0] == 200 and answers[1:] == [409, 409], answers


@pytest.mark.parametrize(
    "content_type",
    # The agent path's own (AgentPath), and Django's (a body typed text/plain: AgentPath leaves
    # it to Django, whose API reads it as JSON).
    [b"application/json", b"text/plain"],
    ids=["agent-path", "djangos-path"],
)
def test_an_agent_request_is_served_while_every_console_thread_is_held(
    tx_personas: Personas, content_type: bytes
) -> None:
    handler = OneHopHandler(threads=1, agent_threads=1)
    release = threading.Event()
    body = b"{}"
    push(tx_personas, 1)

    async def scenario() -> list[dict[str, Any]]:
        holding = asyncio.ensure_future(handler.workers.run(release.wait, 30))
        await asyncio.sleep(0.05)  # the console's one thread is now held
        sent: list[dict[str, Any]] = []
        received = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            return received.pop(0) if received else {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = agent_scope("claim_next", tx_personas.agent_token, body, content_type=content_type)
        assert handler.agent_path.route(scope) is not None  # the content type decides
        await asyncio.wait_for(handler(scope, receive, send), timeout=20)
        assert not holding.done()  # served while the console's thread was still held
        release.set()
        assert await holding is True
        # The connection the agent thread (the only one) kept, read on that thread.
        kept.append(await handler.agent_workers.run(lambda: connection.connection))
        return sent

    kept: list[Any] = []
    sent = asyncio.run(scenario())
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert json.loads(sent[1]["body"])["todo"]["state"] == "claimed"
    # AgentPath writes its answer compactly; Django's path as ninja renders it.
    compact = content_type == b"application/json"
    assert (b'"todo":{' in sent[1]["body"]) == compact, sent[1]["body"][:80]
    # Nothing outlives the test: Django's path gives the thread's connection back at the
    # request's end; the agent path keeps it, and the thread gives it back once idle (followed
    # by identity: other threads of the test process move the pool's count, ci133).
    if not compact:
        assert kept == [None]
    else:
        assert kept[0] is not None
        assert settle(lambda: idle_in_pool(kept[0]), timeout=5)
