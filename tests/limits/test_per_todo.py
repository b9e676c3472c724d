"""Pools, tags and rate limits hold the todo that names them, not its queue: claim_next passes
over a held todo and takes the next eligible one on the same queue, in the same statement when
the limit is seen full before any lock, and after a refusal under the lock when it fills in a
race."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection, connections

from admission.limits.locks import POOL_LOCK_CLASS
from admission.limits.models import RateLimit
from queues import services
from queues.models import Todo, TodoState
from queues.services import Claimed, NothingClaimable
from tests.admission.racer import race
from tests.conftest import Personas, database_url, push
from tests.limits.conftest import clear_of_a_minute_boundary, pool, push_named, tag


def claim_next(p: Personas) -> Claimed | NothingClaimable:
    return services.claim_next(actor=p.as_agent())


def test_claim_next_passes_over_a_todo_whose_pool_is_full_to_the_next_on_its_queue(
    personas: Personas,
) -> None:
    pool("gpu", slots=1)
    first, held = push_named(personas, 2, pool="gpu")
    [free] = push(personas, 1)
    services.claim(actor=personas.as_agent(), todo_id=first.id)
    taken = claim_next(personas)
    assert isinstance(taken, Claimed) and taken.todo.id == free.id
    held.refresh_from_db()
    assert held.state == TodoState.PENDING


def test_claim_next_passes_over_a_todo_held_by_one_full_tag_to_a_todo_of_another(
    personas: Personas,
) -> None:
    tag("vendor.a", 1)
    tag("vendor.b", 1)
    first, _ = push_named(personas, 2, tags=["vendor.a"])
    [other] = push_named(personas, 1, tags=["vendor.b"])
    services.claim(actor=personas.as_agent(), todo_id=first.id)
    taken = claim_next(personas)
    assert isinstance(taken, Claimed) and taken.todo.id == other.id


def test_claim_next_passes_over_a_todo_whose_rate_limit_is_spent_this_minute(
    personas: Personas,
) -> None:
    clear_of_a_minute_boundary()
    RateLimit.objects.create(name="openai", base_limit=1)
    first, _ = push_named(personas, 2, rate_limit="openai")
    [free] = push(personas, 1)
    services.claim(actor=personas.as_agent(), todo_id=first.id)
    taken = claim_next(personas)
    assert isinstance(taken, Claimed) and taken.todo.id == free.id


def test_an_advised_or_inert_full_limit_is_not_passed_over(personas: Personas) -> None:
    pool("gpu", slots=1, posture="advise")
    tag("vendor.a", 0, posture="off")
    first, second = push_named(personas, 2, pool="gpu", tags=["vendor.a"])
    push(personas, 1)
    services.claim(actor=personas.as_agent(), todo_id=first.id)
    taken = claim_next(personas)
    assert isinstance(taken, Claimed) and taken.todo.id == second.id


def test_an_empty_claim_next_lists_each_limit_holding_work_with_how_many_it_holds(
    personas: Personas,
) -> None:
    pool("gpu", slots=1)
    tag("vendor.a", 0)
    first, _, _ = push_named(personas, 3, pool="gpu")
    push_named(personas, 2, queue="outbox", tags=["vendor.a"])
    services.claim(actor=personas.as_agent(), todo_id=first.id)
    empty = claim_next(personas)
    assert isinstance(empty, NothingClaimable)
    by_queue = {d["queue"]: d for d in empty.deferred}
    assert by_queue["inbox"]["reason"] == "pool_full" and by_queue["inbox"]["pending"] == 2
    assert by_queue["inbox"]["next_eligible_at"] is not None
    assert by_queue["inbox"]["limits"] == [{"kind": "pool", "name": "gpu"}]
    # A limit of 0 is a quarantine: only an operator frees it.
    assert by_queue["outbox"]["reason"] == "limit_quarantined"
    assert by_queue["outbox"]["pending"] == 2
    assert by_queue["outbox"]["next_eligible_at"] is None
    assert by_queue["outbox"]["limits"] == [{"kind": "tag", "name": "vendor.a"}]


def test_an_empty_claim_next_with_no_work_held_lists_nothing(personas: Personas) -> None:
    pool("gpu", slots=1)
    [todo] = push_named(personas, 1, pool="gpu")
    services.claim(actor=personas.as_agent(), todo_id=todo.id)
    empty = claim_next(personas)
    assert isinstance(empty, NothingClaimable) and empty.deferred == []


def _other_connection() -> psycopg.Connection[Any]:
    return psycopg.connect(**connection.get_connection_params())


def _in_thread(body: Any) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = body()
        except BaseException as exc:  # surfaced by the test
            outcome["error"] = exc
        finally:
            connections.close_all()

    worker = threading.Thread(target=run)
    worker.start()
    return worker, outcome


def test_a_full_pools_todo_is_passed_over_without_waiting_on_the_pools_lock(
    tx_personas: Personas,
) -> None:
    p = tx_personas
    pool("gpu", slots=1)
    first, _ = push_named(p, 2, pool="gpu")
    [free] = push(p, 1)
    services.claim(actor=p.as_agent(), todo_id=first.id)
    holder = _other_connection()
    # The pool's lock (admission.limits.locks), taken exclusive as a claim near the cap does.
    holder.execute("SELECT limits_lock(%s, ARRAY['gpu']::varchar[], NULL)", [POOL_LOCK_CLASS])
    worker, outcome = _in_thread(lambda: services.claim_next(actor=p.as_agent()))
    worker.join(timeout=20)
    finished = not worker.is_alive()
    holder.rollback()
    holder.close()
    worker.join(timeout=20)
    assert finished, "claim_next waited on the lock of a pool it could see was full"
    result = outcome["result"]
    assert isinstance(result, Claimed) and result.todo.id == free.id


def _waiting_on_a_lock(pid: int) -> bool:
    with _other_connection() as probe:
        row = probe.execute(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND pid <> %s", [pid]
        ).fetchone()
    return bool(row and row[0])


def test_a_pool_that_fills_while_the_claim_waits_refuses_that_todo_and_the_claim_takes_the_next(
    tx_personas: Personas,
) -> None:
    p = tx_personas
    pool("gpu", slots=1)
    racing, held = push_named(p, 2, pool="gpu")
    [free] = push(p, 1)
    # Another claim of `racing` is under way: it holds the pool's lock and its todo, not yet
    # committed, so the claim below sees the pool with a free slot and waits for the lock.
    holder = _other_connection()
    # The pool's lock (admission.limits.locks), taken exclusive as a claim near the cap does.
    holder.execute("SELECT limits_lock(%s, ARRAY['gpu']::varchar[], NULL)", [POOL_LOCK_CLASS])
    holder.execute(
        "UPDATE queues_todo SET state = 'claimed', attempt = 1, owner = 'other', "
        "lease_expires_at = now() + interval '1 minute' WHERE id = %s",
        [racing.id],
    )
    worker, outcome = _in_thread(lambda: services.claim_next(actor=p.as_agent()))
    deadline = time.monotonic() + 20
    while not _waiting_on_a_lock(holder.info.backend_pid):
        assert time.monotonic() < deadline, "the claim never waited on the pool's lock"
        time.sleep(0.02)
    holder.commit()
    holder.close()
    worker.join(timeout=20)
    assert not worker.is_alive() and "error" not in outcome, outcome
    result = outcome["result"]
    assert isinstance(result, Claimed) and result.todo.id == free.id
    held.refresh_from_db()
    assert held.state == TodoState.PENDING
    assert Todo.objects.filter(state=TodoState.CLAIMED, pool="gpu").count() == 1


def test_racers_never_overfill_a_pool_or_tag_and_take_every_free_todo_behind_held_ones(
    tx_personas: Personas, tmp_path: Path
) -> None:
    p = tx_personas
    pool("gpu", slots=3)
    tag("vendor.a", 2)
    services.claim(actor=p.as_agent(), todo_id=push_named(p, 1, pool="gpu")[0].id)
    services.claim(actor=p.as_agent(), todo_id=push_named(p, 1, tags=["vendor.a"])[0].id)
    # One queue, oldest first: more held work ahead than there are racers, then free work
    # interleaved with work naming both limits. Open: 2 gpu slots, 1 vendor.a slot, 6 free.
    push_named(p, 12, pool="gpu")
    push_named(p, 12, tags=["vendor.a"])
    free = push(p, 3)
    push_named(p, 4, pool="gpu", tags=["vendor.a"])
    free += push(p, 3)
    reports = race(p.agent.id, 12, tmp_path, database_url(), settings.REDIS_URL)
    assert [r["errors"] for r in reports] == [[], []]
    claimed = [t for r in reports for t in r["claimed"]]
    assert len(claimed) == len(set(claimed))
    held = Todo.objects.filter(state=TodoState.CLAIMED)
    assert held.filter(pool="gpu").count() == 3
    assert held.filter(tags__contains=["vendor.a"]).count() == 2
    # Every free todo was taken, past the held ones, and nothing else beyond the open slots.
    assert {str(t.id) for t in free} <= set(claimed)
    both = held.filter(pool="gpu", tags__contains=["vendor.a"]).count()
    assert len(claimed) == len(free) + 2 + 1 - both
    assert {r for rep in reports for r in rep["deferred"]} == {"pool_full", "tag_full"}
