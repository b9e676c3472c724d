# The last CHECKs of the todo and the attempt are checked by triggers now, with the same names,
# rules and errors (issue 12: the core claim cycle's backend CPU).
#
# PostgreSQL reads every CHECK of a table back from its stored node text and plans it again in
# each statement that writes a row of it (ExecConstraints: stringToNode, then ExecPrepareExpr),
# and a trigger's WHEN clause the same way. A plain claim cycle writes the todo twice and the
# attempt twice, so the nine CHECKs left after migrations 0012, 0013 and 0015 were rebuilt 18
# times per cycle. A PL/pgSQL function keeps its expressions' plans for the session: it evaluates
# the same rules without rebuilding them.
#
# - The todo's six (todo_state_valid, todo_attempt_within_max, todo_claimed_has_lease,
#   todo_retry_only_when_failed, and Django's queues_todo_attempt_check and
#   queues_todo_rings_check of its PositiveIntegerField and PositiveSmallIntegerField) are checked
#   by todo_state_check(): after every update that sets a column they read (an AFTER trigger:
#   a BEFORE UPDATE row trigger locks the row again, migration 0013), and by todo_fields_check()
#   on every insert, after the seven rules it already held.
# - The attempt's three (attempt_ended_has_outcome, attempt_number_positive,
#   attempt_outcome_valid) are checked by attempt_one_open(), which now runs before every insert
#   and after every update that sets number, ended_at, outcome or todo_id, with no WHEN clause:
#   the function decides whether the one-open rule (migration 0015) applies, as the WHEN did.
#
# As a CHECK: a rule that is NULL passes; when several are broken, the first in name order is
# named (as PostgreSQL orders a table's CHECKs); SQLSTATE 23514 (check_violation: Django's
# IntegrityError) with the rule's name as the error's constraint and PostgreSQL's message for a
# CHECK. Django's state keeps the CheckConstraints and the fields' types (queues.models), so model
# validation still runs them, as migration 0013 kept the seven it moved. A change to one of these
# rules is a change here too. tests/queues/test_checks.py holds the rows each refuses.

from django.db import migrations

CHECK_ERROR = """
    IF l_violated IS NOT NULL THEN
        RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"',
                        TG_TABLE_NAME, l_violated
            USING ERRCODE = 'check_violation', CONSTRAINT = l_violated,
                  TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA;
    END IF;"""

# (name, rule over NEW), in name order.
TODO_RULES = [
    ("queues_todo_attempt_check", "NEW.attempt >= 0"),
    ("queues_todo_rings_check", "NEW.rings >= 0"),
    ("todo_attempt_within_max", "NEW.attempt <= NEW.max_attempts"),
    (
        "todo_claimed_has_lease",
        "NOT NEW.state::text = 'claimed' OR NEW.attempt >= 1 AND NEW.lease_expires_at IS NOT NULL",
    ),
    ("todo_retry_only_when_failed", "NEW.next_retry_at IS NULL OR NEW.state::text = 'failed'"),
    (
        "todo_state_valid",
        "NEW.state::text = ANY ('{pending,claimed,done,failed,discarded}'::text[])",
    ),
]

# migration 0013's seven, in its order (checked first on an insert, as its BEFORE trigger ran
# before the CHECKs).
FIELD_RULES = [
    ("todo_pool_format", "NEW.pool::text ~ '^[a-z0-9][a-z0-9_.-]{0,63}$'"),
    ("todo_rate_limit_format", "NEW.rate_limit::text ~ '^[a-z0-9][a-z0-9_.-]{0,63}$'"),
    ("todo_tags_at_most_8", "array_length(NEW.tags, 1) <= 8"),
    (
        "todo_tags_format",
        "array_to_string(NEW.tags, ',') ~ '^([a-z0-9][a-z0-9_.-]{0,63}(,|$))*$'"
        " AND array_position(NEW.tags, '') IS NULL",
    ),
    ("todo_queue_format", "NEW.queue::text ~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$'"),
    ("todo_title_nonempty", "NOT NEW.title::text = ''"),
    ("todo_max_attempts_range", "NEW.max_attempts >= 1 AND NEW.max_attempts <= 100"),
]

