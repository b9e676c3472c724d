"""The claim paths, the transitions and the sweeps of the foundation, on real PostgreSQL."""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Any

import psycopg
import pytest
from django.db import IntegrityError, connections, transaction
from django.utils import timezone

from queues import services, sql
from queues.models import Attempt, AttemptOutcome, Todo, TodoState
from queues.services import Claimed, NothingClaimable, claiming
from switchboard.core.errors import Conflict, Forbidden, InvalidArgument, NotFound
from switchboard.core.times import iso
from tests.conftest import (
    FIXTURE,
    Personas,
    attempt_count,
    attempts_of,
    claim_and_lapse,
    database_url,
    lapse,
    lock_waiters,
    make_retry_due,
    push,
    run_threads,
)


def test_eight_racers_claim_two_hundred_todos_exactly_once(tx_personas: Personas) -> None:
    p = tx_personas
    todos = push(p, 200)

    def drain(i: int) -> list[Any]:
        got: list[Any] = []
        actor = p.as_agent()
        while True:
            result = services.claim_next(actor=actor, claimant=f"worker-{i}")
            if isinstance(result, NothingClaimable):
                return got
            got.append(result.todo.id)

    results = run_threads(8, drain)
    claimed = [t for batch in results for t in batch]
    assert len(claimed) == 200
    assert set(claimed) == {t.id for t in todos}
    assert attempt_count() == 200 and not Attempt.objects.exists()  # none ended yet
    assert Todo.objects.filter(state=TodoState.CLAIMED, attempt=1).count() == 200
    # More than one racer did real work: the race was a race.
    assert sum(1 for batch in results if batch) > 1


def test_claim_next_takes_the_oldest_first(personas: Personas) -> None:
    first, _second = push(personas, 2)
    result = services.claim_next(actor=personas.as_agent())
    assert isinstance(result, Claimed)
    assert result.todo.id == first.id
    assert result.attempt == 1
    assert result.todo.owner == personas.agent.slug


def test_claim_next_answers_empty_when_there_is_nothing(personas: Personas) -> None:
    result = services.claim_next(actor=personas.as_agent())
    assert isinstance(result, NothingClaimable)
    assert result.deferred == []


def test_claim_next_only_reads_the_granted_queue_asked_for(personas: Personas) -> None:
    push(personas, 1, queue="inbox")
    (out,) = push(personas, 1, queue="outbox")
    result = services.claim_next(actor=personas.as_agent(), queue="outbox")
    assert isinstance(result, Claimed) and result.todo.id == out.id
    with pytest.raises(Forbidden):
        services.claim_next(actor=personas.as_agent(personas.agent2), queue="outbox")


def test_the_quarantine_queue_is_never_delivered(personas: Personas) -> None:
    (todo,) = push(personas, 1, queue="quarantine")
    assert isinstance(services.claim_next(actor=personas.as_agent()), NothingClaimable)
    assert isinstance(
        services.claim_next(actor=personas.as_agent(), queue="quarantine"), NothingClaimable
    )
    with pytest.raises(Conflict):
        services.claim(actor=personas.as_agent(), todo_id=todo.id)
    assert Todo.objects.get(pk=todo.pk).state == TodoState.PENDING


def test_a_lapsed_lease_is_taken_over_and_the_old_attempt_is_superseded(
    personas: Personas,
) -> None:
    (todo,) = push(personas, 1)
    services.claim_next(actor=personas.as_agent(), claimant="slow")
    lapse(todo)
    result = services.claim_next(actor=personas.as_agent(), claimant="fast")
    assert isinstance(result, Claimed)
    assert result.todo.id == todo.id and result.attempt == 2 and result.todo.owner == "fast"
    attempts = attempts_of(todo)
    assert [a.outcome for a in attempts] == [AttemptOutcome.SUPERSEDED, None]
    assert attempts[0].claimant == "slow" and attempts[1].claimant == "fast"
    # The superseded attempt ended when the takeover claimed, and its row is the one written.
    (ended,) = Attempt.objects.filter(todo=todo)
    assert ended.ended_at == result.todo.claimed_at and ended.number == 1


def test_a_live_lease_is_not_taken_over(personas: Personas) -> None:
    (todo,) = push(personas, 1)
    services.claim_next(actor=personas.as_agent())
    assert isinstance(services.claim_next(actor=personas.as_agent()), NothingClaimable)
    with pytest.raises(Conflict):
        services.claim(actor=personas.as_agent(), todo_id=todo.id)


def test_a_lapsed_lease_with_no_attempts_left_is_not_taken_over(personas: Personas) -> None:
    (todo,) = push(personas, 1, max_attempts=1)
    services.claim_next(actor=personas.as_agent())
    lapse(todo)
    assert isinstance(services.claim_next(actor=personas.as_agent()), NothingClaimable)


@pytest.mark.parametrize(
    ("attempt", "delay"),
    [(1, 30), (2, 60), (3, 120), (4, 240), (5, 480), (6, 900), (7, 900), (10, 900)],
)
def test_the_backoff_table(attempt: int, delay: int) -> None:
    assert services.backoff_seconds(attempt) == delay


