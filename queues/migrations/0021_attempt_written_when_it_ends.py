# An attempt's row is written when the claim ends, not when it starts (issue 12: the claim
# cycle's database CPU). The claim in progress is the todo's own columns: owner, claimed_at,
# lease_expires_at, attempt, and now lease_token_hash and claim_via. Every statement that ends a
# claim (complete, fail, release, the reaper, a revoke, a takeover) inserts the ended attempt from
# the todo row it locked and changed (RETURNING old.*), so there is no open attempt row to find,
# update or keep unique: at most one open attempt per todo holds by construction, and the
# one-open trigger, its advisory lock and attempt_supersede's fresh-snapshot update go.
#
# Measured with bench.pg_instructions (2 rounds x 200 plain cycles): 1,334k instructions per
# cycle before, 1,164k after.
#
# Existing open attempts move onto their todos (their token hash and via) and their rows go; an
# open attempt whose todo no longer holds that claim (none should exist) is closed as superseded
# now, as migration 0008 closed the ones a race left open. Reverse: the open rows come back from
# the claimed todos.

import importlib

from django.db import migrations, models

m0016 = importlib.import_module("queues.migrations.0016_todo_and_attempt_checks_in_their_triggers")
m0017 = importlib.import_module("queues.migrations.0017_attempt_one_open_locks_without_a_select")
m0008 = importlib.import_module("queues.migrations.0008_attempt_one_open_again")

MOVE_OPEN = """
UPDATE queues_todo t SET lease_token_hash = a.lease_token_hash, claim_via = a.via
FROM queues_attempt a
WHERE a.todo_id = t.id AND a.ended_at IS NULL AND t.state = 'claimed' AND a.number = t.attempt;
DELETE FROM queues_attempt a USING queues_todo t
WHERE a.todo_id = t.id AND a.ended_at IS NULL AND t.state = 'claimed' AND a.number = t.attempt;
UPDATE queues_attempt SET ended_at = now(), outcome = 'superseded', disposition = 'requeued'
WHERE ended_at IS NULL;
"""

# The reverse: each claimed todo's claim as an open attempt row again.
OPEN_AGAIN = """
INSERT INTO queues_attempt (todo_id, number, endpoint_id, claimant, via, claimed_at,
                            lease_expires_at, lease_token_hash, summary)
SELECT t.id, t.attempt, t.endpoint_id, t.owner, t.claim_via, coalesce(t.claimed_at, now()),
       t.lease_expires_at, t.lease_token_hash, ''
FROM queues_todo t WHERE t.state = 'claimed';
"""

# The attempt's rules, as migration 0016 checked them, less the one that is now two NOT NULLs.
ATTEMPT_RULES = [rule for rule in m0016.ATTEMPT_RULES if rule[0] != "attempt_ended_has_outcome"]
RULES_FUNCTION = m0016._check_function("attempt_rules", ATTEMPT_RULES, "NEW")

FORWARD = (
    RULES_FUNCTION
    + """
DROP TRIGGER attempt_one_open_insert ON queues_attempt;
DROP TRIGGER attempt_one_open_update ON queues_attempt;
DROP FUNCTION attempt_one_open();
DROP FUNCTION attempt_supersede(uuid, integer, timestamptz);
CREATE TRIGGER attempt_rules_insert BEFORE INSERT ON queues_attempt
FOR EACH ROW EXECUTE FUNCTION attempt_rules();
CREATE TRIGGER attempt_rules_update AFTER UPDATE OF number, outcome ON queues_attempt
FOR EACH ROW EXECUTE FUNCTION attempt_rules();
"""
)

REVERSE = (
    m0017.FORWARD
    + m0008.SUPERSEDE
    + """
DROP TRIGGER attempt_rules_insert ON queues_attempt;
DROP TRIGGER attempt_rules_update ON queues_attempt;
DROP FUNCTION attempt_rules();
CREATE TRIGGER attempt_one_open_insert BEFORE INSERT ON queues_attempt
FOR EACH ROW EXECUTE FUNCTION attempt_one_open();
CREATE TRIGGER attempt_one_open_update
AFTER UPDATE OF number, ended_at, outcome, todo_id ON queues_attempt
FOR EACH ROW EXECUTE FUNCTION attempt_one_open();
"""
)


class Migration(migrations.Migration):
    dependencies = [
        ("queues", "0020_todo_live_pool_and_tags_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="todo",
            name="claim_via",
            field=models.CharField(
                blank=True, default="", db_default="", editable=False, max_length=10
            ),
        ),
        migrations.AddField(
            model_name="todo",
            name="lease_token_hash",
            field=models.CharField(blank=True, editable=False, max_length=64, null=True),
        ),
        # Before the NOT NULLs below; the reverse runs after they are dropped again.
        migrations.RunSQL(MOVE_OPEN, OPEN_AGAIN),
        migrations.SeparateDatabaseAndState(
            # The constraints were a trigger's rules in the database (migration 0016).
            database_operations=[],
            state_operations=[
                migrations.RemoveConstraint(model_name="attempt", name="attempt_one_open"),
                migrations.RemoveConstraint(
                    model_name="attempt", name="attempt_ended_has_outcome"
                ),
            ],
        ),
        migrations.AlterField(
            model_name="attempt",
            name="ended_at",
            field=models.DateTimeField(),
        ),
        migrations.AlterField(
            model_name="attempt",
            name="outcome",
            field=models.CharField(
                choices=[
                    ("completed", "Completed"),
                    ("failed", "Failed"),
                    ("released", "Released"),
                    ("expired", "Expired"),
                    ("superseded", "Superseded"),
                    ("revoked", "Revoked"),
                ],
                max_length=12,
            ),
        ),
        migrations.RunSQL(FORWARD, REVERSE),
    ]
