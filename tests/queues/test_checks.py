"""The todo's and attempt's CHECK rules in their cheaper forms (queues migrations 0012, 0013 and
0016, issue 12): the same rows refused, under the same constraint names, now that every rule is
checked by a trigger (the fields no transition changes by todo_fields_check, the transition
rules by todo_state_check, the attempt's by attempt_rules); and the shape that keeps a claim
cycle from paying for them (no CHECK rebuilt per statement, no BEFORE UPDATE trigger, no
trigger on the fields a cycle never sets)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from queues import services, sql
from queues.models import Attempt, Todo
from tests.conftest import Personas, push

# The rules todo_fields_check checks (migration 0013): a write that sets none of these fields
# skips it.
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
    ("todo_retried_after_an_attempt", "retried_after", "1"),  # after an attempt not made
    ("todo_retried_after_an_attempt", "retried_after", "-1"),
    ("todo_state_valid", "state", "'nonsense'"),
    # todo_state_check (migration 0016), on a pending todo with max_attempts 5.
    ("todo_attempt_within_max", "attempt", "6"),
    ("queues_todo_attempt_check", "attempt", "-1"),
    ("queues_todo_rings_check", "rings", "-1"),
    ("todo_claimed_has_lease", "state", "'claimed'"),
    ("todo_retry_only_when_failed", "next_retry_at", "now()"),
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
    ("retried_after", "0"),
    ("state", "'discarded'"),
    ("attempt", "5"),
    ("rings", "3"),
    ("next_retry_at", "NULL"),
    ("lease_expires_at", "now()"),
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


def test_after_a_retry_the_round_not_max_attempts_is_1_to_100(personas: Personas) -> None:
    """An operator's retry raises max_attempts by the todo's round (migration 0024): 3 attempts
    made and retried, a round of 100 is max_attempts 103."""
    retried = {**ROW, "attempt": "3", "retried_after": "3"}

    def insert(max_attempts: str) -> str:
        row = {**retried, "max_attempts": max_attempts}
        return f"INSERT INTO queues_todo ({', '.join(row)}) VALUES ({', '.join(row.values())})"

    for refused in ("104", "3"):
        assert _refused_by(insert(refused), [personas.agent.id]) == "todo_max_attempts_range"
    with connection.cursor() as cur:
        cur.execute(insert("103"), [personas.agent.id])
        cur.execute(insert("4"), [personas.agent.id])
    assert Todo.objects.filter(retried_after=3).count() == 2


def test_a_row_breaking_two_rules_names_the_one_it_named_before(personas: Personas) -> None:
    """When the transition rules were CHECKs, an insert ran the field rules' BEFORE trigger
    first and an update ran the CHECKs before the field rules' AFTER trigger."""
    (todo,) = push(personas, 1)
    insert = _insert("state", "'nonsense'").replace("'checked'", "''")
    assert _refused_by(insert, [personas.agent.id]) == "todo_title_nonempty"
    update = "UPDATE queues_todo SET state = 'nonsense', title = '' WHERE id = %s"
    assert _refused_by(update, [todo.id]) == "todo_state_valid"


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
    services.complete(actor=personas.as_agent(), todo_id=todo.id)
    attempt = Attempt.objects.get(todo=todo)
    cases = [
        ("attempt_outcome_valid", "outcome = 'nonsense'"),
        ("attempt_number_positive", "number = 0"),
        ("attempt_summary_length", "summary = repeat('é', 10001)"),
    ]
    for rule, change in cases:
        statement = f"UPDATE queues_attempt SET {change} WHERE id = %s"
        assert _refused_by(statement, [attempt.id]) == rule
    insert = (
        "INSERT INTO queues_attempt (todo_id, number, endpoint_id, claimant, via, claimed_at,"
        " lease_expires_at, summary, ended_at, outcome)"
        " VALUES (%s, {number}, %s, '', 'api', now(), now(), {summary}, {ended_at}, {outcome})"
    )
    valid = {"number": "1", "summary": "''", "ended_at": "now()", "outcome": "'released'"}
    inserts = [
        ("attempt_number_positive", {"number": "0"}),
        ("attempt_outcome_valid", {"outcome": "'nonsense'"}),
        ("attempt_summary_length", {"summary": "repeat('x', 10001)"}),
    ]
    for rule, values in inserts:
        row = {**valid, **values}
        assert _refused_by(insert.format(**row), [todo.id, personas.agent.id]) == rule
    # An attempt row is an ended claim's: neither its end nor its outcome may be missing.
    for column in ("ended_at", "outcome"):
        row = {**valid, column: "NULL"}
        with (
            pytest.raises(IntegrityError, match=f'"{column}"'),
            transaction.atomic(),
            connection.cursor() as cur,
        ):
            cur.execute(insert.format(**row), [todo.id, personas.agent.id])
    with connection.cursor() as cur:  # valid: accepted, a summary of 10,000 characters too
        cur.execute("UPDATE queues_attempt SET outcome = 'expired' WHERE id = %s", [attempt.id])
        cur.execute(
            "UPDATE queues_attempt SET summary = repeat('é', 10000) WHERE id = %s", [attempt.id]
        )
        cur.execute(
            insert.format(**{**valid, "summary": "repeat('x', 10000)"}),
            [todo.id, personas.agent.id],
        )


