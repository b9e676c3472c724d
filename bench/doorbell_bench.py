"""Issue 14's bench: the doorbell at scale, against a live uvicorn (one worker) this module starts.

1. **Idle streams**: 1,000 agent event streams (``GET /api/v1/agent/events``, 100 endpoints x 10)
   held open; the server process's resident memory before and after attaching, per stream, and
   its CPU use while they sit idle for ``duration`` seconds (keepalives only).
2. **Create to notification** at 100 attached agents (one stream each): a todo is created for a
   random endpoint through the services (a commit, as an API call would make) every 20 ms; the
   time from just before the create to the agent's client reading the ring, p50 and p99.

3. **The same through the official Python MCP SDK** at ``SDK_AGENTS`` agents (``python_sdk``).

The clients are asyncio streams in this process; they share the two cores with the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import statistics
import time
from typing import Any

import httpx
import psutil
from django.contrib.auth.models import User
from django.db import connection

from queues import services
from queues.access import AgentActor, SystemActor
from queues.models import Endpoint
from switchboard.liveserver import live_server

IDLE_STREAMS = 1000
for _name in ("httpx", "httpx2", "mcp"):
    logging.getLogger(_name).setLevel(logging.WARNING)
IDLE_ENDPOINTS = 100
LATENCY_AGENTS = 100
LATENCY_SAMPLES = 300
CREATE_EVERY_S = 0.02
SDK_AGENTS = 20
SDK_SAMPLES = 100


def _server_process(base: str) -> psutil.Process:
    port = base.rsplit(":", 1)[1]
    for child in psutil.Process().children(recursive=True):
        try:
            if "uvicorn" in " ".join(child.cmdline()) and port in child.cmdline():
                return child
        except psutil.Error:
            continue
    raise RuntimeError("the uvicorn process was not found")


def _vend(n: int) -> list[tuple[Endpoint, str]]:
    owner, _ = User.objects.get_or_create(username="bench-doorbell")
    return [
        services.endpoint_vend(
            actor=SystemActor(via="bench"),
            owner=owner,
            name=f"Doorbell {i}",
            queues=["inbox"],
            rps=0,
        )
        for i in range(n)
    ]


async def _attach(
    client: httpx.AsyncClient, base: str, token: str, on_ring: Any = None
) -> asyncio.Task[None]:
    attached = asyncio.Event()

    async def read() -> None:
        headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
        async with client.stream("GET", f"{base}/api/v1/agent/events", headers=headers) as r:
            async for line in r.aiter_lines():
                if line == ": attached":
                    attached.set()
                elif line.startswith("data:") and on_ring is not None:
                    on_ring(json.loads(line[5:]))

    task = asyncio.create_task(read())
    await asyncio.wait_for(attached.wait(), 60)
    return task


async def _idle(base: str, tokens: list[str], duration: float) -> dict[str, Any]:
    server = _server_process(base)
    rss_before = server.memory_info().rss
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=None), limits=limits) as client:
        tasks = []
        for i in range(IDLE_STREAMS):
            tasks.append(await _attach(client, base, tokens[i % len(tokens)]))
        await asyncio.sleep(1)
        rss_after = server.memory_info().rss
        cpu0, t0 = server.cpu_times(), time.perf_counter()
        await asyncio.sleep(duration)
        cpu1, elapsed = server.cpu_times(), time.perf_counter() - t0
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    busy = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    return {
        "idle_streams": IDLE_STREAMS,
        "server_rss_mb_before": round(rss_before / 2**20, 1),
        "server_rss_mb_with_streams": round(rss_after / 2**20, 1),
        "kb_per_stream": round((rss_after - rss_before) / IDLE_STREAMS / 1024, 1),
        "idle_cpu_percent_of_one_core": round(100 * busy / elapsed, 2),
    }


def _create(endpoint: Endpoint) -> str:
    todo = services.todo_create(
        actor=AgentActor(endpoint), endpoint=endpoint, queue="inbox", title="doorbell bench"
    ).todo
    return str(todo.id)


async def _timed_creates(
    agents: list[tuple[Endpoint, str]], received: dict[str, float], samples: int
) -> dict[str, Any]:
    """Create ``samples`` todos for random agents every ``CREATE_EVERY_S``; the time from just
    before each create to its ring in ``received`` (filled by the clients), p50 and p99."""
    sent: dict[str, float] = {}
    rng = random.Random(14)
    for _ in range(samples):
        endpoint = rng.choice(agents)[0]
        t0 = time.perf_counter()
        todo_id = await asyncio.to_thread(_create, endpoint)
        sent[todo_id] = t0
        await asyncio.sleep(CREATE_EVERY_S)
    deadline = time.perf_counter() + 10
    while len(set(sent) & set(received)) < len(sent) and time.perf_counter() < deadline:
        await asyncio.sleep(0.05)
    latencies = sorted(1000 * (received[t] - sent[t]) for t in sent if t in received)
    q = statistics.quantiles(latencies, n=100)
    return {
        "agents": len(agents),
        "samples": len(sent),
        "delivered": len(latencies),
        "create_to_notification_ms_p50": round(q[49], 1),
        "create_to_notification_ms_p99": round(q[98], 1),
    }


async def _latency(base: str, agents: list[tuple[Endpoint, str]]) -> dict[str, Any]:
    received: dict[str, float] = {}

    def on_ring(ring: dict[str, Any]) -> None:
        received.setdefault(ring["todo"], time.perf_counter())

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=None), limits=limits) as client:
        tasks = [await _attach(client, base, token, on_ring) for _, token in agents]
        result = await _timed_creates(agents, received, LATENCY_SAMPLES)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return result


async def _sdk_latency(base: str, agents: list[tuple[Endpoint, str]]) -> dict[str, Any]:
    """The same through the official Python MCP SDK: each agent a ``Client`` after the
    handshake (2025-11-25), told on the GET stream the SDK opens (the Done-when of issue 14)."""
    from mcp import Client
    from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
    from mcp.types import ResourceUpdatedNotification

    from switchboard import mcp

    received: dict[str, float] = {}

    async def on_message(message: Any) -> None:
        if isinstance(message, ResourceUpdatedNotification):
            meta = message.params.model_dump(by_alias=True)["_meta"][mcp.READY_META]
            received.setdefault(meta["todo"], time.perf_counter())

    async with contextlib.AsyncExitStack() as stack:
        for endpoint, token in agents:
            http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
            transport = streamable_http_client(f"{base}/mcp/{endpoint.slug}", http_client=http)
            await stack.enter_async_context(
                Client(transport, mode="legacy", message_handler=on_message)
            )
        await asyncio.sleep(3)  # every SDK has opened its GET stream
        return await _timed_creates(agents, received, SDK_SAMPLES)


def run(duration: float) -> dict[str, Any]:
    endpoints = _vend(max(IDLE_ENDPOINTS, LATENCY_AGENTS))
    connection.close()  # the creates run on worker threads with connections of their own
    with live_server() as base:
        idle = asyncio.run(_idle(base, [t for _, t in endpoints[:IDLE_ENDPOINTS]], duration))
        latency = asyncio.run(_latency(base, endpoints[:LATENCY_AGENTS]))
        sdk = asyncio.run(_sdk_latency(base, endpoints[:SDK_AGENTS]))
    return {**idle, **latency, "python_sdk": sdk, "load_average_1m": os.getloadavg()[0]}
