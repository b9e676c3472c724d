"""A completion runs the plain ending first (issue 12, the core cycle: no end row's CTE for a
claim that holds no grant). A claim that holds a grant is left to the full statement, which
ends the grant with its ``limits.end`` row; a claim that holds none ends the same either way."""

from __future__ import annotations

from queues import services, sql
from queues.models import Attempt, AttemptOutcome, Todo, TodoState
from tests.conftest import Personas, push, statements
from tests.limits.conftest import pool, push_named
from tests.limits.test_grants import assert_the_chain_verifies, ends


def test_a_claim_holding_a_grant_is_ended_by_the_full_statement_with_its_end_row(
    personas: Personas,
) -> None:
    pool("gpu", slots=5)
    (todo,) = push_named(personas, 1, pool="gpu")
    claimed = services.claim(actor=personas.as_agent(), todo_id=todo.id)
    assert claimed.grant
    with statements() as ran:
        done = services.complete(actor=personas.as_agent(), todo_id=todo.id, result={"ok": 1})
    assert done.state == TodoState.DONE
    assert ran.index(sql.complete_plain_sql()) < ran.index(sql.complete_sql())
    (end,) = ends()
    assert end.after == {
        "todo": str(todo.id),
        "attempt": 1,
        "grant": claimed.grant,
        "ended": "completed",
    }
    assert Todo.objects.get(pk=todo.id).grant_hash is None
    attempt = Attempt.objects.get(todo_id=todo.id)
    assert attempt.outcome == AttemptOutcome.COMPLETED and attempt.ended_at is not None
    assert_the_chain_verifies()


def test_a_claim_holding_no_grant_is_ended_by_the_plain_statement_alone(
    personas: Personas,
) -> None:
    (todo,) = push(personas, 1)
    services.claim(actor=personas.as_agent(), todo_id=todo.id)
    with statements() as ran:
        done = services.complete(actor=personas.as_agent(), todo_id=todo.id, result={"ok": 1})
    assert done.state == TodoState.DONE and done.result == {"ok": 1}
    assert ran.count(sql.complete_plain_sql()) == 1 and sql.complete_sql() not in ran
    assert ends() == []
    attempt = Attempt.objects.get(todo_id=todo.id)
    assert attempt.outcome == AttemptOutcome.COMPLETED and attempt.ended_at is not None
