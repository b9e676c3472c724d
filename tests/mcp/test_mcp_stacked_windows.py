"""Stacked windows over MCP, through the official SDK clients (Python, and TypeScript, which
validates every result against the tool's output schema): the agent's claim_next deferral and
admission_status carry every window's use and name the one that binds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from tests.admission.test_stacked_windows import day, stacked, week
from tests.conftest import Personas, push
from tests.mcp.test_mcp_sdk import connect
from tests.mcp.test_mcp_typescript import run_agent

TOKYO_DAY = {"limit": 9, "period": "day", "tz": "Asia/Tokyo", "start": "00:00"}


def test_an_agent_over_mcp_sees_every_window_and_the_one_that_binds(
    tx_personas: Personas, live_url: str
) -> None:
    p = tx_personas
    stacked(p, day(5), week(2), TOKYO_DAY)
    push(p, 3)
    seen: dict[str, Any] = {}

    async def job() -> None:
        async with connect(f"{live_url}/mcp/{p.agent.slug}", p.agent_token, "auto") as client:
            for _ in range(2):
                got = await client.call_tool("claim_next", {})
                assert got.structured_content is not None
                assert got.structured_content["empty"] is False
            held = await client.call_tool("claim_next", {})
            seen["held"] = held.structured_content
            status = await client.call_tool("admission_status", {"queue": "inbox"})
            assert status.is_error is False
            seen["status"] = status.structured_content

    anyio.run(job)
    (entry,) = seen["held"]["deferred"]
    assert seen["held"]["empty"] is True
    assert entry["reason"] == "window_exhausted" and entry["exact"] is True
    assert entry["window"]["period"] == "week" and entry["window"]["tz"] == "Europe/Berlin"
    assert entry["window"]["binding"] is True
    assert entry["next_eligible_at"] == entry["window"]["window_resets_at"]
    (queue,) = seen["status"]["queues"]
    assert queue["status"]["state"] == "deferred"
    assert queue["status"]["window"]["period"] == "week"
    used = [
        (w["period"], w["tz"], w["used"], w["limit"], w["binding"])
        for w in queue["usage"]["windows"]
    ]
    assert used == [
        ("day", "UTC", 2, 5, False),
        ("week", "Europe/Berlin", 2, 2, True),
        ("day", "Asia/Tokyo", 2, 9, False),
    ]
    assert [w["limit"] for w in queue["policy"]["windows"]] == [5, 2, 9]


def test_the_typescript_sdk_accepts_a_deferral_naming_its_window(
    tx_personas: Personas, live_url: str, js_clients: Path
) -> None:
    """The deferral's ``window`` object and the status's window list pass the TypeScript SDK's
    output-schema validation (a schema that disagreed would make it throw, reported as
    ``thrown``)."""
    p = tx_personas
    stacked(p, day(5), week(2), TOKYO_DAY)
    push(p, 3)
    calls = [
        ["claim_next", {}],
        ["claim_next", {}],
        ["claim_next", {}],
        ["admission_status", {"queue": "inbox"}],
    ]
    report = run_agent(js_clients, f"{live_url}/mcp/{p.agent.slug}", p.agent_token, calls)
    for call in report["calls"]:
        assert "thrown" not in call and call["isError"] is False, call
    first, second, held, status = (c["structuredContent"] for c in report["calls"])
    assert first["empty"] is False and second["empty"] is False
    (entry,) = held["deferred"]
    assert held["empty"] is True and entry["reason"] == "window_exhausted"
    assert (entry["window"]["period"], entry["window"]["tz"]) == ("week", "Europe/Berlin")
    assert entry["window"]["binding"] is True
    assert entry["next_eligible_at"] == entry["window"]["window_resets_at"]
    (queue,) = status["queues"]
    assert [(w["period"], w["used"], w["binding"]) for w in queue["usage"]["windows"]] == [
        ("day", 2, False),
        ("week", 2, True),
        ("day", 2, False),
    ]
