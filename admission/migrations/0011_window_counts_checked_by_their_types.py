# A window's counters are checked by their column types, not by CHECKs of the table (issue 12:
# the budget's price per claim).
#
# Every admitted budgeted claim charges its shard's counter row (admission_admit, migration
# 0010: UPDATE admission_admissionwindow SET used = used + 1 ...). PostgreSQL reads every CHECK of
# a table back from its stored node text and plans it again in each statement that writes a row
# of it (ExecConstraints: stringToNode, then ExecPrepareExpr), whatever columns the statement
# sets: the three CHECKs of this table (window_shard_range, window_used_nonnegative,
# window_refused_nonnegative) were rebuilt on every charge. `python -m bench.pg_instructions
# --budgeted --queues 10` counted 1,616k PostgreSQL instructions per budgeted claim cycle with
# them and 1,568k without, the same count as with no rule at all (48k, 3 %; an unbudgeted
# cycle is 1,139k).
#
# A domain's CHECK is kept planned in the type cache for the session, and it is checked only
# where a statement assigns a value of its type: a charge, which sets `used`, checks
# window_used_nonnegative and nothing else. So each counter column becomes a domain over its
# type that carries its rule, under the rule's name: the same rows refused, SQLSTATE 23514
# (check_violation: Django's IntegrityError) naming the same constraint; PostgreSQL's message
# names the domain ('value for domain admission_window_used violates check constraint
# "window_used_nonnegative"'). Clients still see integer columns (PostgreSQL describes a
# domain's column by its base type). Django's state keeps the CheckConstraints (no state
# change), so model validation still runs them. A later migration altering one of these fields
# would give the column back its plain type: put the domain back in that migration too.
# tests/admission/test_window_checks.py holds the rows each refuses and this shape.

from django.db import migrations

SHARDS = 8  # admission.models.WINDOW_SHARDS when written (migration 0007's window_shard_range)

FORWARD = f"""
CREATE DOMAIN admission_window_used AS integer
    CONSTRAINT window_used_nonnegative CHECK (VALUE >= 0);
CREATE DOMAIN admission_window_refused AS integer
    CONSTRAINT window_refused_nonnegative CHECK (VALUE >= 0);
CREATE DOMAIN admission_window_shard AS smallint
    CONSTRAINT window_shard_range CHECK (VALUE >= 0 AND VALUE < {SHARDS});
ALTER TABLE admission_admissionwindow
    DROP CONSTRAINT window_shard_range,
    DROP CONSTRAINT window_used_nonnegative,
    DROP CONSTRAINT window_refused_nonnegative,
    ALTER COLUMN used TYPE admission_window_used,
    ALTER COLUMN refused TYPE admission_window_refused,
    ALTER COLUMN shard TYPE admission_window_shard;
"""

REVERSE = f"""
ALTER TABLE admission_admissionwindow
    ALTER COLUMN used TYPE integer,
    ALTER COLUMN refused TYPE integer,
    ALTER COLUMN shard TYPE smallint,
    ADD CONSTRAINT window_shard_range CHECK (shard >= 0 AND shard < {SHARDS}),
    ADD CONSTRAINT window_used_nonnegative CHECK (used >= 0),
    ADD CONSTRAINT window_refused_nonnegative CHECK (refused >= 0);
DROP DOMAIN admission_window_used;
DROP DOMAIN admission_window_refused;
DROP DOMAIN admission_window_shard;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("admission", "0010_admit_charges_in_one_call"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(FORWARD, REVERSE)],
            state_operations=[],
        ),
    ]
