# An attempt's summary is bounded in the database too (10,000 characters, as the services check
# first, naming the field): a rule of the attempt's trigger, as the attempt's other rules are
# (migrations 0016 and 0021; no CHECK, which every write of the row would parse and plan again).
# The update trigger fires when the summary is set as well.
#
# The function is written in migration 0019's guarded form: the rules AND-ed first, the CASE that
# names the broken one only when they do not all hold. Migration 0021 wrote attempt_rules from
# migration 0016's unguarded form, so every attempt insert (each claim's end) built the CASE.
#
# Existing rows are not checked (a trigger checks what is written from now on); the services have
# refused a longer summary since the field existed.

import importlib

from django.db import migrations, models

import switchboard.constraints

m0016 = importlib.import_module("queues.migrations.0016_todo_and_attempt_checks_in_their_triggers")
m0019 = importlib.import_module("queues.migrations.0019_checks_one_expression_when_they_hold")
m0021 = importlib.import_module("queues.migrations.0021_attempt_written_when_it_ends")

# In name order, as migration 0016's.
ATTEMPT_RULES = [
    *m0021.ATTEMPT_RULES,
    ("attempt_summary_length", "char_length(NEW.summary) <= 10000"),
]
RULES_FUNCTION = m0019._forward(
    m0016._check_function("attempt_rules", ATTEMPT_RULES, "NEW"), ATTEMPT_RULES
)

FORWARD = (
    RULES_FUNCTION
    + """
DROP TRIGGER attempt_rules_update ON queues_attempt;
CREATE TRIGGER attempt_rules_update AFTER UPDATE OF number, outcome, summary ON queues_attempt
FOR EACH ROW EXECUTE FUNCTION attempt_rules();
"""
)

REVERSE = (
    m0021.RULES_FUNCTION
    + """
DROP TRIGGER attempt_rules_update ON queues_attempt;
CREATE TRIGGER attempt_rules_update AFTER UPDATE OF number, outcome ON queues_attempt
FOR EACH ROW EXECUTE FUNCTION attempt_rules();
"""
)


class Migration(migrations.Migration):
    dependencies = [
        ("queues", "0022_pause_reason_length"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(FORWARD, REVERSE)],
            state_operations=[
                migrations.AddConstraint(
                    model_name="attempt",
                    constraint=models.CheckConstraint(
                        condition=switchboard.constraints.CheckSQL(
                            "char_length({0}) <= 10000", "summary"
                        ),
                        name="attempt_summary_length",
                    ),
                ),
            ],
        ),
    ]