def test_fail_schedules_a_retry_with_backoff(personas: Personas) -> None:
    (todo,) = push(personas, 1)
    services.claim_next(actor=personas.as_agent())
    before = timezone.now()
    failed = services.fail(actor=personas.as_agent(), todo_id=todo.id, error="boom")
    assert failed.state == TodoState.FAILED and not failed.dead_letter
    assert failed.result == {"error": "boom"}
    assert failed.next_retry_at is not None
    delay = (failed.next_retry_at - before).total_seconds()
    assert 29 <= delay <= 32
    # Not claimable until due; then claimable directly as a due retry.
    assert isinstance(services.claim_next(actor=personas.as_agent()), NothingClaimable)
    make_retry_due(todo)
    again = services.claim_next(actor=personas.as_agent())
    assert isinstance(again, Claimed) and again.attempt == 2
    second = services.fail(actor=personas.as_agent(), todo_id=todo.id)
    assert second.next_retry_at is not None
    assert 59 <= (second.next_retry_at - timezone.now()).total_seconds() <= 61


def test_the_last_failure_dead_letters(personas: Personas) -> None:
    (todo,) = push(personas, 1, max_attempts=2)
    for n in (1, 2):
        claimed = services.claim_next(actor=personas.as_agent())
        assert isinstance(claimed, Claimed) and claimed.attempt == n
        failed = services.fail(actor=personas.as_agent(), todo_id=todo.id, error=f"e{n}")
        make_retry_due(todo) if n == 1 else None
    assert failed.dead_letter and failed.next_retry_at is None and failed.finished_at
    assert Attempt.objects.filter(todo=todo).last().disposition == "dead_lettered"  # type: ignore[union-attr]
    assert isinstance(services.claim_next(actor=personas.as_agent()), NothingClaimable)


def test_release_returns_to_pending_with_the_attempt_unchanged(personas: Personas) -> None:
    (todo,) = push(personas, 1)
    services.claim_next(actor=personas.as_agent())
    released = services.release(actor=personas.as_agent(), todo_id=todo.id)
    assert released.state == TodoState.PENDING and released.attempt == 1
    assert released.next_retry_at is None and released.lease_expires_at is None
    again = services.claim_next(actor=personas.as_agent())
    assert isinstance(again, Claimed) and again.attempt == 2


# A retry's due time before the test's transaction began (its now()).
DUE = timezone.make_aware(datetime(2026, 1, 1))


def test_an_operator_retry_gives_a_fresh_round_and_the_attempt_number_goes_on(
    personas: Personas,
) -> None:
    (todo,) = push(personas, 1, max_attempts=2)
    agent = personas.as_agent()
    for _ in range(2):
        services.claim_next(actor=agent)
        failed = services.fail(actor=agent, todo_id=todo.id)
        if failed.next_retry_at is not None:
            Todo.objects.filter(pk=todo.pk).update(next_retry_at=DUE)
    assert (failed.state, failed.attempt, failed.next_retry_at) == (TodoState.FAILED, 2, None)
    retried = services.todo_retry(actor=personas.as_human(), todo_id=todo.id)
    assert (retried.state, retried.attempt, retried.max_attempts) == (TodoState.PENDING, 2, 4)
    assert retried.retried_after == 2
    claimed = services.claim_next(actor=agent)
    assert isinstance(claimed, Claimed) and claimed.attempt == 3
    # The backoff counts the attempt's place in its round: the first of the new one waits 30 s
    # (2^(3-1) x 30 s, 120 s, counted from the number).
    again = services.fail(actor=agent, todo_id=todo.id)
    assert again.next_retry_at is not None
    assert 25 < (again.next_retry_at - timezone.now()).total_seconds() <= 30
    Todo.objects.filter(pk=todo.pk).update(next_retry_at=DUE)
    services.claim_next(actor=agent)
    last = services.fail(actor=agent, todo_id=todo.id)
    assert (last.state, last.attempt, last.max_attempts, last.next_retry_at) == (
        TodoState.FAILED,
        4,
        4,
        None,
    )  # the new round's two attempts spent: a dead letter again
    # The history numbers every claim once.
    assert [a.number for a in attempts_of(todo)] == [1, 2, 3, 4]
    with pytest.raises(NotFound):
        services.todo_retry(actor=personas.as_human(personas.other_owner), todo_id=todo.id)


