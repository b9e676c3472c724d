"""claim_next's bare statement (issue 12, the core cycle): a leaner statement for a plain todo,
which claims exactly what the full statement claims and leaves every other candidate to it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from admission import services as admission_services
from admission.limits.models import Pool
from queues import services, sql
from queues.models import Attempt, AttemptOutcome, Todo, TodoState
from queues.services import Claimed
from tests.conftest import Personas, attempts_of, lapse, push

# Set by the statement's clock: differ between two claims of one row.
_CLOCKED = {"claimed_at", "lease_expires_at", "updated_at"}


def _statement(p: Personas, *, bare: bool) -> sql.Candidate | sql.NoCandidate:
    with sql.hot_cursor() as cursor:
        return sql.claim_next_candidate(
            cursor,
            endpoint_id=p.agent.id,
            queues=["inbox", "outbox"],
            excluded=[],
            passed=[],
            claimant="w0",
            via="api",
            ttl=120,
            fence_hash="f" * 64,
            bare=bare,
            fast=not bare,
            ledger=None if bare else sql.grant_params(None, "w0"),
        )


def _claimed_rows(todo_id: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The todo's row and its attempts' rows as stored, without the clock's columns."""
    row: dict[str, Any] = dict(Todo.objects.filter(pk=todo_id).values().get())
    attempts: list[dict[str, Any]] = [
        dict(a) for a in Attempt.objects.filter(todo_id=todo_id).order_by("number").values()
    ]
    for name in _CLOCKED:
        row.pop(name)
    for attempt in attempts:
        for name in (*_CLOCKED, "id"):
            attempt.pop(name, None)
    return row, attempts


def test_the_bare_statement_claims_the_row_the_full_statement_claims(personas: Personas) -> None:
    push(personas, 2, queue="outbox")
    push(personas, 1, queue="inbox")
    with transaction.atomic():
        sid = transaction.savepoint()
        bare = _statement(personas, bare=True)
        assert isinstance(bare, sql.Candidate) and bare.todo is not None
        bare_rows = _claimed_rows(bare.todo_id)
        transaction.savepoint_rollback(sid)
        full = _statement(personas, bare=False)
        assert isinstance(full, sql.Candidate) and full.todo is not None
        full_rows = _claimed_rows(full.todo_id)
    assert bare.todo_id == full.todo_id and bare.queue == full.queue == "outbox"
    assert bare_rows == full_rows
    assert bare_rows[0]["state"] == TodoState.CLAIMED and bare_rows[0]["attempt"] == 1
    # The claim in progress is the todo's columns; its attempt row comes when it ends.
    assert bare_rows[1] == []
    assert (bare_rows[0]["owner"], bare_rows[0]["lease_token_hash"]) == ("w0", "f" * 64)
    assert bare_rows[0]["claim_via"] == "api"
    # What the statement answers is the row as stored, every field.
    stored = Todo.objects.get(pk=full.todo_id)
    for field in Todo._meta.concrete_fields:
        assert getattr(full.todo, field.attname) == getattr(stored, field.attname), field.name
    claimed_at, lease_expires_at = full.todo.claimed_at, full.todo.lease_expires_at
    assert claimed_at is not None and lease_expires_at is not None
    assert (lease_expires_at - claimed_at).total_seconds() == pytest.approx(120, abs=1)


def _answered_as_stored(todo: Todo) -> None:
    """Every field the statement answered equals the stored row's, in value and in type."""
    stored = Todo.objects.get(pk=todo.id)
    for name in sql._TODO_ATTNAMES:
        mine, theirs = getattr(todo, name), getattr(stored, name)
        assert (mine, type(mine)) == (theirs, type(theirs)), name


def test_the_bare_statement_answers_each_column_it_fixed_as_stored(personas: Personas) -> None:
    """The bare statement answers only the columns it did not fix before it ran; the Todo it
    builds with the fixed ones is the stored row: a first claim, and a retry's claim (a
    failed todo whose retry is due: its result kept, its next_retry_at cleared)."""
    (todo,) = push(personas, 1, kind="render", payload={"b": [1, 2.5], "a": None}, max_attempts=3)
    first = _statement(personas, bare=True)
    assert isinstance(first, sql.Candidate) and first.todo is not None and not first.held
    assert first.todo.owner == "w0" and first.todo.state == TodoState.CLAIMED
    _answered_as_stored(first.todo)
    services.fail(actor=personas.as_human(personas.owner), todo_id=todo.id, error={"why": "flaky"})
    Todo.objects.filter(pk=todo.id).update(next_retry_at=timezone.now() - timedelta(seconds=5))
    retry = _statement(personas, bare=True)
    assert isinstance(retry, sql.Candidate) and retry.todo is not None
    assert retry.todo.attempt == 2 and retry.todo.result == {"error": {"why": "flaky"}}
    assert retry.todo.next_retry_at is None
    _answered_as_stored(retry.todo)


def test_the_bare_statement_answers_no_candidate_when_nothing_is_claimable(
    personas: Personas,
) -> None:
    assert _statement(personas, bare=True) == sql.NoCandidate(skipped=False)


def _budgeted(p: Personas) -> Any:
    admission_services.policy_set(
        actor=p.as_human(p.owner),
        endpoint=p.agent,
        queue="inbox",
        max_in_flight=5,
        max_claims_per_window=None,
        window=None,
        posture="enforce",
    )
    (todo,) = push(p, 1)
    return todo


def _in_a_pool(p: Personas) -> Any:
    Pool.objects.create(name="gpu", slots=2, posture="enforce")
    (todo,) = push(p, 1, pool="gpu")
    return todo


@pytest.mark.parametrize("gated", [_budgeted, _in_a_pool], ids=["budget", "pool"])
def test_a_todo_some_gate_claims_is_left_to_the_full_statement(
    settings: Any, personas: Personas, gated: Any
) -> None:
    settings.POLICY_WRITE_RATE_LIMIT = (0, 0)
    todo = gated(personas)
    left = _statement(personas, bare=True)
    assert isinstance(left, sql.Candidate) and left.todo_id == todo.id
    assert left.todo is None and left.held
    assert Todo.objects.get(pk=todo.id).state == TodoState.PENDING
    assert not Attempt.objects.filter(todo_id=todo.id).exists()
    # claim_next then claims it through the full statement, its gate deciding.
    result = services.claim_next(actor=personas.as_agent())
    assert isinstance(result, Claimed) and result.todo.id == todo.id
    assert sql.recently_limited(personas.agent.id)
    if todo.pool is not None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM queues_todo WHERE pool = 'gpu' AND state = 'claimed'"
            )
            assert cursor.fetchone() == (1,)
            assert result.grant is not None  # the pool's grant row: only the full path writes it


def test_a_takeover_is_left_to_the_full_statement_without_marking_the_endpoint(
    personas: Personas,
) -> None:
    (todo,) = push(personas, 1)
    services.claim_next(actor=personas.as_agent(), claimant="slow")
    lapse(todo)
    left = _statement(personas, bare=True)
    assert isinstance(left, sql.Candidate) and left.todo_id == todo.id
    assert left.todo is None and not left.held
    assert Todo.objects.get(pk=todo.id).owner == "slow"
    result = services.claim_next(actor=personas.as_agent(), claimant="fast")
    assert isinstance(result, Claimed) and result.todo.id == todo.id and result.attempt == 2
    attempts = attempts_of(todo)
    assert [a.outcome for a in attempts] == [AttemptOutcome.SUPERSEDED, None]
    # A takeover is no gated work: the endpoint's next claims still try the bare statement.
    assert not sql.recently_limited(personas.agent.id)
