"""Pools and tag limits are enforced inside the claim: claim, claim_next and takeovers; each
posture does what it says; a refusal names its gate and when to come back."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from queues import services
from queues.models import Todo, TodoState
from queues.services import Claimed, NothingClaimable
from switchboard.core.errors import Deferred
from switchboard.ledger import chain
from switchboard.ledger.models import LedgerEntry, LedgerKind
from tests.api.conftest import Api
from tests.conftest import Personas, lapse, push
from tests.limits.conftest import pool, push_named, tag


def claim_next(p: Personas) -> Claimed | NothingClaimable:
    return services.claim_next(actor=p.as_agent())


def held(**names: str) -> int:
    return Todo.objects.filter(state=TodoState.CLAIMED, **names).count()


def test_claim_next_fills_a_pool_then_defers_naming_pool_full(personas: Personas) -> None:
    pool("gpu", slots=2)
    push_named(personas, 3, pool="gpu")
    assert isinstance(claim_next(personas), Claimed)
    assert isinstance(claim_next(personas), Claimed)
    third = claim_next(personas)
    assert isinstance(third, NothingClaimable)
    [deferred] = third.deferred
    assert deferred["reason"] == "pool_full" and deferred["queue"] == "inbox"
    assert deferred["pending"] == 1
    earliest = Todo.objects.filter(state=TodoState.CLAIMED).order_by("lease_expires_at").first()
    assert earliest is not None and earliest.lease_expires_at is not None
    assert deferred["next_eligible_at"] == earliest.lease_expires_at + timedelta(
        seconds=settings.SWEEP_INTERVAL_SECONDS
    )
    assert held(pool="gpu") == 2


def test_claim_next_moves_on_to_work_no_limit_holds(personas: Personas) -> None:
    pool("gpu", slots=1)
    push_named(personas, 2, pool="gpu")
    [free] = push(personas, 1, queue="outbox")
    assert isinstance(claim_next(personas), Claimed)
    moved_on = claim_next(personas)
    assert isinstance(moved_on, Claimed) and moved_on.todo.id == free.id


def test_a_claim_by_id_over_a_full_pool_is_deferred_and_changes_nothing(
    personas: Personas,
) -> None:
    pool("gpu", slots=1)
    first, second = push_named(personas, 2, pool="gpu")
    services.claim(actor=personas.as_agent(), todo_id=first.id)
    with pytest.raises(Deferred) as refused:
        services.claim(actor=personas.as_agent(), todo_id=second.id)
    assert refused.value.details["reason"] == "pool_full"
    assert refused.value.details["pool"] == ["gpu"]
    # The shape claim_next's deferred entries use, so an agent reads one (agents6, round 4).
    assert refused.value.details["limits"] == [{"kind": "pool", "name": "gpu"}]
    assert refused.value.details["next_eligible_at"] is not None
    second.refresh_from_db()
    assert second.state == TodoState.PENDING and second.attempt == 0


def test_finishing_a_claim_frees_its_slot(personas: Personas) -> None:
    pool("gpu", slots=1)
    first, second = push_named(personas, 2, pool="gpu")
    services.claim(actor=personas.as_agent(), todo_id=first.id)
    services.complete(actor=personas.as_agent(), todo_id=first.id)
    assert isinstance(services.claim(actor=personas.as_agent(), todo_id=second.id), Claimed)


def test_a_takeover_of_a_lapsed_claim_in_a_full_pool_is_admitted(personas: Personas) -> None:
    pool("gpu", slots=1)
    [todo] = push_named(personas, 1, pool="gpu")
    services.claim(actor=personas.as_agent(), todo_id=todo.id, claimant="silent")
    lapse(todo)
    taken = claim_next(personas)
    assert isinstance(taken, Claimed) and taken.todo.id == todo.id and taken.attempt == 2
    assert held(pool="gpu") == 1


def test_a_quarantined_pool_refuses_with_no_time_to_come_back(personas: Personas) -> None:
    pool("gpu", slots=0)
    [todo] = push_named(personas, 1, pool="gpu")
    with pytest.raises(Deferred) as refused:
        services.claim(actor=personas.as_agent(), todo_id=todo.id)
    assert refused.value.details["next_eligible_at"] is None


def test_a_todo_is_held_by_the_one_full_tag_among_its_tags(personas: Personas) -> None:
    tag("vendor.a", 5)
    tag("vendor.b", 1)
    push_named(personas, 1, tags=["vendor.b"])
    [both] = push_named(personas, 1, tags=["vendor.a", "vendor.b"])
    [only_a] = push_named(personas, 1, tags=["vendor.a"])
    assert isinstance(claim_next(personas), Claimed)
    with pytest.raises(Deferred) as refused:
        services.claim(actor=personas.as_agent(), todo_id=both.id)
    assert refused.value.details["reason"] == "tag_full"
    assert refused.value.details["tags"] == ["vendor.b"]
    assert refused.value.details["limits"] == [{"kind": "tag", "name": "vendor.b"}]
    assert isinstance(services.claim(actor=personas.as_agent(), todo_id=only_a.id), Claimed)


def test_advise_admits_over_the_limit_with_one_waiver_naming_exactly_what_was_exceeded(
    personas: Personas,
) -> None:
    pool("gpu", slots=1, posture="advise")
    tag("vendor.a", 1, posture="advise")
    tag("vendor.b", 5, posture="advise")
    push_named(personas, 2, pool="gpu", tags=["vendor.a", "vendor.b"])
    assert isinstance(claim_next(personas), Claimed)
    assert not LedgerEntry.objects.filter(kind=LedgerKind.LIMITS_WAIVER).exists()
    over = claim_next(personas)
    assert isinstance(over, Claimed)
    rows = LedgerEntry.objects.filter(kind=LedgerKind.LIMITS_WAIVER).order_by("seq")
    waivers = [row.after or {} for row in rows]
    assert [(w["gate"], w["todo"]) for w in waivers] == [
        ("pool", str(over.todo.id)),
        ("tags", str(over.todo.id)),
    ]
    assert [w["exceeded"] for w in waivers] == [
        [{"name": "gpu", "limit": 1, "held": 1}],
        [{"name": "vendor.a", "limit": 1, "held": 1}],
    ]
    assert rows[0].actor_endpoint_slug == "agent"
    assert chain.verify().ok


def test_off_is_inert(personas: Personas) -> None:
    pool("gpu", slots=0, posture="off")
    tag("vendor.a", 0, posture="off")
    push_named(personas, 3, pool="gpu", tags=["vendor.a"])
    assert all(isinstance(claim_next(personas), Claimed) for _ in range(3))
    assert not LedgerEntry.objects.filter(kind=LedgerKind.LIMITS_WAIVER).exists()


def test_an_agent_over_rest_is_told_pool_full_and_when(personas: Personas, client: Client) -> None:
    pool("gpu", slots=1)
    first, second = push_named(personas, 2, pool="gpu")
    api = Api(client, personas.agent_token)
    assert api.verb("claim", {"id": str(first.id)}).status_code == 200
    refused = api.verb("claim", {"id": str(second.id)})
    assert refused.status_code == 409
    body = refused.json()
    assert body["code"] == "deferred" and body["reason"] == "pool_full"
    assert body["next_eligible_at"] > timezone.now().isoformat()[:19]
    empty = api.verb("claim_next", {}).json()
    assert empty["empty"] is True and empty["deferred"][0]["reason"] == "pool_full"
