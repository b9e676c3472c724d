"""The todo's and attempt's CHECK rules in their cheaper forms (queues migrations 0012 and 0013,
issue 12): the same rows refused, under the same constraint names, whether a rule is a compact
CHECK or the trigger that checks the fields no transition changes; and the shape that keeps a
claim cycle from paying for them (no BEFORE UPDATE trigger, no CHECK on those fields)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from queues import services, sql
from queues.models import Attempt, Todo
from tests.conftest import Personas, push

# The rules a trigger checks (migration 0013): a write that sets none of these fields skips it.
TRIGGER_RULES = {
    "todo_pool_format",
    "todo_rate_limit_format",
    "todo_tags_at_most_8",
    "todo_tags_format",
    "todo_queue_format",
    "todo_title_nonempty",
    "todo_max_attempts_range",
}

# Per rule, values for one column that it refuses (each alone on an otherwise valid todo).
REFUSED: list[tuple[str, str, str]] = [
    ("todo_pool_format", "pool", "'Upper'"),
    ("todo_pool_format", "pool", "''"),
    ("todo_rate_limit_format", "rate_limit", "'has space'"),
    ("todo_tags_at_most_8", "tags", "'{a,b,c,d,e,f,g,h,i}'"),
    ("todo_tags_format", "tags", "'{ok,\"\"}'"),
    ("todo_tags_format", "tags", "'{\"\"}'"),
    ("todo_tags_format", "tags", "'{Bad}'"),
    ("todo_queue_format", "queue", "'bad name'"),
    ("todo_title_nonempty", "title", "''"),
    ("todo_max_attempts_range", "max_attempts", "101"),
    ("todo_max_attempts_range", "max_attempts", "0"),
    ("todo_state_valid", "state", "'nonsense'"),
]

# Values each rule lets through (a NULL passes a CHECK).
ACCEPTED: list[tuple[str, str]] = [
    ("pool", "NULL"),
    ("pool", "'gpu-a.1_x'"),
    ("rate_limit", "NULL"),
    ("tags", "'{}'"),
    ("tags", "'{a,b,c,d,e,f,g,h}'"),
    ("tags", "'{a,NULL}'"),  # as NOT '' = ANY(tags) did: NULL, which a CHECK passes
    ("queue", "'Inbox:2.x-y'"),
    ("max_attempts", "100"),
    ("state", "'discarded'"),
]

# A valid todo row as SQL values; ``endpoint_id`` is bound.
ROW = {
    "id": "gen_random_uuid()",
    "endpoint_id": "%s",
    "queue": "'inbox'",
    "title": "'checked'",
    "kind": "''",
    "payload": "'{}'",
    "state": "'pending'",
    "owner": "''",
    "attempt": "0",
    "max_attempts": "5",
    "source": "'api'",
    "created_at": "now()",
    "updated_at": "now()",
}


def _insert(column: str, value: str) -> str:
    row = {**ROW, column: value}
    return f"INSERT INTO queues_todo ({', '.join(row)}) VALUES ({', '.join(row.values())})"


def _refused_by(statement: str, params: list[Any]) -> str:
    with pytest.raises(IntegrityError) as err, transaction.atomic(), connection.cursor() as cur:
        cur.execute(statement, params)
    cause: Any = err.value.__cause__
    assert cause.sqlstate == "23514", cause  # check_violation, as a CHECK reports it
    name: str = cause.diag.constraint_name
    assert f'violates check constraint "{name}"' in str(cause)
    return name


@pytest.mark.parametrize(("rule", "column", "value"), REFUSED)
def test_each_rule_refuses_an_insert_and_an_update_under_its_name(
    personas: Personas, rule: str, column: str, value: str
) -> None:
    (todo,) = push(personas, 1)
    assert _refused_by(_insert(column, value), [personas.agent.id]) == rule
    update = f"UPDATE queues_todo SET {column} = {value} WHERE id = %s"
    assert _refused_by(update, [todo.id]) == rule
    assert Todo.objects.count() == 1


@pytest.mark.parametrize(("column", "value"), ACCEPTED)
def test_each_rule_accepts_what_it_accepted(personas: Personas, column: str, value: str) -> None:
    (todo,) = push(personas, 1)
    with connection.cursor() as cur:
        cur.execute(_insert(column, value), [personas.agent.id])
        cur.execute(f"UPDATE queues_todo SET {column} = {value} WHERE id = %s", [todo.id])
    assert Todo.objects.count() == 2


def test_the_attempt_rules_refuse_under_their_names(personas: Personas) -> None:
    (todo,) = push(personas, 1)
    services.claim(actor=personas.as_agent(), todo_id=todo.id)
    attempt = Attempt.objects.get(todo=todo)
    cases = [
        ("attempt_outcome_valid", "ended_at = now(), outcome = 'nonsense'"),
        ("attempt_ended_has_outcome", "ended_at = now()"),
        ("attempt_ended_has_outcome", "outcome = 'completed'"),
    ]
    for rule, change in cases:
        statement = f"UPDATE queues_attempt SET {change} WHERE id = %s"
        assert _refused_by(statement, [attempt.id]) == rule
    with connection.cursor() as cur:  # both set: accepted
        cur.execute(
            "UPDATE queues_attempt SET ended_at = now(), outcome = 'expired' WHERE id = %s",
            [attempt.id],
        )


def test_no_claim_cycle_write_pays_for_the_fields_it_never_sets(db: None) -> None:
    """A CHECK runs (parsed from its stored text, planned, evaluated) on every update of the
    row; a BEFORE UPDATE row trigger locks the row again in every update, whatever fields it
    names. The claim and its ending set none of the trigger's fields, so they pay for neither."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT conname FROM pg_constraint"
            " WHERE conrelid = 'queues_todo'::regclass AND contype = 'c'"
        )
        checks = {name for (name,) in cur.fetchall()}
        cur.execute(
            "SELECT tgname, tgtype, pg_get_triggerdef(oid) FROM pg_trigger"
            " WHERE tgrelid = 'queues_todo'::regclass AND NOT tgisinternal"
        )
        triggers = cur.fetchall()
    assert checks.isdisjoint(TRIGGER_RULES), checks & TRIGGER_RULES
    assert "todo_state_valid" in checks and "todo_claimed_has_lease" in checks
    # tgtype bits: 1 row, 2 before, 16 update.
    assert [name for name, kind, _ in triggers if kind & 1 and kind & 2 and kind & 16] == []
    (update,) = [d for name, _, d in triggers if name == "todo_fields_check_update"]
    assert "AFTER UPDATE OF queue, title, pool, tags, rate_limit, max_attempts" in update
    for statement in (sql.claim_next_sql(bare=True), sql.complete_sql()):
        assigned = statement.split("SET", 1)[1]
        for column in ("queue =", "title =", "pool =", "tags =", "rate_limit =", "max_attempts ="):
            assert f" {column}" not in assigned.split("RETURNING")[0], (column, statement[:60])


