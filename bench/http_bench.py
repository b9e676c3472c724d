"""Issue 3's bench: claim_next + complete cycles per second over HTTP, REST and MCP, at 8
concurrent clients, against a live uvicorn this module starts; and the same loop in-process
(the services called directly by 8 threads) on the same database in the same run, for the ratio.

A cycle is two requests: claim_next, then complete of the todo it got. REST posts to
/api/v1/agent/…; MCP posts JSON-RPC ``tools/call`` in the 2026-07-28 stateless form (what the
official SDK speaks by default). Endpoints are vended unlimited (rps=0). The clients are threads
of this process, each with its own keep-alive connection; they share the machine with the server.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import httpx
from django.contrib.auth.models import User
from django.db import connection

from bench.common import timed_pool
from queues import services
from queues.access import AgentActor, SystemActor
from queues.models import Endpoint, Todo
from queues.services import Claimed
from switchboard.liveserver import live_server

CLIENTS = 8
QUEUE = "bench-http"
MODERN = "2026-07-28"


def _load(endpoint: Endpoint, n: int) -> None:
    """Fresh pending todos (done ones removed), loaded in one statement."""
    Todo.objects.filter(endpoint=endpoint).delete()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO queues_todo (id, endpoint_id, queue, title, kind, payload, state, owner,
                attempt, max_attempts, source, created_at, updated_at)
            SELECT gen_random_uuid(), %s, %s, 'http bench ' || g, '', '{}'::jsonb,
                   'pending', '', 0, 5, 'api', clock_timestamp(), clock_timestamp()
            FROM generate_series(1, %s) g
            """,
            [endpoint.id, QUEUE, n],
        )
        cursor.execute("ANALYZE queues_todo")


class _Clients:
    """One keep-alive HTTP client per worker thread."""

    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers
        self.local = threading.local()
        self.all: list[httpx.Client] = []
        self.lock = threading.Lock()

    def get(self) -> httpx.Client:
        client: httpx.Client | None = getattr(self.local, "client", None)
        if client is None:
            client = httpx.Client(headers=self.headers, timeout=30)
            self.local.client = client
            with self.lock:
                self.all.append(client)
        return client

    def close(self) -> None:
        for client in self.all:
            client.close()


def _rest_cycle(base: str, clients: _Clients) -> Callable[[int], bool]:
    def cycle(i: int) -> bool:
        http = clients.get()
        claimed = http.post(f"{base}/api/v1/agent/claim_next", json={"claimant": f"rest-{i}"})
        claimed.raise_for_status()
        body = claimed.json()
        if body["empty"]:
            return False
        done = http.post(f"{base}/api/v1/agent/complete", json={"id": body["todo"]["id"]})
        done.raise_for_status()
        return True

    return cycle


def _mcp_call(http: httpx.Client, url: str, name: str, arguments: dict[str, Any]) -> Any:
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": name,
            "arguments": arguments,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": MODERN,
                "io.modelcontextprotocol/clientCapabilities": {},
            },
        },
    }
    response = http.post(
        url,
        content=json.dumps(message),
        headers={"Mcp-Method": "tools/call", "Mcp-Name": name},
    )
    response.raise_for_status()
    result = response.json()["result"]
    if result.get("isError"):
        raise RuntimeError(f"{name} failed: {result['content'][0]['text']}")
    return result["structuredContent"]


def _mcp_cycle(url: str, clients: _Clients) -> Callable[[int], bool]:
    def cycle(i: int) -> bool:
        http = clients.get()
        claimed = _mcp_call(http, url, "claim_next", {"claimant": f"mcp-{i}"})
        if claimed["empty"]:
            return False
        _mcp_call(http, url, "complete", {"id": claimed["todo"]["id"]})
        return True

    return cycle


def _measure(
    endpoint: Endpoint, duration_s: float, cycle: Callable[[int], bool], per_second: int
) -> dict[str, Any]:
    """A short warm-up (imports, connections), then the measured run on a fresh queue."""
    _load(endpoint, 200 + int(per_second * min(1.0, duration_s / 5)))
    timed_pool(CLIENTS, min(1.0, duration_s / 5), cycle)
    _load(endpoint, 500 + int(per_second * duration_s))
    result = timed_pool(CLIENTS, duration_s, cycle)
    result["ran_dry"] = Todo.objects.filter(endpoint=endpoint, state="pending").count() == 0
    return result


def run(duration_s: float = 5.0, *, server_workers: int | None = None) -> dict[str, Any]:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
    workers = server_workers or max(1, min(4, os.cpu_count() or 1))
    owner, _ = User.objects.get_or_create(username="bench-http-owner")
    endpoint, token = services.endpoint_vend(
        actor=SystemActor(via="bench"), owner=owner, name="bench http", queues=[QUEUE], rps=0
    )
    actor = AgentActor(endpoint, via="api")
    results: dict[str, Any] = {
        "duration_s": duration_s,
        "clients": CLIENTS,
        "server": f"uvicorn, {workers} worker process(es), CONN_MAX_AGE="
        f"{os.environ.get('DATABASE_CONN_MAX_AGE', '0')}",
        "mcp_protocol": MODERN,
    }

    def in_process(i: int) -> bool:
        claimed = services.claim_next(actor=actor, claimant=f"local-{i}")
        if not isinstance(claimed, Claimed):
            return False
        services.complete(actor=actor, todo_id=claimed.todo.id)
        return True

    auth = {"Authorization": f"Bearer {token}"}
    rest_clients = _Clients(auth)
    mcp_clients = _Clients(
        {
            **auth,
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "MCP-Protocol-Version": MODERN,
        }
    )
    try:
        results["in_process"] = _measure(endpoint, duration_s, in_process, 3000)
        with live_server(workers=workers) as base:
            results["rest"] = _measure(endpoint, duration_s, _rest_cycle(base, rest_clients), 1500)
            mcp_url = f"{base}/mcp/{endpoint.slug}"
            results["mcp"] = _measure(endpoint, duration_s, _mcp_cycle(mcp_url, mcp_clients), 1500)
    finally:
        rest_clients.close()
        mcp_clients.close()
        Todo.objects.filter(endpoint=endpoint).delete()
        endpoint.delete()
        if not owner.endpoints.exists():
            owner.delete()

    local = results["in_process"]["cycles_per_s"] or 1.0
    results["ratio_rest_vs_in_process"] = round(results["rest"]["cycles_per_s"] / local, 3)
    results["ratio_mcp_vs_in_process"] = round(results["mcp"]["cycles_per_s"] / local, 3)
    return results
