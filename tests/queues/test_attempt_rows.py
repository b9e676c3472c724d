"""An Attempt row is written when its claim ends, by the statement that ends it, from the todo row
that statement locked (queues migration 0021). The claim in progress is the todo's own columns,
so a todo has at most one open attempt by construction. Raced takeovers and the reaper are in
``test_claims.py``; the randomized trials count ``attempt_count`` (ended rows and claims in
progress) against the claims and charges."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from queues import selectors, services
from queues.access import SystemActor
from queues.models import Attempt, AttemptOutcome, Todo, TodoState
from queues.services import Claimed
from switchboard.core.errors import Conflict
from switchboard.core.tokens import hash_token
from tests.conftest import Personas, attempt_count, attempts_of, lapse, push

BEFORE = ("queues", "0020_todo_live_pool_and_tags_indexes")


def _complete(p: Personas, todo: Todo, token: str) -> None:
    services.complete(actor=p.as_agent(), todo_id=todo.id, lease_token=token, summary="ok")


def _fail(p: Personas, todo: Todo, token: str) -> None:
    services.fail(actor=p.as_agent(), todo_id=todo.id, lease_token=token, error="boom")


def _release(p: Personas, todo: Todo, token: str) -> None:
    services.release(actor=p.as_agent(), todo_id=todo.id, lease_token=token)


def _reap(p: Personas, todo: Todo, token: str) -> None:
    lapse(todo)
    assert services.reap_expired() == 1


def _revoke(p: Personas, todo: Todo, token: str) -> None:
    assert services.endpoint_revoke(actor=SystemActor(via="test"), endpoint=p.agent) == 1


ENDINGS: dict[str, tuple[Callable[[Personas, Todo, str], None], str, str]] = {
    "complete": (_complete, AttemptOutcome.COMPLETED, "done"),
    "fail": (_fail, AttemptOutcome.FAILED, "retry_scheduled"),
    "release": (_release, AttemptOutcome.RELEASED, "requeued"),
    "reap": (_reap, AttemptOutcome.EXPIRED, "requeued"),
    "revoke": (_revoke, AttemptOutcome.REVOKED, "dead_lettered"),
}


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_every_ending_writes_the_claim_s_row_and_clears_the_todo_s_claim(
    personas: Personas, ending: str
) -> None:
    p = personas
    end, outcome, disposition = ENDINGS[ending]
    (todo,) = push(p, 1)
    claimed = services.claim_next(actor=p.as_agent(), claimant="c1", require_fence=True)
    assert isinstance(claimed, Claimed) and claimed.lease_token
    held = Todo.objects.get(pk=todo.pk)
    # In progress: the todo's columns, and no row yet.
    assert (held.owner, held.claim_via) == ("c1", "api")
    assert held.lease_token_hash == hash_token(claimed.lease_token)
    assert not Attempt.objects.exists() and attempt_count() == 1
    (current,) = attempts_of(todo)
    assert current.pk is None and current.outcome is None and current.claimant == "c1"
    end(p, todo, claimed.lease_token)
    (row,) = Attempt.objects.filter(todo=todo)
    assert (row.number, row.claimant, row.via, row.endpoint_id) == (1, "c1", "api", p.agent.id)
    assert row.claimed_at == held.claimed_at and row.lease_token_hash == held.lease_token_hash
    # The lease as it was when the claim ended (the reaper's: lapsed, moved back by ``lapse``).
    assert ending == "reap" or row.lease_expires_at == held.lease_expires_at
    assert held.lease_expires_at is not None
    assert ending != "reap" or row.lease_expires_at < held.lease_expires_at
    assert (row.outcome, row.disposition) == (outcome, disposition)
    # The sweeps' end is their transaction's start (now()), here the test's own transaction.
    assert row.ended_at >= row.claimed_at or ending in ("reap", "revoke")
    after = Todo.objects.get(pk=todo.pk)
    assert after.state != TodoState.CLAIMED
    assert (after.lease_token_hash, after.claim_via) == (None, "")
    assert attempt_count() == 1
    if ending == "complete":
        assert row.summary == "ok"
    if ending == "fail":
        assert row.error == "boom"


def test_a_takeover_writes_the_lapsed_claim_s_row_and_holds_the_new_one(
    personas: Personas,
) -> None:
    p = personas
    (todo,) = push(p, 1)
    first = services.claim_next(actor=p.as_agent(), claimant="slow", require_fence=True)
    assert isinstance(first, Claimed) and first.lease_token
    lapse(todo)
    second = services.claim_next(actor=p.as_agent(), claimant="fast", lease_ttl_seconds=60)
    assert isinstance(second, Claimed) and second.attempt == 2
    (row,) = Attempt.objects.filter(todo=todo)
    assert (row.number, row.claimant, row.outcome, row.disposition) == (
        1,
        "slow",
        AttemptOutcome.SUPERSEDED,
        "requeued",
    )
    assert row.lease_token_hash == hash_token(first.lease_token)
    assert row.ended_at == second.todo.claimed_at
    held = Todo.objects.get(pk=todo.pk)
    assert (held.owner, held.lease_token_hash, held.attempt) == ("fast", None, 2)
    # The superseded holder's token no longer ends anything.
    with pytest.raises(Conflict):
        services.complete(actor=p.as_agent(), todo_id=todo.id, lease_token=first.lease_token)
    services.complete(actor=p.as_agent(), todo_id=todo.id)
    assert [(a.number, a.outcome) for a in attempts_of(todo)] == [
        (1, AttemptOutcome.SUPERSEDED),
        (2, AttemptOutcome.COMPLETED),
    ]


def test_a_heartbeat_moves_only_the_todo_s_lease(personas: Personas) -> None:
    p = personas
    (todo,) = push(p, 1)
    services.claim_next(actor=p.as_agent(), lease_ttl_seconds=10)
    beat = services.heartbeat(actor=p.as_agent(), todo_id=todo.id, lease_ttl_seconds=600)
    assert not Attempt.objects.exists()
    (current,) = attempts_of(todo)
    assert current.lease_expires_at == beat.lease_expires_at
    services.complete(actor=p.as_agent(), todo_id=todo.id)
    assert Attempt.objects.get(todo=todo).lease_expires_at == beat.lease_expires_at


def test_the_todo_page_lists_the_claim_in_progress_first(personas: Personas) -> None:
    p = personas
    (todo,) = push(p, 1)
    services.claim_next(actor=p.as_agent(), claimant="one")
    services.release(actor=p.as_agent(), todo_id=todo.id)
    services.claim_next(actor=p.as_agent(), claimant="two")
    listed = selectors.todo_attempts(Todo.objects.get(pk=todo.pk))
    assert [(a.claimant, a.outcome) for a in listed] == [
        ("two", None),
        ("one", AttemptOutcome.RELEASED),
    ]


def _open_rows() -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT todo_id, number, claimant, via, lease_token_hash FROM queues_attempt"
            " WHERE ended_at IS NULL ORDER BY todo_id"
        )
        return list(cursor.fetchall())


@pytest.mark.django_db(transaction=True)
def test_the_migration_moves_open_attempts_onto_their_todos_and_back() -> None:
    """Reversed, each claimed todo's claim is an open attempt row again; forward, those rows
    move onto the todos and go, and claims made before the migration end as any other."""
    from tests.conftest import make_personas

    p = make_personas()
    todos = push(p, 3)
    services.claim(actor=p.as_agent(), todo_id=todos[0].id, claimant="a")
    services.claim(actor=p.as_agent(), todo_id=todos[1].id, claimant="b")
    services.complete(actor=p.as_agent(), todo_id=todos[1].id)
    executor = MigrationExecutor(connection)
    leaf = executor.loader.graph.leaf_nodes("queues")
    try:
        executor.migrate([BEFORE])
        assert _open_rows() == [(todos[0].id, 1, "a", "api", None)]
    finally:
        executor.loader.build_graph()
        executor.migrate(leaf)
    assert _open_rows() == []
    held = Todo.objects.get(pk=todos[0].pk)
    assert (held.owner, held.claim_via, held.state) == ("a", "api", TodoState.CLAIMED)
    services.complete(actor=p.as_agent(), todo_id=todos[0].id)
    assert [a.outcome for a in attempts_of(todos[0])] == [AttemptOutcome.COMPLETED]
    assert Attempt.objects.count() == 2
