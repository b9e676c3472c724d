# The CHECKs on a todo's fields that no transition changes (queue, title, pool, tags, rate_limit,
# max_attempts) are now checked when those fields are written, by a trigger, instead of by
# PostgreSQL on every write of the row (issue 12).
#
# PostgreSQL evaluates every CHECK of a table on every UPDATE of a row, whatever columns it
# sets, and before that parses each from its stored node text and plans it again, per statement
# (ExecConstraints). A plain claim cycle updates the todo twice (claim, completion), neither
# touching these fields: in a profile of the backend the todo's CHECKs were an eighth of its CPU
# per cycle after migration 0012, over half of it these seven.
#
# The rules, names and errors are the same: SQLSTATE 23514 (check_violation, Django's
# IntegrityError) with the constraint's name in the error's CONSTRAINT field and the message
# PostgreSQL writes for a CHECK. Checked on every INSERT (before the row is written) and on
# every UPDATE that sets any of the six fields (an AFTER trigger: a BEFORE UPDATE trigger would
# lock the row again in every update, named fields or not). Django's state keeps the seven as
# CheckConstraints (queues.models.Todo.Meta), so model validation still runs them; only the
# database's form changes. tests/queues/test_checks.py holds the rows each refuses.

from django.db import migrations

MOVED = [
    "todo_pool_format",
    "todo_rate_limit_format",
    "todo_tags_at_most_8",
    "todo_tags_format",
    "todo_queue_format",
    "todo_title_nonempty",
    "todo_max_attempts_range",
]

FUNCTION = r"""
CREATE OR REPLACE FUNCTION todo_fields_check() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    l_violated text;
BEGIN
    -- As a CHECK: a rule that is NULL (a NULL field) passes; the first rule refused is named.
    l_violated := CASE
        WHEN NOT coalesce(NEW.pool::text ~ '^[a-z0-9][a-z0-9_.-]{0,63}$', true)
            THEN 'todo_pool_format'
        WHEN NOT coalesce(NEW.rate_limit::text ~ '^[a-z0-9][a-z0-9_.-]{0,63}$', true)
            THEN 'todo_rate_limit_format'
        WHEN NOT coalesce(array_length(NEW.tags, 1) <= 8, true)
            THEN 'todo_tags_at_most_8'
        WHEN NOT coalesce(array_to_string(NEW.tags, ',') ~ '^([a-z0-9][a-z0-9_.-]{0,63}(,|$))*$'
                          AND array_position(NEW.tags, '') IS NULL, true)
            THEN 'todo_tags_format'
        WHEN NOT coalesce(NEW.queue::text ~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$', true)
            THEN 'todo_queue_format'
        WHEN NOT coalesce(NOT NEW.title::text = '', true)
            THEN 'todo_title_nonempty'
        WHEN NOT coalesce(NEW.max_attempts >= 1 AND NEW.max_attempts <= 100, true)
            THEN 'todo_max_attempts_range'
    END;
    IF l_violated IS NOT NULL THEN
        RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"',
                        TG_TABLE_NAME, l_violated
            USING ERRCODE = 'check_violation', CONSTRAINT = l_violated,
                  TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA;
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER todo_fields_check_insert BEFORE INSERT ON queues_todo
FOR EACH ROW EXECUTE FUNCTION todo_fields_check();

CREATE TRIGGER todo_fields_check_update
AFTER UPDATE OF queue, title, pool, tags, rate_limit, max_attempts ON queues_todo
FOR EACH ROW EXECUTE FUNCTION todo_fields_check();
"""

DROP_FUNCTION = """
DROP TRIGGER IF EXISTS todo_fields_check_insert ON queues_todo;
DROP TRIGGER IF EXISTS todo_fields_check_update ON queues_todo;
DROP FUNCTION IF EXISTS todo_fields_check();
"""

# The reverse puts the CHECKs back as migration 0012 left them.
RESTORE = r"""
ALTER TABLE queues_todo
    ADD CONSTRAINT todo_pool_format CHECK (pool::text ~ '^[a-z0-9][a-z0-9_.-]{0,63}$'),
    ADD CONSTRAINT todo_rate_limit_format
        CHECK (rate_limit::text ~ '^[a-z0-9][a-z0-9_.-]{0,63}$'),
    ADD CONSTRAINT todo_tags_at_most_8 CHECK (array_length(tags, 1) <= 8),
    ADD CONSTRAINT todo_tags_format
        CHECK (array_to_string(tags, ',') ~ '^([a-z0-9][a-z0-9_.-]{0,63}(,|$))*$'
               AND array_position(tags, '') IS NULL),
    ADD CONSTRAINT todo_queue_format CHECK (queue::text ~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$'),
    ADD CONSTRAINT todo_title_nonempty CHECK (NOT title::text = ''),
    ADD CONSTRAINT todo_max_attempts_range CHECK (max_attempts >= 1 AND max_attempts <= 100);
"""


class Migration(migrations.Migration):

    dependencies = [
        ("queues", "0012_compact_checks"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(FUNCTION, DROP_FUNCTION),
                migrations.RunSQL(
                    "ALTER TABLE queues_todo "
                    + ", ".join(f"DROP CONSTRAINT {name}" for name in MOVED),
                    RESTORE,
                ),
            ],
            state_operations=[],
        ),
    ]