def test_a_claim_ended_before_a_retry_never_ends_the_claim_made_after_it(
    personas: Personas,
) -> None:
    # Round 8: a retry set the attempt back to 0, so the next claim was attempt 1 again, and a
    # worker whose attempt 1 had lapsed and been taken over completed it with its stale number.
    (todo,) = push(personas, 1, max_attempts=2)
    agent, operator = personas.as_agent(), personas.as_human()
    services.claim_next(actor=agent, claimant="worker-a")  # attempt 1
    lapse(todo)
    services.claim_next(actor=agent, claimant="worker-b")  # attempt 2, a takeover
    services.fail(actor=agent, todo_id=todo.id, attempt=2)  # the last attempt: a dead letter
    services.todo_retry(actor=operator, todo_id=todo.id)
    claimed = services.claim_next(actor=agent, claimant="worker-c")
    assert isinstance(claimed, Claimed) and claimed.attempt == 3
    for stale in (1, 2):
        for end in (services.complete, services.fail, services.release, services.heartbeat):
            with pytest.raises(Conflict) as refused:
                end(actor=agent, todo_id=todo.id, attempt=stale)
            assert refused.value.details["reason"] == "superseded", (end, stale)
        # The console's Complete, Fail and Release send the attempt the page showed.
        with pytest.raises(Conflict) as refused:
            services.release(actor=operator, todo_id=todo.id, attempt=stale)
        assert refused.value.details["reason"] == "superseded"
    todo.refresh_from_db()
    assert (todo.state, todo.owner, todo.attempt) == (TodoState.CLAIMED, "worker-c", 3)
    done = services.complete(actor=agent, todo_id=todo.id, attempt=3, result={"by": "c"})
    assert (done.state, done.result) == (TodoState.DONE, {"by": "c"})


def test_heartbeat_extends_a_live_lease(personas: Personas) -> None:
    (todo,) = push(personas, 1)
    claimed = services.claim_next(actor=personas.as_agent(), lease_ttl_seconds=10)
    assert isinstance(claimed, Claimed)
    beat = services.heartbeat(actor=personas.as_agent(), todo_id=todo.id, lease_ttl_seconds=600)
    assert beat.lease_expires_at is not None
    assert (beat.lease_expires_at - timezone.now()).total_seconds() > 590
    lapse(todo)
    with pytest.raises(Conflict):
        services.heartbeat(actor=personas.as_agent(), todo_id=todo.id)


def test_lease_ttl_defaults_and_bounds(personas: Personas) -> None:
    push(personas, 2)
    claimed = services.claim_next(actor=personas.as_agent())
    assert isinstance(claimed, Claimed)
    assert claimed.todo.lease_expires_at is not None
    assert 295 <= (claimed.todo.lease_expires_at - timezone.now()).total_seconds() <= 301
    with pytest.raises(InvalidArgument) as err:
        services.claim_next(actor=personas.as_agent(), lease_ttl_seconds=86401)
    assert err.value.field == "lease_ttl_seconds"
    personas.agent.default_lease_ttl_seconds = 60
    personas.agent.save()
    claimed = services.claim_next(actor=personas.as_agent())
    assert isinstance(claimed, Claimed) and claimed.todo.lease_expires_at is not None
    assert 55 <= (claimed.todo.lease_expires_at - timezone.now()).total_seconds() <= 61


def test_fencing_refuses_a_missing_or_wrong_lease_token(personas: Personas) -> None:
    (todo,) = push(personas, 1)
    claimed = services.claim_next(actor=personas.as_agent(), require_fence=True)
    assert isinstance(claimed, Claimed) and claimed.lease_token
    assert claimed.lease_token.startswith("sbl_")
    todo.refresh_from_db()
    assert todo.lease_token_hash == services.hash_token(claimed.lease_token)
    for token in (None, "sbl_wrong"):
        with pytest.raises(Conflict):
            services.heartbeat(actor=personas.as_agent(), todo_id=todo.id, lease_token=token)
        with pytest.raises(Conflict):
            services.complete(actor=personas.as_agent(), todo_id=todo.id, lease_token=token)
    done = services.complete(
        actor=personas.as_agent(), todo_id=todo.id, lease_token=claimed.lease_token, result={"n": 1}
    )
    assert done.state == TodoState.DONE and done.result == {"n": 1}


def test_a_foreign_todo_is_not_found_and_an_own_wrong_state_is_a_conflict(
    personas: Personas,
) -> None:
    (mine,) = push(personas, 1)
    (theirs,) = push(personas, 1, endpoint=personas.foreign)
    for verb in (services.heartbeat, services.complete, services.fail, services.release):
        with pytest.raises(NotFound):
            verb(actor=personas.as_agent(), todo_id=theirs.id)
        with pytest.raises(Conflict):
            verb(actor=personas.as_agent(), todo_id=mine.id)
    with pytest.raises(NotFound):
        services.claim(actor=personas.as_agent(), todo_id=theirs.id)
    assert Todo.objects.get(pk=theirs.pk).state == TodoState.PENDING


def test_the_same_create_after_an_operator_retry_is_still_the_same_request(
    personas: Personas,
) -> None:
    # Round 9: a retry raises max_attempts by the round, and the repeated request was then told
    # it differed in max_attempts (a value it could not even send: over 100).
    actor = personas.as_agent()

    def create(max_attempts: int) -> services.TodoCreated:
        return services.todo_create(
            actor=actor,
            endpoint=personas.agent,
            queue="inbox",
            title="a",
            idempotency_key="k",
            max_attempts=max_attempts,
        )

    todo = create(3).todo
    services.claim(actor=actor, todo_id=todo.id)
    services.fail(actor=actor, todo_id=todo.id)
    retried = services.todo_retry(actor=personas.as_human(), todo_id=todo.id)
    assert (retried.attempt, retried.max_attempts) == (1, 4)
    again = create(3)
    assert (again.created, again.todo.id, again.differs) == (False, todo.id, [])
    assert create(4).differs == ["max_attempts"]


