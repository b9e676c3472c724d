"""A todo never comes back to pending naming a limit that is not declared: an operator's retry of
a dead letter whose limit was deleted is refused (``limit_undeclared``, naming the kind and
name) and a bulk retry leaves it out; a create racing a delete either lands before the delete
counts it (409) or finds no declaration (400). A todo from before these checks, naming a rate
limit no longer declared, is refused by the claim saying so, and explain says the same."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
from django.db import connection, connections, transaction

from admission.limits import services as limit_services
from admission.limits.models import Pool, RateLimit
from queues import selectors, services
from queues.models import Todo, TodoState
from queues.selectors import Selection
from switchboard.core.errors import Conflict, Deferred, InvalidArgument
from tests.conftest import Personas, lock_waiters, push, run_threads
from tests.limits.conftest import pool, tag

# (kind as the limits API names it, its declaration, what a todo names)
KINDS: list[tuple[str, Any, dict[str, Any]]] = [
    ("pool", lambda: pool("gpu", slots=1), {"pool": "gpu"}),
    ("tag", lambda: tag("gpu", 1), {"tags": ["gpu"]}),
    ("rate", lambda: RateLimit.objects.create(name="gpu", base_limit=5), {"rate_limit": "gpu"}),
]


def dead_letter(p: Personas, **names: Any) -> Todo:
    [todo] = push(p, 1, max_attempts=1, **names)
    claimed = services.claim(actor=p.as_agent(), todo_id=todo.id)
    services.fail(actor=p.as_agent(), todo_id=todo.id, attempt=claimed.attempt, error={"x": 1})
    todo.refresh_from_db()
    assert todo.state == TodoState.FAILED and todo.dead_letter
    return todo


@pytest.mark.parametrize(("kind", "declare", "names"), KINDS, ids=[k for k, _, _ in KINDS])
def test_a_dead_letter_naming_a_deleted_limit_is_not_retried_and_a_bulk_retry_leaves_it_out(
    personas: Personas, kind: str, declare: Any, names: dict[str, Any]
) -> None:
    p = personas
    declare()
    dead = dead_letter(p, **names)
    limit_services.limit_delete(actor=p.as_human(p.admin), kind=kind, name="gpu")
    with pytest.raises(Conflict) as refused:
        services.todo_retry(actor=p.as_human(), todo_id=dead.id)
    assert refused.value.details["reason"] == "limit_undeclared"
    assert (refused.value.details["kind"], refused.value.details["name"]) == (kind, "gpu")
    assert "not declared" in refused.value.message
    assert Todo.objects.get(pk=dead.pk).state == TodoState.FAILED
    preview = selectors.bulk_preview(
        actor=p.as_human(), action="retry", selection=Selection(state="dead_letter")
    )
    assert (preview.count, preview.left_out) == (0, 1)


def test_a_dead_letter_whose_limits_are_all_declared_is_retried(personas: Personas) -> None:
    p = personas
    pool("gpu", slots=1)
    tag("vendor.a", 1)
    dead = dead_letter(p, pool="gpu", tags=["vendor.a"])
    preview = selectors.bulk_preview(
        actor=p.as_human(), action="retry", selection=Selection(state="dead_letter")
    )
    assert (preview.count, preview.left_out) == (1, 0)
    assert services.todo_retry(actor=p.as_human(), todo_id=dead.id).state == TodoState.PENDING


def test_a_todo_naming_a_rate_limit_no_longer_declared_is_refused_saying_so(
    personas: Personas,
) -> None:
    # A todo from before intake and retry checked (its declaration deleted under it).
    p = personas
    RateLimit.objects.create(name="openai", base_limit=5)
    [todo] = push(p, 1, rate_limit="openai")
    RateLimit.objects.filter(name="openai").delete()
    with pytest.raises(Deferred) as refused:
        services.claim(actor=p.as_agent(), todo_id=todo.id)
    assert refused.value.details["reason"] == "limit_undeclared"
    assert "rate limit openai is not declared" in refused.value.message
    assert "quarantined" not in refused.value.message
    explained = selectors.todo_explain(todo)
    assert explained is not None and explained.binding is not None
    assert explained.binding.gate == "rate_limit"
    assert explained.binding.reason == "limit_undeclared"
    assert explained.binding.next_eligible_at is None


def test_a_create_racing_the_delete_of_its_pool_lands_first_or_is_refused(
    tx_personas: Personas,
) -> None:
    """The create stalls between its check and its insert on a row lock held by a side session
    (its endpoint's, which the create takes after checking); the delete runs meanwhile. Without
    the declaration held the delete counted no live todo and removed the pool, and the create
    then wrote a pending todo naming a pool that no longer existed."""
    p = tx_personas
    pool("gpu", slots=1)
    side = psycopg.connect(**connection.get_connection_params())
    side.execute("SELECT id FROM queues_endpoint WHERE id = %s FOR UPDATE", [p.agent.id])
    outcome: dict[str, Any] = {}

    def create() -> None:
        try:
            outcome["create"] = services.todo_create(
                actor=p.as_agent(), endpoint=p.agent, queue="inbox", title="t", pool="gpu"
            )
        except InvalidArgument as exc:
            outcome["create"] = exc
        finally:
            connections.close_all()

    def delete() -> None:
        try:
            outcome["delete"] = limit_services.limit_delete(
                actor=p.as_human(p.admin), kind="pool", name="gpu"
            )
        except Conflict as exc:
            outcome["delete"] = exc
        finally:
            connections.close_all()

    creator = threading.Thread(target=create)
    creator.start()
    deadline = time.monotonic() + 10
    while lock_waiters() < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    deleter = threading.Thread(target=delete)
    deleter.start()
    deleter.join(timeout=1)  # it waits for the create, or finishes: either is fine
    side.rollback()
    side.close()
    creator.join(timeout=30)
    deleter.join(timeout=30)
    created, deleted = outcome["create"], outcome["delete"]
    # Exactly one of the two lands, and no live todo names an undeclared pool.
    if isinstance(created, InvalidArgument):
        assert created.details["field"] == "pool"
        assert not isinstance(deleted, Conflict)
    else:
        assert isinstance(deleted, Conflict) and deleted.details["live_todos"] == 1
    live = Todo.objects.filter(pool="gpu", state=TodoState.PENDING).count()
    declared = Pool.objects.filter(name="gpu").exists()
    assert live == 0 or declared


def test_a_delete_racing_a_create_that_holds_its_pool_counts_the_todo(
    tx_personas: Personas,
) -> None:
    """The other order: the create has found its pool declared and is stalled on its insert (a
    side transaction holds the same idempotency key, uncommitted) when the delete counts. The
    delete waits for the create's commit and counts its todo (409); counting first and only
    then waiting to remove the row, it found none, and the create's todo named a deleted pool."""
    p = tx_personas
    pool("gpu", slots=1)
    side_holds, side_ends = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def side() -> None:
        try:
            with transaction.atomic():
                push(p, 1, idempotency_key="k")
                side_holds.set()
                side_ends.wait(30)
                transaction.set_rollback(True)
        finally:
            connections.close_all()

    def create() -> None:
        try:
            [outcome["create"]] = push(p, 1, idempotency_key="k", pool="gpu")
        except Exception as exc:  # shown by the assertion below
            outcome["create"] = exc
        finally:
            connections.close_all()

    def delete() -> None:
        try:
            outcome["delete"] = limit_services.limit_delete(
                actor=p.as_human(p.admin), kind="pool", name="gpu"
            )
        except Conflict as exc:
            outcome["delete"] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=side)]
    threads[0].start()
    assert side_holds.wait(10)
    for target, waiters in ((create, 1), (delete, 2)):
        threads.append(threading.Thread(target=target))
        threads[-1].start()
        # Until it waits (or, the delete, has finished without waiting).
        deadline = time.monotonic() + 3
        while threads[-1].is_alive() and lock_waiters() < waiters:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    side_ends.set()
    for t in threads:
        t.join(timeout=30)
    assert getattr(outcome["create"], "pool", outcome["create"]) == "gpu"
    assert isinstance(outcome["delete"], Conflict)
    assert outcome["delete"].details["live_todos"] == 1
    assert Pool.objects.filter(name="gpu").exists()


