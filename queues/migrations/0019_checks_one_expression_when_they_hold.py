# The todo's and the attempt's check rules (migration 0016) are evaluated as one boolean first,
# and the CASE that names the broken rule runs only when that boolean is not true (issue 12: the
# core claim cycle's backend CPU). Same rules, names, errors and order as migrations 0016 and 0017.
#
# PL/pgSQL builds the executor state of each expression a function evaluates once per
# transaction, and every claim and every completion is a transaction of its own: each call of
# these trigger functions built the CASE (a NOT, a coalesce and a constant per rule) and then the
# ``IF l_violated IS NOT NULL`` test, every time. A plain claim cycle calls them four times
# (the todo's after its claim and after its completion, the attempt's on its insert and after its
# end). In a callgrind count of the backend (claim_profile's cycle, one thread) those calls were
# ~150,000 instructions per cycle of ~1.6 million, ~40 % of it the CASE's set-up.
#
# The boolean is the rules AND-ed, each as the CASE reads it (coalesce(rule, true): a NULL rule
# passes, as a CHECK's): false exactly when the CASE would name a rule. Only then the CASE runs,
# so the first broken rule in name order is still the one named.

import importlib

from django.db import migrations

m0016 = importlib.import_module("queues.migrations.0016_todo_and_attempt_checks_in_their_triggers")
m0017 = importlib.import_module("queues.migrations.0017_attempt_one_open_locks_without_a_select")


def _guarded(rules: list[tuple[str, str]]) -> str:
    """The CASE and its error of migration 0016, entered only when the rules do not all hold."""
    holds = "\n           AND ".join(f"coalesce({rule}, true)" for _name, rule in rules)
    inner = (m0016._violated(rules) + m0016.CHECK_ERROR).replace("\n", "\n    ")
    return f"    IF NOT ({holds}) THEN\n    {inner}\n    END IF;"


def _forward(function: str, rules: list[tuple[str, str]]) -> str:
    unguarded = m0016._violated(rules) + m0016.CHECK_ERROR
    assert unguarded in function
    return function.replace(unguarded, _guarded(rules))


TODO_FIELDS_FUNCTION = m0016._check_function(
    "todo_fields_check", m0016.FIELD_RULES + m0016.TODO_RULES, "NEW"
)
TODO_STATE_FUNCTION = m0016._check_function("todo_state_check", m0016.TODO_RULES, "NULL")

FORWARD = (
    _forward(TODO_FIELDS_FUNCTION, m0016.FIELD_RULES + m0016.TODO_RULES)
    + _forward(TODO_STATE_FUNCTION, m0016.TODO_RULES)
    + _forward(m0017.FORWARD, m0016.ATTEMPT_RULES)
)
# The reverse: the functions as migrations 0016 and 0017 left them.
REVERSE = TODO_FIELDS_FUNCTION + TODO_STATE_FUNCTION + m0017.FORWARD


class Migration(migrations.Migration):

    dependencies = [
        ("queues", "0018_todo_vacuum_cadence"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(FORWARD, REVERSE)],
            state_operations=[],
        ),
    ]
