"""While a queue is paused: intake persists, every claim path hands out nothing, and work
already in flight finishes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from queues import services
from queues.access import HumanActor
from queues.models import Attempt, Todo, TodoState
from queues.services import Claimed, NothingClaimable
from switchboard.core.errors import Conflict
from tests.conftest import Personas, lapse, push
from tests.pause.helpers import pause, resume


def test_intake_persists_while_the_queue_is_paused(personas: Personas) -> None:
    pause(personas.pauser, "inbox")

    made = push(personas, 3, queue="inbox")

    assert Todo.objects.filter(queue="inbox", state=TodoState.PENDING).count() == 3
    assert all(t.attempt == 0 for t in made)


def test_claim_next_on_a_paused_queue_answers_empty_and_says_the_pause_holds_its_work(
    personas: Personas,
) -> None:
    """Empty as on an empty queue (seed 001: a consumer needs no new branch), and, as for work a
    budget defers, which queue holds how much and why: an agent can tell a pause from no work."""
    empty = services.claim_next(actor=personas.as_agent(), queue="inbox")
    push(personas, 2, queue="inbox")
    pause(personas.pauser, "inbox")

    paused = services.claim_next(actor=personas.as_agent(), queue="inbox")
    across_all_granted = services.claim_next(actor=personas.as_agent())

    assert empty == NothingClaimable(deferred=[])
    for answer in (paused, across_all_granted):
        assert isinstance(answer, NothingClaimable)
        [held] = answer.deferred
        assert {k: held[k] for k in ("queue", "reason", "pending", "next_eligible_at")} == {
            "queue": "inbox",
            "reason": "queue_paused",
            "pending": 2,
            "next_eligible_at": None,
        }
        assert held["pause"]["by"] == personas.pauser.username
    # A paused queue with none of this endpoint's work holds nothing of it.
    resume(personas.pauser, "inbox")
    services.claim_next(actor=personas.as_agent(), queue="inbox")
    services.claim_next(actor=personas.as_agent(), queue="inbox")
    pause(personas.pauser, "outbox")
    assert services.claim_next(actor=personas.as_agent()) == NothingClaimable(deferred=[])


def test_a_paused_queue_holding_only_a_lapsed_claim_says_so(personas: Personas) -> None:
    # A lapsed claim is claimable (a takeover) as pending work is: the pause holds it back.
    push(personas, 1, queue="inbox")
    got = services.claim_next(actor=personas.as_agent(), queue="inbox")
    assert isinstance(got, Claimed)
    lapse(got.todo)
    pause(personas.pauser, "inbox")
    answer = services.claim_next(actor=personas.as_agent())
    assert isinstance(answer, NothingClaimable)
    [held] = answer.deferred
    assert (held["queue"], held["reason"], held["pending"]) == ("inbox", "queue_paused", 1)


def test_claim_next_still_hands_out_the_granted_queues_that_are_not_paused(
    personas: Personas,
) -> None:
    push(personas, 1, queue="inbox")
    [out] = push(personas, 1, queue="outbox")
    pause(personas.pauser, "inbox")

    got = services.claim_next(actor=personas.as_agent())

    assert isinstance(got, Claimed)
    assert got.todo.id == out.id


def test_the_pause_is_fleet_wide_across_endpoints_sharing_the_name(personas: Personas) -> None:
    push(personas, 1, queue="inbox", endpoint=personas.agent2)
    push(personas, 1, queue="inbox", endpoint=personas.foreign)
    pause(personas.pauser, "inbox")

    for endpoint in (personas.agent2, personas.foreign):
        assert isinstance(services.claim_next(actor=personas.as_agent(endpoint)), NothingClaimable)


def test_claiming_a_todo_on_a_paused_queue_is_a_conflict_and_changes_nothing(
    personas: Personas,
) -> None:
    [todo] = push(personas, 1, queue="inbox")
    before = Todo.objects.get(pk=todo.pk)
    pause(personas.pauser, "inbox")

    with pytest.raises(Conflict) as refused:
        services.claim(actor=personas.as_agent(), todo_id=todo.pk)

    assert refused.value.details["reason"] == "queue_paused"
    # Who, when and why, as claim_next's deferred entry says it.
    assert refused.value.details["pause"]["by"] == personas.pauser.username
    assert refused.value.details["pause"]["at"].endswith("Z")
    assert refused.value.as_dict()["code"] == "conflict"
    after = Todo.objects.get(pk=todo.pk)
    assert (after.state, after.attempt, after.owner, after.updated_at) == (
        before.state,
        before.attempt,
        before.owner,
        before.updated_at,
    )
    assert not Attempt.objects.filter(todo=todo).exists()


def test_the_operators_board_claim_is_refused_too(personas: Personas) -> None:
    [todo] = push(personas, 1, queue="inbox")
    pause(personas.pauser, "inbox")

    with pytest.raises(Conflict) as refused:
        services.claim(actor=HumanActor(personas.owner, via="board"), todo_id=todo.pk)

    assert refused.value.details["reason"] == "queue_paused"
    assert Todo.objects.get(pk=todo.pk).state == TodoState.PENDING


def test_a_lapsed_lease_on_a_paused_queue_is_not_taken_over(personas: Personas) -> None:
    [todo] = push(personas, 1, queue="inbox")
    got = services.claim_next(actor=personas.as_agent(), queue="inbox")
    assert isinstance(got, Claimed)
    Todo.objects.filter(pk=todo.pk).update(lease_expires_at=timezone.now() - timedelta(hours=1))
    pause(personas.pauser, "inbox")

    assert isinstance(
        services.claim_next(actor=personas.as_agent(personas.agent), queue="inbox"),
        NothingClaimable,
    )
    with pytest.raises(Conflict):
        services.claim(actor=personas.as_agent(), todo_id=todo.pk)
    assert Todo.objects.get(pk=todo.pk).attempt == 1


def test_in_flight_claims_heartbeat_complete_fail_and_release_while_paused(
    personas: Personas,
) -> None:
    todos = push(personas, 4, queue="inbox")
    claimed = [services.claim_next(actor=personas.as_agent(), queue="inbox") for _ in todos]
    assert all(isinstance(c, Claimed) for c in claimed)
    pause(personas.pauser, "inbox")
    agent = personas.as_agent()
    ids = [t.id for t in todos]

    beat = services.heartbeat(actor=agent, todo_id=ids[0], lease_ttl_seconds=600)
    done = services.complete(actor=agent, todo_id=ids[0], result={"ok": True})
    failed = services.fail(actor=agent, todo_id=ids[1], error="boom")
    released = services.release(actor=agent, todo_id=ids[2])
    operator_released = services.todo_release(actor=personas.as_human(), todo_id=ids[3])

    assert beat.state == TodoState.CLAIMED
    assert done.state == TodoState.DONE
    assert failed.state == TodoState.FAILED and failed.next_retry_at is not None
    assert released.state == TodoState.PENDING
    assert operator_released.state == TodoState.PENDING
    # ...and what went back to pending waits for the resume.
    assert isinstance(services.claim_next(actor=agent, queue="inbox"), NothingClaimable)


def test_paused_todos_spend_no_attempts(personas: Personas) -> None:
    [todo] = push(personas, 1, queue="inbox")
    pause(personas.pauser, "inbox")

    for _ in range(5):
        services.claim_next(actor=personas.as_agent())
        with pytest.raises(Conflict):
            services.claim(actor=personas.as_agent(), todo_id=todo.pk)

    assert Todo.objects.get(pk=todo.pk).attempt == 0
    assert not Attempt.objects.exists()


def test_paused_todos_keep_their_idempotency_slots(personas: Personas) -> None:
    pause(personas.pauser, "inbox")
    first = services.todo_create(
        actor=personas.as_agent(),
        endpoint=personas.agent,
        queue="inbox",
        title="invoice 42",
        idempotency_key="invoice-42",
    )

    again = services.todo_create(
        actor=personas.as_agent(),
        endpoint=personas.agent,
        queue="inbox",
        title="invoice 42 (redelivered)",
        idempotency_key="invoice-42",
    )

    assert first.created is True
    assert again.created is False
    assert again.todo.id == first.todo.id
    assert Todo.objects.filter(idempotency_key="invoice-42").count() == 1


def test_a_retry_whose_backoff_elapses_while_paused_returns_to_pending_and_waits(
    personas: Personas,
) -> None:
    [todo] = push(personas, 1, queue="inbox")
    agent = personas.as_agent()
    assert isinstance(services.claim_next(actor=agent), Claimed)
    services.fail(actor=agent, todo_id=todo.pk, error="flaky")
    pause(personas.pauser, "inbox")
    # The backoff elapses while the queue is paused.
    Todo.objects.filter(pk=todo.pk).update(next_retry_at=timezone.now() - timedelta(hours=1))

    assert isinstance(services.claim_next(actor=agent), NothingClaimable)  # due, but paused
    assert services.requeue_due_retries() == 1
    waiting = Todo.objects.get(pk=todo.pk)
    assert (waiting.state, waiting.attempt, waiting.next_retry_at) == (TodoState.PENDING, 1, None)
    assert isinstance(services.claim_next(actor=agent), NothingClaimable)

    resume(personas.pauser, "inbox")
    again = services.claim_next(actor=agent)
    assert isinstance(again, Claimed)
    assert (again.todo.id, again.attempt) == (todo.id, 2)


def test_a_paused_queue_claims_again_once_resumed(personas: Personas) -> None:
    push(personas, 2, queue="inbox")
    pause(personas.pauser, "inbox")
    assert isinstance(services.claim_next(actor=personas.as_agent()), NothingClaimable)

    resume(personas.pauser, "inbox")

    assert isinstance(services.claim_next(actor=personas.as_agent()), Claimed)
    assert isinstance(services.claim_next(actor=personas.as_agent()), Claimed)
