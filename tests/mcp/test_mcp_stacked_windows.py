"""Stacked windows over MCP, through the official SDK client: the agent's claim_next deferral and
admission_status carry every window's use and name the one that binds."""

from __future__ import annotations

from typing import Any

import anyio

from tests.admission.test_stacked_windows import day, stacked, week
from tests.conftest import Personas, push
from tests.mcp.test_mcp_sdk import connect

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
