"""The named-limit edges of the doorbell: a freed pool or tag unit rings every queue identity whose
work names that limit, once per commit, whichever way the claim ended (completion, release,
the reaper); and a limit change raced against ending claims and other changes rings exactly once
per identity when it frees work, never when it does not. Rings are counted on a real LISTEN
connection; the races run on threads with connections of their own."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from admission.limits.services import limit_set
from queues import services
from queues.access import HumanActor
from queues.models import Todo
from queues.services import Claimed
from queues.services.sweeps import reap_expired
from tests.conftest import Personas, lock_waiters, push, run_threads
from tests.limits.conftest import pool, tag
from tests.pause.helpers import Listener, in_thread, pause, wait_until


def _rings(listener: Listener) -> list[tuple[str, str, str]]:
    """(endpoint id, queue, reason) of every ring since the last drain, sorted."""
    return sorted((b["e"], b["q"], b["r"]) for b in map(json.loads, listener.drain_raw()))


def _claim(p: Personas, queue: str = "inbox") -> Claimed:
    claim = services.claim_next(actor=p.as_agent(), queue=queue)
    assert isinstance(claim, Claimed), claim
    return claim


def _full_gpu_pool_with_work_in_three_identities(p: Personas) -> Claimed:
    """Pool gpu of one slot held by the agent's inbox; gpu work waits in the agent's inbox and
    outbox and in agent two's inbox."""
    pool("gpu", slots=1)
    push(p, 2, pool="gpu")
    claim = _claim(p)
    push(p, 1, queue="outbox", pool="gpu")
    push(p, 2, endpoint=p.agent2, pool="gpu")
    return claim


def _reopened_everywhere(p: Personas, own: str = "reopened") -> list[tuple[str, str, str]]:
    """One ring for each of the three identities; the ended claim's own queue rings ``own``."""
    return sorted(
        [
            (str(p.agent.id), "inbox", own),
            (str(p.agent.id), "outbox", "reopened"),
            (str(p.agent2.id), "inbox", "reopened"),
        ]
    )


def _lapse(claim: Claimed) -> None:
    Todo.objects.filter(id=claim.todo.id).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )


def test_a_completion_freeing_a_full_pool_rings_every_identity_waiting_on_it_once(
    tx_personas: Personas, listener: Listener
) -> None:
    p = tx_personas
    claim = _full_gpu_pool_with_work_in_three_identities(p)
    listener.drain()
    services.complete(actor=p.as_agent(), todo_id=claim.todo.id, lease_token=claim.lease_token)
    assert _rings(listener) == _reopened_everywhere(p)


def test_a_freed_tag_unit_rings_the_identities_naming_that_tag_and_not_a_paused_one(
    tx_personas: Personas, listener: Listener
) -> None:
    p = tx_personas
    tag("hot", 1)
    tag("cold", 5)
    push(p, 1, tags=["hot"])
    claim = _claim(p)
    push(p, 1, queue="outbox", tags=["hot"])
    push(p, 1, endpoint=p.agent2, tags=["hot", "cold"])
    push(p, 1, endpoint=p.agent2, queue="inbox", tags=["cold"])  # never held by hot
    pause(p.pauser, queue="outbox")
    listener.drain()
    services.complete(actor=p.as_agent(), todo_id=claim.todo.id, lease_token=claim.lease_token)
    assert _rings(listener) == [(str(p.agent2.id), "inbox", "reopened")]


def test_a_release_in_a_full_pool_rings_released_for_its_queue_and_reopened_for_the_others(
    tx_personas: Personas, listener: Listener
) -> None:
    p = tx_personas
    claim = _full_gpu_pool_with_work_in_three_identities(p)
    listener.drain()
    services.release(actor=p.as_agent(), todo_id=claim.todo.id, lease_token=claim.lease_token)
    assert _rings(listener) == _reopened_everywhere(p, own="released")


def test_a_reaped_claim_in_a_full_pool_rings_reaped_for_its_queue_and_reopened_for_the_others(
    tx_personas: Personas, listener: Listener
) -> None:
    p = tx_personas
    claim = _full_gpu_pool_with_work_in_three_identities(p)
    _lapse(claim)
    listener.drain()
    assert reap_expired() == 1
    assert _rings(listener) == _reopened_everywhere(p, own="reaped")


def test_a_reaped_claim_in_a_pool_with_room_rings_only_its_own_queue(
    tx_personas: Personas, listener: Listener
) -> None:
    p = tx_personas
    pool("gpu", slots=3)
    push(p, 1, pool="gpu")
    claim = _claim(p)
    push(p, 1, queue="outbox", pool="gpu")
    _lapse(claim)
    listener.drain()
    assert reap_expired() == 1
    assert _rings(listener) == [(str(p.agent.id), "inbox", "reaped")]