def test_idempotency_returns_the_live_todo_and_frees_the_key_when_done(
    personas: Personas,
) -> None:
    actor = personas.as_agent()
    first = services.todo_create(
        actor=actor, endpoint=personas.agent, queue="inbox", title="a", idempotency_key="k"
    )
    dup = services.todo_create(
        actor=actor, endpoint=personas.agent, queue="inbox", title="b", idempotency_key="k"
    )
    assert first.created and not dup.created and dup.todo.id == first.todo.id
    # Not a retry of the first request: the answer says where the live todo is not what was
    # asked, rather than hand it back as if it were.
    assert dup.differs == ["title"]
    again = services.todo_create(
        actor=actor, endpoint=personas.agent, queue="inbox", title="a", idempotency_key="k"
    )
    assert again.todo.id == first.todo.id and again.differs == []
    elsewhere = services.todo_create(
        actor=actor,
        endpoint=personas.agent,
        queue="outbox",
        title="a",
        payload={"n": 1},
        idempotency_key="k",
    )
    assert elsewhere.todo.queue == "inbox" and elsewhere.differs == ["queue", "payload"]
    # The same key on another endpoint is another todo.
    other = services.todo_create(
        actor=personas.as_agent(personas.agent2),
        endpoint=personas.agent2,
        queue="inbox",
        title="c",
        idempotency_key="k",
    )
    assert other.created
    services.claim(actor=actor, todo_id=first.todo.id)
    services.complete(actor=actor, todo_id=first.todo.id)
    fresh = services.todo_create(
        actor=actor, endpoint=personas.agent, queue="inbox", title="d", idempotency_key="k"
    )
    assert fresh.created and fresh.todo.id != first.todo.id


def test_racing_creates_with_one_key_make_one_todo(tx_personas: Personas) -> None:
    p = tx_personas

    def create(i: int) -> Any:
        return services.todo_create(
            actor=p.as_agent(),
            endpoint=p.agent,
            queue="inbox",
            title=f"t{i}",
            idempotency_key="same",
        )

    results = run_threads(8, create)
    assert sum(1 for r in results if r.created) == 1
    assert len({r.todo.id for r in results}) == 1
    assert Todo.objects.filter(idempotency_key="same").count() == 1


def test_bad_input_names_the_field_and_changes_nothing(personas: Personas) -> None:
    actor = personas.as_agent()
    cases: list[tuple[dict[str, Any], str]] = [
        ({"queue": "bad queue!", "title": "x"}, "queue"),
        ({"queue": "inbox", "title": ""}, "title"),
        ({"queue": "inbox", "title": "x", "max_attempts": 0}, "max_attempts"),
        ({"queue": "inbox", "title": "x", "idempotency_key": ""}, "idempotency_key"),
    ]
    for kwargs, field in cases:
        with pytest.raises(InvalidArgument) as err:
            services.todo_create(actor=actor, endpoint=personas.agent, **kwargs)
        assert err.value.field == field
    with pytest.raises(Forbidden):
        services.todo_create(actor=actor, endpoint=personas.agent, queue="elsewhere", title="x")
    assert Todo.objects.count() == 0


def test_the_database_refuses_what_the_services_refuse(personas: Personas) -> None:
    from django.db import IntegrityError, transaction

    (todo,) = push(personas, 1)
    for change in (
        {"state": "nonsense"},
        {"max_attempts": 0},
        {"attempt": 99},
        {"state": "claimed"},  # a claim with no lease
        {"next_retry_at": timezone.now()},  # a retry on a pending todo
        {"queue": "bad name"},
    ):
        with pytest.raises(IntegrityError), transaction.atomic():
            Todo.objects.filter(pk=todo.pk).update(**change)


def test_reap_expired_requeues_or_dead_letters_at_the_cap(personas: Personas) -> None:
    a, b = push(personas, 1)[0], push(personas, 1, max_attempts=1)[0]
    services.claim(actor=personas.as_agent(), todo_id=a.id)
    services.claim(actor=personas.as_agent(), todo_id=b.id)
    lapse(a)
    lapse(b)
    assert services.reap_expired() == 2
    a.refresh_from_db()
    b.refresh_from_db()
    assert a.state == TodoState.PENDING and a.attempt == 1 and a.lease_expires_at is None
    assert b.dead_letter and b.result == {"error": "lease_expired"}
    assert set(Attempt.objects.values_list("outcome", flat=True)) == {AttemptOutcome.EXPIRED}
    assert services.reap_expired() == 0