def test_no_claim_cycle_write_pays_for_a_rule_it_cannot_break(db: None) -> None:
    """A CHECK is parsed from its stored text and planned in every statement that writes a row
    of its table, whatever it sets, and so is a trigger's WHEN clause; a PL/pgSQL function keeps
    its plans for the session. A BEFORE UPDATE row trigger locks the row again in every update,
    whatever fields it names. So: no CHECK on either table, no WHEN, no BEFORE UPDATE row
    trigger; the claim and its ending set none of the fields todo_fields_check_update watches,
    and todo_checks_update watches exactly the columns its rules read."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT conname FROM pg_constraint WHERE contype = 'c'"
            " AND conrelid IN ('queues_todo'::regclass, 'queues_attempt'::regclass)"
        )
        assert cur.fetchall() == []
        cur.execute(
            "SELECT tgname, tgtype, pg_get_triggerdef(oid), tgqual IS NOT NULL FROM pg_trigger"
            " WHERE tgrelid IN ('queues_todo'::regclass, 'queues_attempt'::regclass)"
            " AND NOT tgisinternal"
        )
        triggers = {name: (kind, definition, when) for name, kind, definition, when in cur}
    assert [name for name, (_, _, when) in triggers.items() if when] == []
    # tgtype bits: 1 row, 2 before, 16 update.
    assert [n for n, (kind, _, _) in triggers.items() if kind & 1 and kind & 2 and kind & 16] == []
    fields = triggers["todo_fields_check_update"][1]
    assert (
        "AFTER UPDATE OF queue, title, pool, tags, rate_limit, max_attempts, retried_after"
        in fields
    )
    rules = triggers["todo_checks_update"][1]
    assert (
        "AFTER UPDATE OF state, attempt, max_attempts, lease_expires_at, next_retry_at, rings,"
        " retried_after" in rules
    )
    # Each rules function tests the rules as one boolean before the CASE that names the broken
    # one (queues migration 0019): the CASE's set-up is per call otherwise.
    with connection.cursor() as cur:
        cur.execute(
            "SELECT proname, prosrc FROM pg_proc WHERE proname IN"
            " ('todo_fields_check', 'todo_state_check', 'attempt_rules')"
        )
        functions = dict(cur.fetchall())
    assert sorted(functions) == ["attempt_rules", "todo_fields_check", "todo_state_check"]
    for name, source in functions.items():
        body = source.split("BEGIN", 1)[1].lstrip()
        assert body.startswith("IF NOT (coalesce("), (name, body[:80])
    for statement in (sql.claim_next_sql(bare=True), sql.complete_sql()):
        assigned = statement.split("SET", 1)[1]
        for column in (
            "queue =",
            "title =",
            "pool =",
            "tags =",
            "rate_limit =",
            "max_attempts =",
            "retried_after =",
        ):
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
    assert "todo_live_pool_idx" not in plan and "todo_live_tags_idx" not in plan


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
    attempt = Attempt(todo=todo, number=1, endpoint=personas.agent)
    attempt.outcome = "nonsense"
    with pytest.raises(ValidationError, match="attempt_outcome_valid"):
        attempt.validate_constraints(exclude={"todo"})
    attempt.outcome = "completed"
    attempt.summary = "x" * 10001
    with pytest.raises(ValidationError, match="attempt_summary_length"):
        attempt.validate_constraints(exclude={"todo"})
