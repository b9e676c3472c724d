"""Named limits ring the doorbell: a raise that frees held work rings ``reopened`` once per queue
identity waiting on it, and a claim ending in a full pool or tag rings once for the work it held;
a lowering, a pool with room, a paused queue ring nothing."""

from __future__ import annotations

import json

from admission.limits.services import limit_set
from queues import services
from queues.access import HumanActor
from queues.services import Claimed
from tests.conftest import Personas, push
from tests.limits.conftest import pool, tag
from tests.pause.helpers import Listener, pause


def _reasons(listener: Listener) -> list[tuple[str, str]]:
    return [(b["e"], b["r"]) for b in map(json.loads, listener.drain_raw())]


def _fill(p: Personas, slots: int, waiting: int, **names: str) -> list[Claimed]:
    """``slots`` claimed todos naming the limit (so it is full) and ``waiting`` more pending."""
    push(p, slots + waiting, **names)  # type: ignore[arg-type]
    claims = [services.claim_next(actor=p.as_agent()) for _ in range(slots)]
    assert all(isinstance(c, Claimed) for c in claims)
    assert not isinstance(services.claim_next(actor=p.as_agent()), Claimed)
    return claims  # type: ignore[return-value]


def test_raising_a_full_pool_rings_reopened_once_for_the_identity_with_waiting_work(
    tx_personas: Personas, listener: Listener
) -> None:
    p = tx_personas
    pool("gpu", slots=1)
    _fill(p, 1, 3, pool="gpu")
    listener.drain()
    limit_set(actor=HumanActor(p.admin), kind="pool", name="gpu", slots=3)
    assert _reasons(listener) == [(str(p.agent.id), "reopened")]


def test_moving_a_full_tag_off_enforce_rings_reopened_once(
    tx_personas: Personas, listener: Listener
) -> None:
    p = tx_personas
    tag("hot", 1)
    _fill(p, 1, 2, tags=["hot"])  # type: ignore[arg-type]
    listener.drain()
    limit_set(actor=HumanActor(p.admin), kind="tag", name="hot", posture="advise")
    assert _reasons(listener) == [(str(p.agent.id), "reopened")]


def test_lowering_or_not_changing_a_full_pool_rings_nothing(
    tx_personas: Personas, listener: Listener
) -> None:
    p = tx_personas
    pool("gpu", slots=2)
    _fill(p, 2, 2, pool="gpu")
    listener.drain()
    limit_set(actor=HumanActor(p.admin), kind="pool", name="gpu", slots=1)
    limit_set(actor=HumanActor(p.admin), kind="pool", name="gpu", slots=1)
    limit_set(
        actor=HumanActor(p.admin), kind="pool", name="gpu", slots=2
    )  # back to full: still held
    assert listener.drain() == []


def test_raising_a_full_pool_for_a_paused_queue_rings_nothing(
    tx_personas: Personas, listener: Listener
) -> None:
    p = tx_personas
    pool("gpu", slots=1)
    _fill(p, 1, 2, pool="gpu")
    pause(p.pauser)
    listener.drain()
    limit_set(actor=HumanActor(p.admin), kind="pool", name="gpu", slots=5)
    assert listener.drain() == []


def test_completing_a_claim_in_a_full_pool_with_work_waiting_rings_reopened_once(
    tx_personas: Personas, listener: Listener
) -> None:
    p = tx_personas
    pool("gpu", slots=1)
    (claim,) = _fill(p, 1, 2, pool="gpu")
    listener.drain()
    services.complete(actor=p.as_agent(), todo_id=claim.todo.id, lease_token=claim.lease_token)
    assert _reasons(listener) == [(str(p.agent.id), "reopened")]


def test_completing_a_claim_in_a_full_tag_with_work_waiting_rings_reopened_once(
    tx_personas: Personas, listener: Listener
) -> None:
    p = tx_personas
    tag("hot", 1)
    (claim,) = _fill(p, 1, 1, tags=["hot"])  # type: ignore[arg-type]
    listener.drain()
    services.complete(actor=p.as_agent(), todo_id=claim.todo.id, lease_token=claim.lease_token)
    assert _reasons(listener) == [(str(p.agent.id), "reopened")]


def test_completing_a_claim_in_a_pool_with_room_rings_nothing(
    tx_personas: Personas, listener: Listener
) -> None:
    p = tx_personas
    pool("gpu", slots=3)
    push(p, 1, pool="gpu")
    claim = services.claim_next(actor=p.as_agent())
    assert isinstance(claim, Claimed)
    push(p, 1, pool="gpu")  # waiting, yet the pool never held it
    listener.drain()
    services.complete(actor=p.as_agent(), todo_id=claim.todo.id, lease_token=claim.lease_token)
    assert listener.drain() == []
