# The end of an attempt (its one update: ended_at, outcome, disposition, summary, error) is a HOT
# update now, and the CHECKs that other rules imply are gone (issue 12: the core claim cycle).
#
# PostgreSQL (16 and later) writes an update in place on its page, touching no index, when no
# indexed column changes except those only block-range (BRIN) indexes hold. Only the partial
# unique index attempt_one_open (todo_id WHERE ended_at IS NULL) stopped the end update: its
# predicate reads ended_at, so every end wrote a new tuple on another page and an entry in each
# B-tree of the table (the primary key, attempt_todo_number_idx). Any unique index whose key or
# predicate says "open" would stop it the same way.
#
# "At most one open attempt per todo" is a trigger now, with the same name, SQLSTATE (23505,
# unique_violation: Django's IntegrityError) and message as the index gave. Every write that
# makes an attempt open (an insert with no ended_at; an update that clears ended_at or moves an
# open attempt to another todo) takes a transaction-scoped advisory lock on its todo, then looks
# for another open attempt of that todo with a fresh snapshot (a VOLATILE function's statements
# take one each under READ COMMITTED), and holds the lock until it commits. Two such writers of
# one todo are therefore ordered, and the second sees the first's committed row: exact under READ
# COMMITTED. Under SERIALIZABLE the read of the todo's attempts conflicts with the other's insert
# (SSI). Under REPEATABLE READ the snapshot could predate another's committed attempt, so the
# trigger refuses the write there (no code writes attempts under it; the two REPEATABLE READ
# transactions in the code, the ledger and limit verifications, are read-only). The insert's
# trigger runs before the row is written; the update's after (a BEFORE UPDATE row trigger locks
# the row in every update of the table, named columns or not, and the end update is every cycle's).
# Lock class 16719 ("AO"), key uuid_hash(todo_id): two todos whose hashes collide share a lock,
# more waiting, never less exclusion. Django's state keeps the UniqueConstraint (model
# validation still runs it), as migration 0013 kept the CHECKs it moved into a trigger.
#
# fillfactor 90: inserts leave a tenth of each page of the attempt table free, so the end update
# of an attempt whose claim outlives the filling of its page still finds room on that page (a
# claim shorter than that finds it anyway). Only pages written from now on.
#
# The CHECKs Django derives from PositiveIntegerField: queues_attempt_number_check (number >= 0)
# is implied by attempt_number_positive (number >= 1), and queues_todo_max_attempts_check
# (max_attempts >= 0) by todo_max_attempts_range (1..100, checked by todo_fields_check on every
# write of max_attempts, migration 0013). PostgreSQL parses and plans every CHECK of a table in
# each statement that writes a row of it: the fields are IntegerFields now, which carry none.

from django.db import migrations, models

LOCK_CLASS = 16719  # "AO"

FUNCTION = rf"""
CREATE FUNCTION attempt_one_open() RETURNS trigger LANGUAGE plpgsql AS $$
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

DROP INDEX attempt_one_open;
"""

# The reverse builds the index again (it fails, as it should, if two attempts of a todo are open).
RESTORE = """
CREATE UNIQUE INDEX attempt_one_open ON queues_attempt (todo_id) WHERE ended_at IS NULL;
DROP TRIGGER IF EXISTS attempt_one_open_insert ON queues_attempt;
DROP TRIGGER IF EXISTS attempt_one_open_update ON queues_attempt;
DROP FUNCTION IF EXISTS attempt_one_open();
"""


class Migration(migrations.Migration):

    dependencies = [
        ("queues", "0014_endpoint_change_notify"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(FUNCTION, RESTORE),
                migrations.RunSQL(
                    "ALTER TABLE queues_attempt SET (fillfactor = 90)",
                    "ALTER TABLE queues_attempt RESET (fillfactor)",
                ),
            ],
            state_operations=[],
        ),
        migrations.AlterField(
            model_name="attempt",
            name="number",
            field=models.IntegerField(),
        ),
        migrations.AlterField(
            model_name="todo",
            name="max_attempts",
            field=models.IntegerField(default=5),
        ),
    ]