def test_requeue_due_retries_moves_due_failures_back_to_pending(personas: Personas) -> None:
    due, later = push(personas, 2)
    for todo in (due, later):
        services.claim(actor=personas.as_agent(), todo_id=todo.id)
        services.fail(actor=personas.as_agent(), todo_id=todo.id)
    make_retry_due(due)
    assert services.requeue_due_retries() == 1
    due.refresh_from_db()
    later.refresh_from_db()
    assert due.state == TodoState.PENDING and due.attempt == 1 and due.next_retry_at is None
    assert later.state == TodoState.FAILED


def test_two_sweeps_at_once_never_process_a_row_twice(tx_personas: Personas) -> None:
    p = tx_personas
    todos = push(p, 300)
    claim_and_lapse(p, todos)
    counts = run_threads(4, lambda i: services.reap_expired())
    assert sum(counts) == len(todos)
    assert Todo.objects.filter(state=TodoState.PENDING).count() == len(todos)
    assert Attempt.objects.filter(outcome=AttemptOutcome.EXPIRED).count() == len(todos)


def test_the_operator_board_claim_is_scoped_to_owned_endpoints(personas: Personas) -> None:
    (mine,) = push(personas, 1)
    (theirs,) = push(personas, 1, endpoint=personas.foreign)
    board = personas.as_human(via="board")
    claimed = services.claim(actor=board, todo_id=mine.id)
    assert claimed.todo.owner == "operator:olive"
    assert attempts_of(mine)[-1].via == "board"
    with pytest.raises(NotFound):
        services.claim(actor=board, todo_id=theirs.id)
    # The operator may end the claim it holds without a lease token.
    done = services.complete(actor=board, todo_id=mine.id)
    assert done.state == TodoState.DONE
    assert Attempt.objects.get(todo=mine).via == "board"
    with pytest.raises(Forbidden):
        services.claim(actor=personas.as_human(personas.auditor), todo_id=theirs.id)


def test_an_agent_cannot_end_or_extend_a_persons_claim(personas: Personas) -> None:
    """Round 8 (gen11): an agent's ``complete`` with the todo id alone ended the claim an
    operator had taken through the board (200, and no ledger row said who ended it). A person's
    claim is fenced with a token no agent holds; the person ends it with none."""
    (todo,) = push(personas, 1)
    board = personas.as_human(via="board")
    claimed = services.claim(actor=board, todo_id=todo.id)
    assert claimed.lease_token is not None  # fenced, though the board asked for no fence
    agent = personas.as_agent()
    for verb in (services.complete, services.fail, services.release, services.heartbeat):
        for attempt in (None, claimed.attempt):
            with pytest.raises(Conflict) as refused:
                verb(actor=agent, todo_id=todo.id, attempt=attempt)
            body = refused.value.as_dict()
            assert (body["reason"], body["owner"]) == ("held_by_person", "operator:olive")
            assert "theirs to end" in body["error"]
    with pytest.raises(Conflict) as refused:  # nor take it while it lives, and says whose
        services.claim(actor=agent, todo_id=todo.id)
    assert (refused.value.as_dict()["reason"], refused.value.as_dict()["owner"]) == (
        "held",
        "operator:olive",
    )
    todo.refresh_from_db()
    assert (todo.state, todo.attempt, todo.owner) == (TodoState.CLAIMED, 1, "operator:olive")
    assert todo.lease_expires_at == claimed.todo.lease_expires_at  # no heartbeat landed
    # Whatever token or attempt the agent names (persons11: these said fence_mismatch, which
    # tells a holder to keep working).
    for named in ({"lease_token": "sbl_not-this-claims"}, {"attempt": claimed.attempt + 1}):
        with pytest.raises(Conflict) as refused:
            services.complete(actor=agent, todo_id=todo.id, **named)
        assert refused.value.as_dict()["reason"] == "held_by_person"
    with pytest.raises(Conflict) as refused:  # a person's stale attempt: still as it was
        services.complete(actor=board, todo_id=todo.id, attempt=claimed.attempt + 1)
    assert refused.value.as_dict()["reason"] == "fence_mismatch"
    assert services.complete(actor=board, todo_id=todo.id).state == TodoState.DONE


def test_revoking_an_endpoint_dead_letters_its_live_todos(personas: Personas) -> None:
    a, b, c = push(personas, 3)
    services.claim(actor=personas.as_agent(), todo_id=b.id)
    services.claim(actor=personas.as_agent(), todo_id=c.id)
    services.complete(actor=personas.as_agent(), todo_id=c.id)
    assert services.endpoint_revoke(actor=FIXTURE, endpoint=personas.agent) == 2
    for todo in (a, b):
        todo.refresh_from_db()
        assert todo.dead_letter and todo.result == {"error": "endpoint_revoked"}
    c.refresh_from_db()
    assert c.state == TodoState.DONE
    assert Attempt.objects.get(todo=b).outcome == AttemptOutcome.REVOKED


def test_an_operator_cannot_put_work_where_the_endpoint_cannot_claim_it(
    personas: Personas,
) -> None:
    with pytest.raises(InvalidArgument) as err:
        services.todo_create(
            actor=personas.as_human(), endpoint=personas.agent, queue="elsewhere", title="x"
        )
    assert err.value.field == "queue"
    assert Todo.objects.count() == 0


