"""What a budget says while it holds work, and when an ending rings for it: a cap lowered below
what is held (eligible only once enough leases lapse), a completion that frees no slot of a full
cap (no ``reopened``), and a paused queue its budget holds too (both say so)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import Client

from admission import selectors
from admission.models import AdmissionPolicy
from queues import gates, services, sql, wakes
from queues import selectors as queue_selectors
from queues.models import Todo
from queues.services import Claimed, NothingClaimable
from switchboard.core.errors import Deferred
from tests.admission.conftest import budget
from tests.admission.test_race import far_start
from tests.api.conftest import Api, human_token
from tests.conftest import Personas, push, run_threads, statements
from tests.mcp.test_mcp_typescript import run_agent
from tests.pause.helpers import Listener, pause


def claim(p: Personas, ttl: int) -> Todo:
    got = services.claim_next(actor=p.as_agent(), queue="inbox", lease_ttl_seconds=ttl)
    assert isinstance(got, Claimed)
    return got.todo


def held_leases() -> list[datetime]:
    leases = Todo.objects.filter(state="claimed").values_list("lease_expires_at", flat=True)
    return sorted(t for t in leases if t is not None)


def sweep() -> timedelta:
    return timedelta(seconds=settings.SWEEP_INTERVAL_SECONDS)


def rings(listener: Listener) -> list[tuple[str, str]]:
    """(queue identity, reason) of each ring committed since the last drain: what the agents'
    event streams (REST and MCP) are sent."""
    out = []
    for raw in listener.drain_raw():
        body = wakes.parse(raw)
        assert body is not None, raw
        out.append((wakes.payload(body["e"], body["q"]), body["r"]))
    return out


# --- 2. a cap lowered below what is held ------------------------------------------------------


def lowered_below_held(p: Personas) -> list[datetime]:
    """Four claims held (leases 60 s, 10, 20 and 30 minutes), then the cap lowered to 2: two
    must end for in-flight to drop below it, so the third lease's expiry is when."""
    budget(p, max_in_flight=10)
    push(p, 6)
    for ttl in (60, 600, 1200, 1800):
        claim(p, ttl)
    budget(p, max_in_flight=2)
    leases = held_leases()
    assert len(leases) == 4
    return leases


def test_a_cap_lowered_below_what_is_held_is_eligible_when_enough_leases_lapse(
    personas: Personas,
) -> None:
    p = personas
    leases = lowered_below_held(p)
    frees = leases[2] + sweep()  # held 4 - cap 2 + 1 = the 3rd earliest

    empty = services.claim_next(actor=p.as_agent(), queue="inbox")
    assert isinstance(empty, NothingClaimable)
    [entry] = empty.deferred
    assert entry["reason"] == "in_flight_full"
    assert entry["next_eligible_at"] == frees

    pending = Todo.objects.filter(state="pending").first()
    assert pending is not None
    with pytest.raises(Deferred) as refused:
        services.claim(actor=p.as_agent(), todo_id=pending.id)
    assert refused.value.details["next_eligible_at"] == frees.isoformat().replace("+00:00", "Z")

    [status] = selectors.admission_status(p.as_agent(), "inbox")
    assert status["status"]["next_eligible_at"] == frees
    assert (
        gates.statuses([(p.agent.id, "inbox")])[(p.agent.id, "inbox")]["next_eligible_at"] == frees
    )
    [budget_says] = [g for g in gates.explain(pending) if g.gate == "budget"]
    assert budget_says.holds and budget_says.next_eligible_at == frees


def test_at_the_cap_the_earliest_lease_frees_a_slot_without_another_statement(
    personas: Personas,
) -> None:
    p = personas
    budget(p, max_in_flight=2)
    push(p, 3)
    claim(p, 600)
    claim(p, 60)
    policy = AdmissionPolicy.objects.get(endpoint=p.agent, queue="inbox")
    with statements() as seen:
        ev = selectors.evaluate_policy(policy)
    assert ev.next_eligible_at == held_leases()[0] + sweep()
    assert len(seen) == 1  # admission_usage alone, as before


def test_the_operator_api_says_when_a_lowered_cap_admits_again(personas: Personas) -> None:
    p = personas
    leases = lowered_below_held(p)
    owner_api = Api(Client(), human_token(p.owner))
    body = owner_api.get(f"/api/v1/admission/endpoint:{p.agent.slug}/inbox").json()
    assert body["status"]["reason"] == "in_flight_full"
    assert body["status"]["next_eligible_at"] == _z(leases[2] + sweep())