def test_the_ending_plans_no_reopen_subquery_for_a_todo_naming_no_limit(
    personas: Personas,
) -> None:
    """Each subquery of a statement gets its executor state built when the statement starts,
    run or not: the pool's and tags' reopen rings are function calls (limits migration 0006)."""
    (todo,) = push(personas, 1)
    services.claim(actor=personas.as_agent(), todo_id=todo.id)
    params = sql.transition_params(
        {"result": None, "summary": ""},
        todo_id=todo.id,
        endpoint_ids=[personas.agent.id],
        operator=False,
        fence=None,
        attempt=None,
        ends=True,
    )
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("EXPLAIN (VERBOSE) " + sql.complete_sql(), params)
        plan = "\n".join(row[0] for row in cur.fetchall())
    assert "limits_pool_reopens" in plan and "limits_tags_reopens" in plan
    assert "limits_pool_shared" not in plan and "limits_tags_shared" not in plan
    assert "todo_pending_pool_idx" not in plan and "todo_pending_tags_idx" not in plan


def test_model_validation_still_runs_the_compact_rules(personas: Personas) -> None:
    """The compact CHECKs are expressions over the fields (queues.models.CheckSQL), not raw
    SQL, so Django's validate_constraints evaluates them with the instance's values."""
    from django.core.exceptions import ValidationError

    (todo,) = push(personas, 1)
    todo.validate_constraints()
    for field, value, rule in [
        ("state", "nonsense", "todo_state_valid"),
        ("tags", ["ok", ""], "todo_tags_format"),
        ("tags", [f"t{i}" for i in range(9)], "todo_tags_at_most_8"),
    ]:
        original = getattr(todo, field)
        setattr(todo, field, value)
        with pytest.raises(ValidationError, match=rule):
            todo.validate_constraints()
        setattr(todo, field, original)
    attempt = Attempt(todo=todo, number=1, endpoint=personas.agent, ended_at=None)
    attempt.outcome = "nonsense"
    with pytest.raises(ValidationError, match="attempt_outcome_valid"):
        attempt.validate_constraints(exclude={"todo"})
