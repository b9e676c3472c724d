# An attempt number names one claim for the todo's whole life (a finding of round 8's tester):
# an operator's retry set ``attempt`` back to 0, so the next claim was attempt 1 again, and a
# worker whose attempt 1 had ended long before (its lease lapsed, another took the todo over)
# completed that new claim with its stale ``attempt``, as HOLDS_CLAIM could not tell the two
# apart. The console's Complete, Fail and Release, which send the attempt the page showed, did
# the same.
#
# Now a retry leaves ``attempt`` as it is and gives the todo a fresh round of the attempts it was
# pushed with: ``retried_after`` is the attempt the retry came after and ``max_attempts`` that
# plus the round. Every rule that reads ``attempt < max_attempts`` (the claim's, the reaper's,
# the endings') reads the same; only the failure's backoff counts from ``retried_after``.
#
# The rules, in the triggers as migrations 0016 and 0019 keep them (no CHECK: issue 12):
# - todo_max_attempts_range: the round, ``max_attempts - retried_after``, is 1..100 (as
#   ``max_attempts`` alone was before any retry); a field rule of todo_fields_check, which now
#   also runs when an update sets ``retried_after``.
# - todo_retried_after_an_attempt (new): ``0 <= retried_after <= attempt``; a transition rule of
#   todo_state_check, which now also runs when an update sets ``retried_after``.
# The claim cycle sets neither field: its writes still skip todo_fields_check.

import importlib

from django.db import migrations, models

m0016 = importlib.import_module("queues.migrations.0016_todo_and_attempt_checks_in_their_triggers")
m0019 = importlib.import_module("queues.migrations.0019_checks_one_expression_when_they_hold")

ROUND = "NEW.max_attempts - NEW.retried_after"
FIELD_RULES = [
    (name, f"{ROUND} >= 1 AND {ROUND} <= 100" if name == "todo_max_attempts_range" else rule)
    for name, rule in m0016.FIELD_RULES
]
# In name order, as migration 0016's.
TODO_RULES = sorted(
    [
        *m0016.TODO_RULES,
        (
            "todo_retried_after_an_attempt",
            "NEW.retried_after >= 0 AND NEW.retried_after <= NEW.attempt",
        ),
    ]
)


def _functions(field_rules: list[tuple[str, str]], todo_rules: list[tuple[str, str]]) -> str:
    fields = m0016._check_function("todo_fields_check", field_rules + todo_rules, "NEW")
    state = m0016._check_function("todo_state_check", todo_rules, "NULL")
    return m0019._forward(fields, field_rules + todo_rules) + m0019._forward(state, todo_rules)


def _triggers(fields: str, state: str) -> str:
    return f"""
DROP TRIGGER todo_fields_check_update ON queues_todo;
CREATE TRIGGER todo_fields_check_update
AFTER UPDATE OF {fields} ON queues_todo
FOR EACH ROW EXECUTE FUNCTION todo_fields_check();
DROP TRIGGER todo_checks_update ON queues_todo;
CREATE TRIGGER todo_checks_update
AFTER UPDATE OF {state} ON queues_todo
FOR EACH ROW EXECUTE FUNCTION todo_state_check();
"""


FIELDS = "queue, title, pool, tags, rate_limit, max_attempts"
STATE = "state, attempt, max_attempts, lease_expires_at, next_retry_at, rings"

FORWARD = _functions(FIELD_RULES, TODO_RULES) + _triggers(
    f"{FIELDS}, retried_after", f"{STATE}, retried_after"
)
REVERSE = _functions(m0016.FIELD_RULES, m0016.TODO_RULES) + _triggers(FIELDS, STATE)


class Migration(migrations.Migration):
    dependencies = [
        ("queues", "0023_attempt_summary_length"),
    ]

    operations = [
        migrations.AddField(
            model_name="todo",
            name="retried_after",
            field=models.IntegerField(db_default=0, default=0, editable=False),
        ),
        migrations.SeparateDatabaseAndState(
            # The reverse runs before the column is dropped: the functions read it until then.
            database_operations=[migrations.RunSQL(FORWARD, REVERSE)],
            state_operations=[
                migrations.RemoveConstraint(model_name="todo", name="todo_max_attempts_range"),
                migrations.AddConstraint(
                    model_name="todo",
                    constraint=models.CheckConstraint(
                        condition=models.Q(
                            max_attempts__gte=models.F("retried_after") + 1,
                            max_attempts__lte=models.F("retried_after") + 100,
                        ),
                        name="todo_max_attempts_range",
                    ),
                ),
                migrations.AddConstraint(
                    model_name="todo",
                    constraint=models.CheckConstraint(
                        condition=models.Q(
                            retried_after__gte=0, retried_after__lte=models.F("attempt")
                        ),
                        name="todo_retried_after_an_attempt",
                    ),
                ),
            ],
        ),
    ]