def test_retries_racing_the_delete_of_their_pool_never_leave_a_todo_naming_it(
    tx_personas: Personas,
) -> None:
    """Operator retries (one at a time and in bulk) and the pool's delete, each on a connection of
    its own, started together, in several rounds: whichever lands first, no pending todo ever
    names a pool that is not declared (a retry holds the declaration FOR KEY SHARE; the delete
    counts after locking the row)."""
    p = tx_personas
    selection = Selection(state="dead_letter")
    for round_ in range(6):
        name = f"gpu{round_}"
        pool(name, slots=5)
        one = dead_letter(p, pool=name)
        for _ in range(3):
            dead_letter(p, pool=name)
        token = selectors.bulk_preview(
            actor=p.as_human(), action="retry", selection=selection
        ).token

        def act(i: int, one: Todo = one, token: str = token, name: str = name) -> str:
            try:
                if i == 0:
                    services.todo_retry(actor=p.as_human(), todo_id=one.id)
                elif i == 1:
                    services.todos_bulk(
                        actor=p.as_human(), action="retry", selection=selection, token=token
                    )
                else:
                    limit_services.limit_delete(actor=p.as_human(p.admin), kind="pool", name=name)
            except (Conflict, InvalidArgument) as exc:
                return exc.code
            return "done"

        run_threads(3, act)
        declared = set(Pool.objects.values_list("name", flat=True))
        live = set(
            Todo.objects.filter(state__in=[TodoState.PENDING, TodoState.CLAIMED])
            .exclude(pool=None)
            .values_list("pool", flat=True)
        )
        assert live <= declared, (round_, live, declared)