ATTEMPT_RULES = [
    ("attempt_ended_has_outcome", "(NEW.ended_at IS NULL) = (NEW.outcome IS NULL)"),
    ("attempt_number_positive", "NEW.number >= 1"),
    (
        "attempt_outcome_valid",
        "NEW.outcome::text = ANY ('{completed,failed,released,expired,superseded,revoked}'::text[])",
    ),
]


def _violated(rules: list[tuple[str, str]]) -> str:
    arms = "".join(
        f"\n        WHEN NOT coalesce({rule}, true) THEN '{name}'" for name, rule in rules
    )
    return f"    l_violated := CASE{arms}\n    END;"


def _check_function(name: str, rules: list[tuple[str, str]], result: str) -> str:
    return f"""
CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    l_violated text;
BEGIN
{_violated(rules)}{CHECK_ERROR}
    RETURN {result};
END;
$$;
"""


LOCK_CLASS = 16719  # "AO", migration 0015

ONE_OPEN = f"""
    -- The one-open rule (migration 0015) applies to a write that makes an attempt open: an
    -- insert with no ended_at, an update that clears ended_at or moves an open attempt.
    IF NEW.ended_at IS NOT NULL
       OR (TG_OP = 'UPDATE' AND OLD.ended_at IS NULL AND NEW.todo_id = OLD.todo_id) THEN
        RETURN NEW;
    END IF;
    IF current_setting('transaction_isolation') = 'repeatable read' THEN
        RAISE EXCEPTION 'an open attempt is written under READ COMMITTED or SERIALIZABLE only'
            USING ERRCODE = 'invalid_transaction_state', CONSTRAINT = 'attempt_one_open',
                  TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA;
    END IF;
    PERFORM pg_advisory_xact_lock({LOCK_CLASS}, uuid_hash(NEW.todo_id));
    -- attempt_todo_number_idx
    IF EXISTS (SELECT 1 FROM queues_attempt a
               WHERE a.todo_id = NEW.todo_id AND a.ended_at IS NULL AND a.id <> NEW.id) THEN
        RAISE EXCEPTION 'duplicate key value violates unique constraint "attempt_one_open"'
            USING ERRCODE = 'unique_violation', CONSTRAINT = 'attempt_one_open',
                  TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA,
                  DETAIL = format('Todo %s already has an open attempt.', NEW.todo_id);
    END IF;"""

ATTEMPT_FUNCTION = f"""
CREATE OR REPLACE FUNCTION attempt_one_open() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    l_violated text;
BEGIN
{_violated(ATTEMPT_RULES)}{CHECK_ERROR}{ONE_OPEN}
    RETURN NEW;
END;
$$;
"""

FORWARD = (
    _check_function("todo_fields_check", FIELD_RULES + TODO_RULES, "NEW")
    + _check_function("todo_state_check", TODO_RULES, "NULL")
    + ATTEMPT_FUNCTION
    + """
-- Named to fire before todo_fields_check_update (triggers fire in name order), as the CHECKs
-- ran before it.
CREATE TRIGGER todo_checks_update
AFTER UPDATE OF state, attempt, max_attempts, lease_expires_at, next_retry_at, rings ON queues_todo
FOR EACH ROW EXECUTE FUNCTION todo_state_check();

DROP TRIGGER attempt_one_open_insert ON queues_attempt;
DROP TRIGGER attempt_one_open_update ON queues_attempt;
CREATE TRIGGER attempt_one_open_insert BEFORE INSERT ON queues_attempt
FOR EACH ROW EXECUTE FUNCTION attempt_one_open();
CREATE TRIGGER attempt_one_open_update
AFTER UPDATE OF number, ended_at, outcome, todo_id ON queues_attempt
FOR EACH ROW EXECUTE FUNCTION attempt_one_open();

ALTER TABLE queues_todo
    DROP CONSTRAINT queues_todo_attempt_check,
    DROP CONSTRAINT queues_todo_rings_check,
    DROP CONSTRAINT todo_attempt_within_max,
    DROP CONSTRAINT todo_claimed_has_lease,
    DROP CONSTRAINT todo_retry_only_when_failed,
    DROP CONSTRAINT todo_state_valid;
ALTER TABLE queues_attempt
    DROP CONSTRAINT attempt_ended_has_outcome,
    DROP CONSTRAINT attempt_number_positive,
    DROP CONSTRAINT attempt_outcome_valid;
"""
)

