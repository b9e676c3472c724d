# attempt_one_open takes its lock in an expression, not a PERFORM (issue 12: the core claim
# cycle's backend CPU). Same rules, lock, names, errors and order as migration 0016.
#
# A PERFORM is a SELECT that PL/pgSQL runs through SPI: a portal, an executor started and ended,
# a snapshot, for a call that reads nothing. An IF's condition that is a plain expression PL/pgSQL
# evaluates itself. Every claim inserts an attempt, so every claim ran that SELECT: in a profile of
# the backend (perf, claim_profile, one thread) the PERFORM was ~1.2 % of its CPU per cycle, the
# same lock taken in an IF ~0.3 %. pg_advisory_xact_lock returns void, which is never NULL, so the
# IF's branch is never taken: the same lock, class and key, taken at the same point.

import importlib

from django.db import migrations

m0016 = importlib.import_module("queues.migrations.0016_todo_and_attempt_checks_in_their_triggers")

PERFORM = f"    PERFORM pg_advisory_xact_lock({m0016.LOCK_CLASS}, uuid_hash(NEW.todo_id));"
IN_AN_IF = (
    "    -- void is never NULL: the lock, with no SELECT of its own.\n"
    f"    IF pg_advisory_xact_lock({m0016.LOCK_CLASS}, uuid_hash(NEW.todo_id)) IS NULL THEN\n"
    "    END IF;"
)
assert PERFORM in m0016.ATTEMPT_FUNCTION

FORWARD = m0016.ATTEMPT_FUNCTION.replace(PERFORM, IN_AN_IF)
# The reverse: the function as migration 0016 wrote it.
REVERSE = m0016.ATTEMPT_FUNCTION


class Migration(migrations.Migration):

    dependencies = [
        ("queues", "0016_todo_and_attempt_checks_in_their_triggers"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(FORWARD, REVERSE)],
            state_operations=[],
        ),
    ]
