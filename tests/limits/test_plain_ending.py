"""A completion runs the plain ending first (issue 12, the core cycle: no end row's CTE for a
claim that holds no grant). A claim that holds a grant is left to the full statement, which
ends the grant with its ``limits.end`` row; a claim that holds none ends the same either way."""

from __future__ import annotations

import pytest

from queues import gates, services, sql
from queues.models import Attempt, AttemptOutcome, Todo, TodoState
from queues.services import Claimed
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


@pytest.mark.parametrize("ending", ["_COMPLETE", "_FAIL", "_RELEASE"])
def test_the_plain_ending_of_every_verb_ends_the_attempt_it_ended(
    personas: Personas, ending: str
) -> None:
    """The plain statement writes the ended claim's attempt row from done's row (the
    disposition of a failure and of a release reads it)."""
    (todo,) = push(personas, 1)
    claimed = services.claim_next(actor=personas.as_agent())
    assert isinstance(claimed, Claimed)
    params = sql.transition_params(
        {"result": None, "summary": "", "error": None, "base": 1, "cap": 60},
        todo_id=todo.id,
        endpoint_ids=[personas.agent.id],
        operator=True,
        fence=None,
        attempt=None,
    )
    with sql.hot_cursor() as cursor:
        cursor.execute(sql._ending_plain_sql(gates.gates(), *getattr(sql, ending)), params)
        row = cursor.fetchone()
    assert row is not None and row[0] == todo.id
    (attempt,) = Attempt.objects.filter(todo_id=todo.id)
    assert attempt.ended_at is not None and attempt.disposition is not None
