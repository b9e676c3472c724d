"""Explain (issue 13, item 10): a pending todo lists every gate that may hold it (pause, budget,
pool, tags, rate limit) with its state and next_eligible_at, and names the one that binds; one
selector (``queues.selectors.todo_explain``) behind get_todo on REST and MCP, the operator API and
the console's todo page."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import anyio
from django.test import Client

from admission.limits.models import RateLimit
from queues import pauses, selectors, services
from tests.api.conftest import Api, human_token
from tests.conftest import Personas, push
from tests.limits.conftest import NAMES, everything_full, pool, tag
from tests.mcp.test_mcp_sdk import connect
from tests.web.conftest import signed_in


def in_ms(explain: dict[str, Any]) -> dict[str, Any]:
    def ms(at: str | None) -> str | None:
        return at and datetime.fromisoformat(at).isoformat(timespec="milliseconds")

    return explain | {
        "next_eligible_at": ms(explain["next_eligible_at"]),
        "gates": [g | {"next_eligible_at": ms(g["next_eligible_at"])} for g in explain["gates"]],
    }


def by_gate(explained: selectors.Explanation) -> dict[str, Any]:
    return {g.gate: g for g in explained.gates}


def test_a_held_todo_lists_every_gate_and_the_latest_one_binds(personas: Personas) -> None:
    held = everything_full(personas)
    explained = selectors.todo_explain(held)
    assert explained is not None
    gates = by_gate(explained)
    assert list(gates) == ["pause", "budget", "pool", "tags", "rate_limit"]
    assert {name: g.state for name, g in gates.items()} == {
        "pause": "admits",
        "budget": "admits",
        "pool": "holds",
        "tags": "holds",
        "rate_limit": "holds",
    }
    assert gates["pool"].reason == "pool_full" and gates["pool"].limits == ("gpu",)
    # The advise tag is over too but does not hold: only the enforced one is named.
    assert gates["tags"].limits == ("vendor.a",)
    assert "vendor.b: 1 of 1 held (advise)" in gates["tags"].detail
    assert gates["rate_limit"].reason == "rate_limited"
    assert gates["budget"].detail == "budget (enforce): 1 of 5 in flight"
    latest = max(g.next_eligible_at for g in explained.gates if g.holds and g.next_eligible_at)
    assert explained.binding is not None
    assert explained.binding.next_eligible_at == latest
    # The lease of 600 s outlasts the minute: the pool (lease lapse + a sweep) binds.
    assert explained.binding.gate == "pool"


def test_a_pause_binds_over_every_time_bound_gate(personas: Personas) -> None:
    held = everything_full(personas)
    pauses.queue_pause(actor=personas.as_human(personas.admin), queue="inbox", reason="deploy")
    explained = selectors.todo_explain(held)
    assert explained is not None and explained.binding is not None
    assert explained.binding.gate == "pause" and explained.binding.next_eligible_at is None
    assert explained.as_dict()["binding"] == "pause"


def test_a_claimable_todo_is_bound_by_none(personas: Personas) -> None:
    pool("gpu", slots=2)
    tag("vendor.a", 2)
    tag("vendor.b", 2)
    RateLimit.objects.create(name="openai", base_limit=10)
    [todo] = push(personas, 1, **NAMES)
    explained = selectors.todo_explain(todo)
    assert explained is not None
    assert explained.as_dict()["binding"] == "none"
    assert {g.gate: g.state for g in explained.gates} == dict.fromkeys(
        ["pause", "pool", "tags", "rate_limit"], "admits"
    )


def test_only_a_pending_todo_is_explained(personas: Personas) -> None:
    [todo] = push(personas, 1)
    services.claim(actor=personas.as_agent(), todo_id=todo.id)
    todo.refresh_from_db()
    assert selectors.todo_explain(todo) is None
    got = Api(Client(), personas.agent_token).verb("get_todo", {"id": str(todo.id)}).json()
    assert "explain" not in got["todo"]


def test_the_agent_api_the_operator_api_and_the_console_show_the_same_explain(
    personas: Personas,
) -> None:
    held = everything_full(personas)
    agent = Api(Client(), personas.agent_token).verb("get_todo", {"id": str(held.id)}).json()
    token = human_token(personas.owner)
    operator = (
        Client()
        .get(f"/api/v1/todos/{held.id}", headers={"Authorization": f"Bearer {token}"})
        .json()
    )
    # The operator API writes times to the millisecond (as it does created_at), the agents' to
    # the microsecond: the same instants.
    assert in_ms(agent["todo"]["explain"]) == in_ms(operator["todo"]["explain"])
    explain = agent["todo"]["explain"]
    assert explain["binding"] == "pool"
    assert [g["gate"] for g in explain["gates"]] == [
        "pause",
        "budget",
        "pool",
        "tags",
        "rate_limit",
    ]
    pool_at = datetime.fromisoformat(explain["next_eligible_at"])
    assert all(
        datetime.fromisoformat(g["next_eligible_at"]) <= pool_at
        for g in explain["gates"]
        if g["state"] == "holds"
    )
    page = signed_in(personas.owner).get(f"/todos/{held.id}").content.decode()
    assert "Held by <strong>pool</strong>" in page
    assert "pool gpu: 1 of 1 held (enforce)" in page
    assert "rate limit openai: 1 of 1 claims this minute" in page


def test_mcp_get_todo_explains_a_held_todo(tx_personas: Personas, live_url: str) -> None:
    held = everything_full(tx_personas)
    seen: dict[str, Any] = {}

    async def job() -> None:
        url = f"{live_url}/mcp/{tx_personas.agent.slug}"
        async with connect(url, tx_personas.agent_token, "auto") as client:
            got = await client.call_tool("get_todo", {"id": str(held.id)})
            seen["todo"] = got.structured_content

    anyio.run(job)
    rest = Api(Client(), tx_personas.agent_token).verb("get_todo", {"id": str(held.id)}).json()
    assert seen["todo"]["todo"]["explain"] == rest["todo"]["explain"]
    assert seen["todo"]["todo"]["explain"]["binding"] == "pool"


def test_only_a_limit_of_0_under_enforce_reads_as_quarantined(personas: Personas) -> None:
    """A tag of 0 whose posture is off (the gate admits its todo) read "(quarantined)"."""
    tag("off.zero", 0, posture="off")
    tag("advised.zero", 0, posture="advise")
    tag("held.zero", 0)
    [todo] = push(personas, 1, tags=["off.zero", "advised.zero", "held.zero"])
    explained = selectors.todo_explain(todo)
    assert explained is not None
    detail = by_gate(explained)["tags"].detail
    assert detail.split("; ") == [
        "tag advised.zero: 0 of 0 held (advise)",
        "tag held.zero: 0 of 0 held (enforce) (quarantined)",
        "tag off.zero: 0 of 0 held (off)",
    ]
