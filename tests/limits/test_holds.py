"""What the surfaces say of work a named limit holds: an empty claim_next's deferred entries name
their limits (kind and name) and keep a quarantine's work apart from a full limit's; a limit
lowered below what is held frees when enough holders have lapsed, not the first; a rate limit's
hold is exact (or not) alike on every surface; only a quarantine that refuses is in force; a
holder whose claim a quarantine expired is told so."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from django.conf import settings
from django.test import Client

from admission.limits import selectors as limit_selectors
from admission.limits import services as limit_services
from admission.limits.models import RateLimit
from queues import selectors, services
from queues.services import Claimed, NothingClaimable
from switchboard.core.errors import Conflict, Deferred
from tests.conftest import Personas, push
from tests.limits.conftest import clear_of_a_minute_boundary, pool, push_named
from tests.mcp.test_mcp_sdk import connect
from tests.mcp.test_mcp_typescript import run_agent


def empty_claim(p: Personas) -> NothingClaimable:
    result = services.claim_next(actor=p.as_agent())
    assert isinstance(result, NothingClaimable)
    return result


def test_an_empty_claim_next_names_each_limit_and_keeps_a_quarantine_apart(
    personas: Personas,
) -> None:
    p = personas
    pool("gpu", slots=1)
    pool("tpu", slots=1)
    first, _ = push_named(p, 2, pool="gpu")
    push_named(p, 3, pool="tpu")
    services.claim(actor=p.as_agent(), todo_id=first.id, lease_ttl_seconds=60)
    limit_services.limit_quarantine(actor=p.as_human(p.admin), kind="pool", name="tpu")
    entries = {d["reason"]: d for d in empty_claim(p).deferred}
    assert set(entries) == {"pool_full", "limit_quarantined"}
    full, quarantined = entries["pool_full"], entries["limit_quarantined"]
    assert full["limits"] == [{"kind": "pool", "name": "gpu"}] and full["pending"] == 1
    assert full["next_eligible_at"] is not None
    assert quarantined["limits"] == [{"kind": "pool", "name": "tpu"}]
    assert quarantined["pending"] == 3 and quarantined["next_eligible_at"] is None


def test_the_rest_answer_names_the_limits_holding_the_work(personas: Personas) -> None:
    p = personas
    pool("gpu", slots=1)
    first, _ = push_named(p, 2, pool="gpu")
    services.claim(actor=p.as_agent(), todo_id=first.id)
    body = (
        Client()
        .post(
            "/api/v1/agent/claim_next",
            "{}",
            content_type="application/json",
            headers={"Authorization": f"Bearer {p.agent_token}"},
        )
        .json()
    )
    assert body["empty"] is True
    assert body["deferred"][0]["limits"] == [{"kind": "pool", "name": "gpu"}]


def test_the_mcp_answer_names_the_limits_and_its_schema_allows_them(
    tx_personas: Personas, live_url: str
) -> None:
    p = tx_personas
    pool("gpu", slots=1)
    first, _ = push_named(p, 2, pool="gpu")
    services.claim(actor=p.as_agent(), todo_id=first.id)
    seen: dict[str, Any] = {}

    async def job() -> None:
        async with connect(f"{live_url}/mcp/{p.agent.slug}", p.agent_token, "auto") as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            seen["schema"] = tools["claim_next"].output_schema
            seen["answer"] = (await client.call_tool("claim_next", {})).structured_content

    anyio.run(job)
    assert seen["answer"]["deferred"][0]["limits"] == [{"kind": "pool", "name": "gpu"}]
    assert "limits" in seen["schema"]["$defs"]["DeferredQueueOut"]["properties"]


def test_a_pool_lowered_below_what_is_held_frees_when_enough_holders_have_lapsed(
    personas: Personas,
) -> None:
    p = personas
    pool("gpu", slots=2)
    short, long, waiting = push_named(p, 3, pool="gpu")
    services.claim(actor=p.as_agent(), todo_id=short.id, lease_ttl_seconds=60)
    held = services.claim(actor=p.as_agent(), todo_id=long.id, lease_ttl_seconds=3600)
    limit_services.limit_set(actor=p.as_human(p.admin), kind="pool", name="gpu", slots=1)
    # Held 2 under 1 slot: both must go before one is free; the later lease decides.
    assert held.todo.lease_expires_at is not None
    frees = held.todo.lease_expires_at + timedelta(seconds=settings.SWEEP_INTERVAL_SECONDS)
    [entry] = empty_claim(p).deferred
    assert entry["next_eligible_at"] == frees
    with pytest.raises(Deferred) as refused:
        services.claim(actor=p.as_agent(), todo_id=waiting.id)
    assert refused.value.details["next_eligible_at"] == frees.isoformat().replace("+00:00", "Z")
    explained = selectors.todo_explain(waiting)
    assert explained is not None and explained.binding is not None
    assert explained.binding.next_eligible_at == frees


def test_a_rate_limit_hold_is_exact_alike_on_claim_next_and_on_a_claim_by_id(
    personas: Personas,
) -> None:
    p = personas
    clear_of_a_minute_boundary()
    RateLimit.objects.create(name="openai", base_limit=1)
    first, second = push(p, 2, rate_limit="openai")
    assert isinstance(services.claim(actor=p.as_agent(), todo_id=first.id), Claimed)
    [entry] = empty_claim(p).deferred
    with pytest.raises(Deferred) as refused:
        services.claim(actor=p.as_agent(), todo_id=second.id)
    # At the next minute boundary the count starts again: a certain instant, on both surfaces.
    assert entry["exact"] is True and refused.value.details["exact"] is True
    assert entry["next_eligible_at"].second == 0
    assert refused.value.details["next_eligible_at"] == entry["next_eligible_at"].isoformat(
        timespec="seconds"
    ).replace("+00:00", "Z")
    assert entry["limits"] == [{"kind": "rate", "name": "openai"}]


@pytest.mark.parametrize(("posture", "in_force"), [("enforce", ["pool:gpu"]), ("off", [])])
def test_only_a_quarantine_that_refuses_is_in_force(
    personas: Personas, posture: str, in_force: list[str]
) -> None:
    pool("gpu", slots=0, posture=posture)
    overview = limit_selectors.limits_overview()
    assert overview["quarantines"]["in_force"] == in_force


def test_a_holder_whose_claim_a_quarantine_expired_is_told_so(personas: Personas) -> None:
    p = personas
    pool("gpu", slots=2)
    [todo] = push_named(p, 1, pool="gpu")
    claimed = services.claim(actor=p.as_agent(), todo_id=todo.id)
    limit_services.limit_quarantine(actor=p.as_human(p.admin), kind="pool", name="gpu")
    for verb in (services.complete, services.heartbeat):
        with pytest.raises(Conflict) as refused:
            verb(actor=p.as_agent(), todo_id=todo.id, attempt=claimed.attempt)
        details = refused.value.details
        assert details["reason"] == "limit_quarantined"
        assert (details["kind"], details["name"]) == ("pool", "gpu")
        assert "quarantine of pool gpu" in refused.value.message


def test_the_typescript_sdk_accepts_the_limits_holding_the_work(
    tx_personas: Personas, live_url: str, js_clients: Path
) -> None:
    """Deferred entries gained ``limits`` and the reason ``limit_quarantined``: the TypeScript
    SDK, which most agent hosts embed, validates claim_next's result against its output schema
    and throws on a field or value the schema does not allow."""
    p = tx_personas
    pool("gpu", slots=1)
    pool("tpu", slots=1)
    first, _ = push_named(p, 2, pool="gpu")
    push_named(p, 1, pool="tpu")
    services.claim(actor=p.as_agent(), todo_id=first.id, lease_ttl_seconds=60)
    limit_services.limit_quarantine(actor=p.as_human(p.admin), kind="pool", name="tpu")
    report = run_agent(
        js_clients, f"{live_url}/mcp/{p.agent.slug}", p.agent_token, [["claim_next", {}]]
    )
    [call] = report["calls"]
    assert "thrown" not in call and call["isError"] is False, call
    entries = {e["reason"]: e for e in call["structuredContent"]["deferred"]}
    assert entries["pool_full"]["limits"] == [{"kind": "pool", "name": "gpu"}]
    assert entries["limit_quarantined"]["limits"] == [{"kind": "pool", "name": "tpu"}]
    assert entries["limit_quarantined"]["next_eligible_at"] is None