def test_a_raise_and_the_completion_it_races_ring_once_between_them_in_either_order(
    tx_personas: Personas, listener: Listener
) -> None:
    p = tx_personas
    claim = _full_gpu_pool_with_work_in_three_identities(p)
    listener.drain()
    # The raise holds the pool's row lock, uncommitted, while the completion runs: the
    # completion reads the pool under a share lock, so it waits, then sees the unit already
    # freed by the raise and rings nothing of its own.
    raised, go = threading.Event(), threading.Event()

    def raise_and_hold() -> None:
        with transaction.atomic():
            limit_set(actor=HumanActor(p.admin), kind="pool", name="gpu", slots=2)
            raised.set()
            go.wait(30)

    _, raising = in_thread(raise_and_hold)
    assert raised.wait(30)
    _, completing = in_thread(
        lambda: services.complete(
            actor=p.as_agent(), todo_id=claim.todo.id, lease_token=claim.lease_token
        )
    )
    wait_until(lambda: completing.done() or lock_waiters() > 0, "the completion to run")
    go.set()
    raising.result(30)
    completing.result(30)
    assert _rings(listener) == _reopened_everywhere(p)


def test_raises_racing_each_other_a_completion_and_claims_ring_once_per_identity(
    tx_personas: Personas, listener: Listener
) -> None:
    p = tx_personas
    claim = _full_gpu_pool_with_work_in_three_identities(p)
    # Agent two's racing claims take work of another pool: a claim of gpu work could refill
    # the slot the completion frees before a raise frees it again, two legitimate rings.
    pool("cpu", slots=10)
    cpu = push(p, 2, endpoint=p.agent2, pool="cpu")
    listener.drain()

    def act(i: int) -> object:
        if i == 0:
            return services.complete(
                actor=p.as_agent(), todo_id=claim.todo.id, lease_token=claim.lease_token
            )
        if i <= 2:  # agent two claims while the gpu pool frees and is raised
            return services.claim(actor=p.as_agent(p.agent2), todo_id=cpu[i - 1].id)
        return limit_set(actor=HumanActor(p.admin), kind="pool", name="gpu", slots=i + 20)

    results = run_threads(8, act)
    assert all(isinstance(r, Claimed) for r in results[1:3])
    rings = _rings(listener)
    assert sorted(set(rings)) == rings, f"an identity rang twice: {rings}"
    assert {(e, q) for e, q, _ in rings} == {(e, q) for e, q, _ in _reopened_everywhere(p)}


def test_changes_that_free_nothing_ring_nothing_however_they_race(
    tx_personas: Personas, listener: Listener
) -> None:
    p = tx_personas
    pool("gpu", slots=2)
    push(p, 2, pool="gpu")
    _claim(p)
    _claim(p)
    push(p, 1, queue="outbox", pool="gpu")
    push(p, 2, endpoint=p.agent2, pool="gpu")
    listener.drain()

    def act(i: int) -> object:
        if i < 2:  # refused: the pool is full
            return services.claim_next(actor=p.as_agent(p.agent2))
        # a lowering, a no-op, a posture already in force: each leaves the pool full
        slots = {2: 1, 3: 2, 4: 0, 5: 2}.get(i, 1)
        return limit_set(
            actor=HumanActor(p.admin), kind="pool", name="gpu", slots=slots, posture="enforce"
        )

    results = run_threads(8, act)
    assert not any(isinstance(r, Claimed) for r in results[:2])
    assert listener.drain() == []


def test_revoking_an_endpoint_frees_its_pool_units_for_the_other_endpoints_once(
    tx_personas: Personas, listener: Listener
) -> None:
    p = tx_personas
    _full_gpu_pool_with_work_in_three_identities(p)
    listener.drain()
    services.endpoint_revoke(endpoint=p.agent, actor=p.as_human(p.admin))
    # The agent's own work is dead-lettered with it; only agent two's waiting work reopens.
    assert _rings(listener) == [(str(p.agent2.id), "inbox", "reopened")]


def test_revoking_an_endpoint_with_room_in_its_pool_rings_nothing(
    tx_personas: Personas, listener: Listener
) -> None:
    p = tx_personas
    pool("gpu", slots=2)
    push(p, 1, pool="gpu")
    _claim(p)
    push(p, 1, endpoint=p.agent2, pool="gpu")
    listener.drain()
    services.endpoint_revoke(endpoint=p.agent, actor=p.as_human(p.admin))
    assert _rings(listener) == []