def test_racing_claims_of_one_lapsed_todo_make_exactly_one_takeover(tx_personas: Personas) -> None:
    p = tx_personas
    (todo,) = push(p, 1)
    claim_and_lapse(p, [todo])

    def take(i: int) -> Any:
        try:
            return services.claim(actor=p.as_agent(), todo_id=todo.id, claimant=f"rescuer-{i}")
        except Conflict:
            return None

    winners = [r for r in run_threads(8, take) if r is not None]
    assert len(winners) == 1 and winners[0].attempt == 2
    outcomes = sorted(str(a.outcome) for a in attempts_of(todo))
    assert outcomes == ["None", AttemptOutcome.SUPERSEDED]


def test_takeovers_racing_the_reaper_never_leave_two_open_attempts(
    tx_personas: Personas,
) -> None:
    p = tx_personas
    todos = push(p, 120)
    claim_and_lapse(p, todos)

    def work(i: int) -> int:
        if i < 2:
            return services.reap_expired()
        n = 0
        while isinstance(services.claim_next(actor=p.as_agent(), claimant=f"w{i}"), Claimed):
            n += 1
        return n

    results = run_threads(6, work)
    reaped, taken = sum(results[:2]), sum(results[2:])
    # Every lapsed claim ended exactly once: reaped (expired) or taken over (superseded), never
    # both; a todo left claimed has exactly one open attempt; a reaped one waits as pending.
    first = Attempt.objects.filter(claimant="silent")
    assert first.filter(outcome=AttemptOutcome.EXPIRED).count() == reaped
    assert first.filter(outcome=AttemptOutcome.SUPERSEDED).count() + reaped == len(todos)
    claimed = Todo.objects.filter(state=TodoState.CLAIMED)
    pending = Todo.objects.filter(state=TodoState.PENDING)
    assert claimed.count() + pending.count() == len(todos)
    assert claimed.count() == taken
    assert attempt_count() - Attempt.objects.count() == taken
    assert not Attempt.objects.exclude(claimant="silent").exists()
    assert set(pending.values_list("attempt", flat=True)) <= {1}


def test_the_database_refuses_an_attempt_row_that_has_not_ended(personas: Personas) -> None:
    """The claim in progress is the todo's columns; an Attempt row is an ended claim's."""
    (todo,) = push(personas, 1)
    services.claim(actor=personas.as_agent(), todo_id=todo.id, claimant="first")
    with pytest.raises(IntegrityError, match="ended_at"), transaction.atomic():
        Attempt.objects.create(
            todo=todo,
            number=2,
            endpoint=personas.agent,
            claimant="second",
            via="api",
            claimed_at=timezone.now(),
            lease_expires_at=timezone.now(),
            outcome=AttemptOutcome.COMPLETED,
        )
    assert attempt_count(pk=todo.pk) == 1


@pytest.mark.parametrize("waits", ["full", "lean"])
def test_a_takeover_whose_snapshot_predates_the_claim_it_replaces_still_ends_that_attempt(
    tx_personas: Personas, monkeypatch: pytest.MonkeyPatch, waits: str
) -> None:
    """claim_next's statement takes its snapshot before it locks its candidate. Here that gap is
    held open on purpose (the statement waits on an advisory lock before its candidate scan)
    while another connection claims the todo and lets its lease lapse. The waiting statement then
    takes the todo over: the attempt it replaces ends, and one attempt stays open. ``lean``: the
    lean statement (claim_next's first for a limited endpoint) is the one that waits; it finds
    the candidate a takeover once locked and leaves it to the full statement, which takes it."""
    p = tx_personas
    (todo,) = push(p, 1)
    # The end of the candidate scan's conditions (the first ORDER BY of every variant).
    scan = "\nORDER BY "
    name = "_claim_next_sql" if waits == "full" else "_lean_claim_sql"
    original = getattr(sql, name)

    def waits_first(gate_list: Any, *args: Any) -> str:
        statement = original(gate_list, *args)
        assert scan in statement
        return statement.replace(
            scan,
            f"\nAND (SELECT count(*) FROM (SELECT pg_advisory_xact_lock(4242)) w) = 1{scan}",
            1,
        )

    monkeypatch.setattr(sql, name, waits_first)
    if waits == "full":
        # Only the full statement, so the statement that waits is the one that takes over.
        monkeypatch.setattr(sql, "claim_next_lean", lambda *args, **kwargs: None)
    # The takeover is the full statement's (the bare and lean ones leave a lapsed claim to it):
    # no bare statement first.
    sql.mark_limited(p.agent.id)
    holder = psycopg.connect(database_url(), autocommit=False)
    holder.execute("SELECT pg_advisory_xact_lock(4242)")
    late: list[Any] = []

    def take_over() -> None:
        try:
            late.append(services.claim_next(actor=p.as_agent(), claimant="late"))
        except Exception as exc:  # asserted below, in the test's thread
            late.append(exc)
        finally:
            connections.close_all()

    taker = threading.Thread(target=take_over)
    taker.start()
    try:
        # The statement has its snapshot and waits on the advisory lock.
        for _ in range(600):
            waiting = holder.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            ).fetchone()
            if waiting and waiting[0]:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the claim statement never waited on the advisory lock")
        claim_and_lapse(p, [todo])  # committed while the statement waits
    finally:
        holder.commit()
        holder.close()
        taker.join(timeout=60)
    (claimed,) = late
    assert isinstance(claimed, Claimed), claimed
    assert claimed.todo.id == todo.id and claimed.attempt == 2
    attempts = attempts_of(todo)
    assert [(a.number, a.outcome) for a in attempts] == [
        (1, AttemptOutcome.SUPERSEDED),
        (2, None),
    ]