# The reverse: the CHECKs, the functions and triggers as migrations 0013 and 0015 left them.
REVERSE = (
    f"""
ALTER TABLE queues_todo
    ADD CONSTRAINT queues_todo_attempt_check CHECK (attempt >= 0),
    ADD CONSTRAINT queues_todo_rings_check CHECK (rings >= 0),
    ADD CONSTRAINT todo_attempt_within_max CHECK (attempt <= max_attempts),
    ADD CONSTRAINT todo_claimed_has_lease
        CHECK (NOT state::text = 'claimed' OR attempt >= 1 AND lease_expires_at IS NOT NULL),
    ADD CONSTRAINT todo_retry_only_when_failed
        CHECK (next_retry_at IS NULL OR state::text = 'failed'),
    ADD CONSTRAINT todo_state_valid
        CHECK (state::text = ANY ('{{pending,claimed,done,failed,discarded}}'::text[]));
ALTER TABLE queues_attempt
    ADD CONSTRAINT attempt_ended_has_outcome CHECK ((ended_at IS NULL) = (outcome IS NULL)),
    ADD CONSTRAINT attempt_number_positive CHECK (number >= 1),
    ADD CONSTRAINT attempt_outcome_valid
        CHECK (outcome::text = ANY ('{{completed,failed,released,expired,superseded,revoked}}'::text[]));

DROP TRIGGER todo_checks_update ON queues_todo;
DROP FUNCTION todo_state_check();
DROP TRIGGER attempt_one_open_insert ON queues_attempt;
DROP TRIGGER attempt_one_open_update ON queues_attempt;
CREATE OR REPLACE FUNCTION attempt_one_open() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('transaction_isolation') = 'repeatable read' THEN
        RAISE EXCEPTION 'an open attempt is written under READ COMMITTED or SERIALIZABLE only'
            USING ERRCODE = 'invalid_transaction_state', CONSTRAINT = 'attempt_one_open',
                  TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA;
    END IF;
    PERFORM pg_advisory_xact_lock({LOCK_CLASS}, uuid_hash(NEW.todo_id));
    -- attempt_todo_number_idx
    IF EXISTS (SELECT 1 FROM queues_attempt a
               WHERE a.todo_id = NEW.todo_id AND a.ended_at IS NULL AND a.id <> NEW.id) THEN
        RAISE EXCEPTION 'duplicate key value violates unique constraint "attempt_one_open"'
            USING ERRCODE = 'unique_violation', CONSTRAINT = 'attempt_one_open',
                  TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA,
                  DETAIL = format('Todo %s already has an open attempt.', NEW.todo_id);
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER attempt_one_open_insert BEFORE INSERT ON queues_attempt
FOR EACH ROW WHEN (NEW.ended_at IS NULL) EXECUTE FUNCTION attempt_one_open();
CREATE TRIGGER attempt_one_open_update AFTER UPDATE OF ended_at, todo_id ON queues_attempt
FOR EACH ROW WHEN (NEW.ended_at IS NULL AND (OLD.ended_at IS NOT NULL OR NEW.todo_id <> OLD.todo_id))
EXECUTE FUNCTION attempt_one_open();
"""
    + _check_function("todo_fields_check", FIELD_RULES, "NEW")
)


class Migration(migrations.Migration):

    dependencies = [
        ("queues", "0015_attempt_end_hot"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(FORWARD, REVERSE)],
            state_operations=[],
        ),
    ]