def _z(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


# --- 4. an ending rings reopened only when it frees a slot of a full cap -----------------------


def test_completing_under_a_cap_far_from_full_rings_nothing(tx_personas: Personas) -> None:
    p = tx_personas
    budget(p, max_in_flight=50)
    push(p, 2)
    held = claim(p, 600)
    listener = Listener()
    try:
        services.complete(actor=p.as_agent(), todo_id=held.id)
        assert rings(listener) == []
    finally:
        listener.close()


def test_completing_at_a_full_cap_rings_reopened_once(tx_personas: Personas) -> None:
    p = tx_personas
    budget(p, max_in_flight=2)
    push(p, 3)
    first = claim(p, 600)
    claim(p, 600)
    listener = Listener()
    try:
        services.complete(actor=p.as_agent(), todo_id=first.id)
        assert rings(listener) == [(f"{p.agent.id}:inbox", "reopened")]
    finally:
        listener.close()


def test_an_ending_over_a_lowered_cap_frees_no_slot_and_rings_nothing(
    tx_personas: Personas,
) -> None:
    p = tx_personas
    budget(p, max_in_flight=5)
    push(p, 4)
    first = claim(p, 600)
    second = claim(p, 600)
    claim(p, 600)
    budget(p, max_in_flight=1)
    listener = Listener()
    try:
        services.complete(actor=p.as_agent(), todo_id=first.id)  # 2 held of 1
        services.complete(actor=p.as_agent(), todo_id=second.id)  # 1 held of 1
        assert rings(listener) == []
    finally:
        listener.close()


def test_endings_racing_under_a_cap_far_from_full_ring_nothing(tx_personas: Personas) -> None:
    """Sixteen completions at once on real connections: none freed a slot anything waited for,
    so none rings (each rang ``reopened`` before, for the same oldest pending todo)."""
    p = tx_personas
    budget(p, max_in_flight=50)
    push(p, 20)
    held = [claim(p, 600) for _ in range(16)]
    listener = Listener()
    try:
        run_threads(16, lambda i: services.complete(actor=p.as_agent(), todo_id=held[i].id))
        assert rings(listener) == []
    finally:
        listener.close()


# --- 5. a paused queue its budget holds too ----------------------------------------------------


def test_an_empty_claim_next_on_a_paused_queue_names_its_spent_window_too(
    personas: Personas,
) -> None:
    p = personas
    budget(p, per="day", limit=1, start=far_start())
    push(p, 3)
    claim(p, 600)
    pause(p.pauser, "inbox")
    resets = selectors.identity_status(p.agent.id, "inbox")
    assert resets is not None and resets.next_eligible_at is not None

    for queue in ("inbox", None):
        empty = services.claim_next(actor=p.as_agent(), queue=queue)
        assert isinstance(empty, NothingClaimable)
        said = {e["reason"]: e for e in empty.deferred if e["queue"] == "inbox"}
        assert set(said) == {"queue_paused", "window_exhausted"}
        assert said["queue_paused"]["next_eligible_at"] is None
        assert said["window_exhausted"]["next_eligible_at"] == resets.next_eligible_at
        assert said["window_exhausted"]["pending"] == 2
        assert said["window_exhausted"]["window"]["binding"] is True


@pytest.mark.parametrize("gated", [False, True], ids=["statement", "locked-path"])
def test_a_paused_queue_lists_its_pause_before_its_budget_on_either_path(
    personas: Personas, gated: bool
) -> None:
    """The order is the README's whichever path answered: the locked path (taken for a while
    after a gate said no) listed the budget's entry first, the statement's the pause's, so the
    same claim_next flipped between the two from one call to the next."""
    p = personas
    budget(p, per="day", limit=1, start=far_start())
    push(p, 3)
    claim(p, 600)
    pause(p.pauser, "inbox")
    for queue in ("inbox", None):
        if gated:
            sql.mark_gated(p.agent.id)
        empty = services.claim_next(actor=p.as_agent(), queue=queue)
        assert isinstance(empty, NothingClaimable)
        reasons = [e["reason"] for e in empty.deferred if e["queue"] == "inbox"]
        assert reasons == ["queue_paused", "window_exhausted"], queue


def test_an_empty_claim_next_on_a_paused_queue_names_its_full_cap_too(
    personas: Personas,
) -> None:
    p = personas
    budget(p, max_in_flight=1)
    push(p, 2)
    claim(p, 600)
    pause(p.pauser, "inbox")

    empty = services.claim_next(actor=p.as_agent(), queue="inbox")
    assert isinstance(empty, NothingClaimable)
    assert [(e["reason"], e["next_eligible_at"]) for e in empty.deferred] == [
        ("queue_paused", None),
        ("in_flight_full", held_leases()[0] + sweep()),
    ]


def test_rest_answers_both_the_pause_and_the_budget(personas: Personas, client: Client) -> None:
    p = personas
    budget(p, per="day", limit=1, start=far_start())
    push(p, 2)
    claim(p, 600)
    pause(p.pauser, "inbox")
    body: dict[str, Any] = Api(client, p.agent_token).verb("claim_next", {}).json()
    assert body["empty"] is True
    reasons = [(e["queue"], e["reason"], e["next_eligible_at"] is None) for e in body["deferred"]]
    assert reasons == [("inbox", "queue_paused", True), ("inbox", "window_exhausted", False)]


def test_the_typescript_sdk_accepts_the_pause_and_the_budget_holding_one_queue(
    tx_personas: Personas, live_url: str, js_clients: Path
) -> None:
    """Over MCP, checked by the TypeScript SDK against claim_next's output schema."""
    p = tx_personas
    budget(p, max_in_flight=1)
    push(p, 2)
    claim(p, 600)
    pause(p.pauser, "inbox")
    # The live server is a process of its own: it learns paused names within the period it
    # keeps them (queues.selectors.paused_names).
    time.sleep(queue_selectors.PAUSED_NAMES_SECONDS + 0.2)
    report = run_agent(
        js_clients, f"{live_url}/mcp/{p.agent.slug}", p.agent_token, [["claim_next", {}]]
    )
    [call] = report["calls"]
    assert "thrown" not in call and call["isError"] is False, call
    empty = call["structuredContent"]
    assert empty["empty"] is True
    assert [(e["reason"], e["next_eligible_at"]) for e in empty["deferred"]] == [
        ("queue_paused", None),
        ("in_flight_full", _z(held_leases()[0] + sweep())),
    ]


def test_an_empty_claim_next_on_an_unpaused_budgeted_queue_lists_its_budget_once(
    personas: Personas,
) -> None:
    p = personas
    budget(p, per="day", limit=1, start=far_start())
    push(p, 2)
    claim(p, 600)
    empty = services.claim_next(actor=p.as_agent(), queue="inbox")
    assert isinstance(empty, NothingClaimable)
    assert [e["reason"] for e in empty.deferred] == ["window_exhausted"]