def test_a_bare_claim_and_its_completion_are_two_statements_without_gate_fragments(
    personas: Personas,
) -> None:
    """The core bench's cycle (issue 12): a todo no gate claims costs the claim statement and the
    completion statement, and the claim's plan carries no gate's skip or verdict."""
    push(personas, 3)
    actor = personas.as_agent()
    seen: list[str] = []

    def count(execute: Any, statement: str, *args: Any) -> Any:
        seen.append(statement)
        return execute(statement, *args)

    def cycle() -> None:
        claimed = services.claim_next(actor=actor)
        assert isinstance(claimed, Claimed)
        services.complete(actor=actor, todo_id=claimed.todo.id)

    cycle()  # warm: the claim's ledger actor reads the endpoint owner's name once a minute
    with connections["default"].execute_wrapper(count):
        cycle()
    claim, completion = seen
    assert "FOR UPDATE OF t SKIP LOCKED" in claim and "INSERT INTO queues_attempt" in completion
    for fragment in (
        "limits_pool",
        "limits_taglimit",
        "limits_ratelimit",
        "admission_check",
        "admission_admit",
    ):
        assert fragment not in claim
    # Short enough for psycopg to cache its conversion (it re-parses longer statements).
    assert len(claim) <= 4096


def test_a_completion_that_waited_on_a_takeover_of_its_todo_ends_nothing(
    tx_personas: Personas,
) -> None:
    """The ending statement decides whether the caller holds the claim in the todo's UPDATE
    itself (no SELECT ... FOR UPDATE first). Here it meets the todo while another transaction
    holds it, mid-takeover (attempt 1 ended, attempt 2 open); once that commits, the completion
    of attempt 1 must see the new row and end nothing: superseded, and attempt 2 stays open."""
    p = tx_personas
    (todo,) = push(p, 1)
    services.claim(actor=p.as_agent(), todo_id=todo.id, claimant="first")
    taker = psycopg.connect(database_url(), autocommit=False)
    taker.execute(
        "INSERT INTO queues_attempt (todo_id, number, endpoint_id, claimant, via, claimed_at,"
        " lease_expires_at, ended_at, outcome, disposition, summary)"
        " VALUES (%s, 1, %s, 'first', 'api', now(), now(), now(), 'superseded', 'requeued', '')",
        [todo.id, p.agent.id],
    )
    taker.execute(
        "UPDATE queues_todo SET attempt = 2, owner = 'second',"
        " lease_expires_at = now() + interval '5 minutes' WHERE id = %s",
        [todo.id],
    )
    outcome: list[Any] = []

    def complete_first() -> None:
        try:
            outcome.append(services.complete(actor=p.as_agent(), todo_id=todo.id, attempt=1))
        except Exception as exc:  # asserted below, in the test's thread
            outcome.append(exc)
        finally:
            connections.close_all()

    holder = threading.Thread(target=complete_first)
    holder.start()
    # Each look outside any transaction (lock_waiters): inside the taker's transaction
    # PostgreSQL keeps the first look's pg_stat_activity until it ends, so a completion that
    # began waiting after that look was never seen (a flake under load).
    try:
        for _ in range(600):
            if lock_waiters("%UPDATE queues_todo t SET state = 'done'%"):
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the completion never waited on the todo")
    finally:
        taker.commit()
        taker.close()
        holder.join(timeout=60)
    (error,) = outcome
    assert isinstance(error, Conflict) and error.details.get("reason") == "superseded", error
    todo.refresh_from_db()
    assert (todo.state, todo.attempt, todo.owner) == (TodoState.CLAIMED, 2, "second")
    attempts = attempts_of(todo)
    assert [(a.number, a.outcome) for a in attempts] == [
        (1, AttemptOutcome.SUPERSEDED),
        (2, None),
    ]


def test_an_agents_ledger_actor_is_kept_on_its_endpoint_while_what_it_names_holds(
    personas: Personas,
) -> None:
    """The actor a claim's or an ending's ledger row names (``access.claim_ledger_actor``) is
    made once per endpoint object and handed out again, so the grant parameters' cache finds
    the very same one; a changed slug or owner name makes a new one naming it."""
    from queues import access
    from switchboard.ledger import chain

    endpoint, owner = personas.agent, personas.owner
    first = access.claim_ledger_actor(personas.as_agent())
    assert first == chain.Actor(
        human_id=owner.pk,
        human_name=owner.get_username(),
        endpoint_id=endpoint.id,
        endpoint_slug=endpoint.slug,
    )
    assert access.claim_ledger_actor(personas.as_agent(endpoint, via="mcp")) is first
    endpoint.slug = "renamed-in-place"
    second = access.claim_ledger_actor(personas.as_agent())
    assert second.endpoint_slug == "renamed-in-place" and second.human_name == first.human_name
    owner.username = "renamed-owner"
    owner.save(update_fields=["username"])
    access._owner_names.clear()  # as once the owner's name is older than _OWNER_NAME_SECONDS
    assert access.claim_ledger_actor(personas.as_agent()).human_name == "renamed-owner"


def test_a_claim_by_id_refused_says_why_and_until_when(personas: Personas) -> None:
    """It said only "todo is failed and cannot be claimed", whether a retry was due in a minute
    or never, and "todo is claimed and cannot be claimed" for a claim at its last attempt."""
    agent = personas.as_agent()
    waiting, dead, held, last = push(personas, 4, max_attempts=2)
    for todo in (waiting, dead):
        services.claim(actor=agent, todo_id=todo.id)
        services.fail(actor=agent, todo_id=todo.id, error="boom")
    make_retry_due(dead)
    services.claim(actor=agent, todo_id=dead.id)
    services.fail(actor=agent, todo_id=dead.id, error="boom again")
    services.claim(actor=agent, todo_id=held.id)
    services.claim(actor=agent, todo_id=last.id)
    lapse(last)
    services.claim(actor=agent, todo_id=last.id)  # the takeover: attempt 2 of 2
    lapse(last)

    def refused(todo: Todo) -> dict[str, Any]:
        with pytest.raises(Conflict) as caught:
            services.claim(actor=agent, todo_id=todo.id)
        return caught.value.as_dict()

    due = Todo.objects.get(pk=waiting.pk).next_retry_at
    assert due is not None
    body = refused(waiting)
    assert body["reason"] == "retry_not_due" and body["next_retry_at"] == iso(due)
    assert body["error"].endswith(iso(due))
    assert refused(dead)["reason"] == "dead_letter"
    body = refused(held)
    assert body["reason"] == "held" and "attempt 1" in body["error"]
    body = refused(last)
    assert body["reason"] == "last_attempt" and "2 of 2" in body["error"]
    assert "its lease lapsed at" in body["error"]  # not "until" a time gone by
    assert body["lease_expires_at"] == iso(Todo.objects.get(pk=last.pk).lease_expires_at)


def test_an_agent_cannot_name_itself_as_a_person(personas: Personas) -> None:
    # Round 8: an agent's claimant "operator:operator" read as a person's claim on every page.
    (todo,) = push(personas, 1)
    agent = personas.as_agent()
    disguised = ["\u200boperator:o", "\u2060operator:o", "\ufeffoperator:o", "operator\u00ad:o"]
    # persons11: what draws nothing beside format characters, look-alike letters and colons.
    drawn_alike = [
        "\u034foperator:o",  # the combining grapheme joiner
        "operator\ufe0f:o",  # a variation selector
        "\u3164operator:o",  # a Hangul filler
        "\u115foperator:o",
        "\u2800operator:o",  # the braille blank
        "\u043eperator:o",  # Cyrillic o
        "\u03bfperator:o",  # Greek omicron
        "operator\u2236o",  # the ratio sign
        "operator\ua789o",  # the modifier letter colon
        "operator :o",
        "oper\nator:o",
        # regress11's, past the first version of this check.
        *(f"operator{c}o" for c in "\ua4fd\u0903\u1804\u205a\u0704\ufe30"),
        "\u1d0fperator:o",
        "\u2c9fperator:o",
        "ope\u0433ator:o",
        "oper\u0251tor:o",
    ]
    for claimant in (
        "operator:operator",
        "OPERATOR:olive",
        " operator:x",
        "ｏｐｅｒａｔｏｒ:x",
        *disguised,
        *drawn_alike,
    ):
        with pytest.raises(InvalidArgument) as refused:
            services.claim_next(actor=agent, claimant=claimant)
        assert refused.value.field == "claimant"
        with pytest.raises(InvalidArgument):
            services.claim(actor=agent, todo_id=todo.id, claimant=claimant)
    todo.refresh_from_db()
    assert (todo.state, todo.attempt) == (TodoState.PENDING, 0)
    for fine in ("operations-bot", "José\u0301", "ops: operator", "\u043eps"):
        assert claiming._reads_as_a_person(fine) is False, fine
    claimed = services.claim_next(actor=agent, claimant="operations-bot")
    assert isinstance(claimed, Claimed) and claimed.todo.owner == "operations-bot"
    services.release(actor=agent, todo_id=todo.id)
    services.claim(actor=personas.as_human(), todo_id=todo.id)
    todo.refresh_from_db()
    assert todo.owner == f"operator:{personas.owner.get_username()}"
