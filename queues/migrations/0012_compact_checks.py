# The same CHECK rules in fewer expression nodes (issue 12). PostgreSQL parses each CHECK of a
# table from its stored node text and plans it again in every statement that writes a row
# (ExecConstraints: stringToNode, then ExecPrepareExpr), and a plain claim cycle writes the todo
# twice and the attempt twice: in a profile of the backend that was a sixth of its CPU per cycle.
# Django's ``state IN (...)`` is stored as an array of five casts (1,654 characters of node text);
# one array constant says the same in 757. Same names, same rows accepted and refused:
#
# - todo_state_valid, attempt_outcome_valid: ``= ANY`` of one text[] constant (a NULL outcome
#   passes, as its IS NULL arm let it);
# - todo_tags_at_most_8: ``array_length(tags, 1) <= 8`` (NULL for an empty array or NULL tags,
#   which a CHECK passes, as Django's coalesce(..., 0) <= 8 and its NULL-tags arm did);
# - todo_tags_format: ``array_position(tags, '') IS NULL`` for ``NOT '' = ANY(tags)`` (a NULL
#   element: NULL there, NULL here, both pass; an empty tag found: refused by both);
# - attempt_ended_has_outcome: ``(ended_at IS NULL) = (outcome IS NULL)``.
#
# tests/queues/test_checks.py holds the rows each accepts and refuses.

import queues.models
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('queues', '0011_attempt_endpoint_checked_through_its_todo'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='attempt',
            name='attempt_outcome_valid',
        ),
        migrations.RemoveConstraint(
            model_name='attempt',
            name='attempt_ended_has_outcome',
        ),
        migrations.RemoveConstraint(
            model_name='todo',
            name='todo_tags_at_most_8',
        ),
        migrations.RemoveConstraint(
            model_name='todo',
            name='todo_tags_format',
        ),
        migrations.RemoveConstraint(
            model_name='todo',
            name='todo_state_valid',
        ),
        migrations.AddConstraint(
            model_name='attempt',
            constraint=models.CheckConstraint(condition=queues.models.CheckSQL("{0}::text = ANY ('{{completed,failed,released,expired,superseded,revoked}}'::text[])", 'outcome'), name='attempt_outcome_valid'),
        ),
        migrations.AddConstraint(
            model_name='attempt',
            constraint=models.CheckConstraint(condition=queues.models.CheckSQL('({0} IS NULL) = ({1} IS NULL)', 'ended_at', 'outcome'), name='attempt_ended_has_outcome'),
        ),
        migrations.AddConstraint(
            model_name='todo',
            constraint=models.CheckConstraint(condition=queues.models.CheckSQL('array_length({0}, 1) <= 8', 'tags'), name='todo_tags_at_most_8'),
        ),
        migrations.AddConstraint(
            model_name='todo',
            constraint=models.CheckConstraint(condition=queues.models.CheckSQL("array_to_string({0}, ',') ~ '^([a-z0-9][a-z0-9_.-]{{0,63}}(,|$))*$' AND array_position({0}, '') IS NULL", 'tags'), name='todo_tags_format'),
        ),
        migrations.AddConstraint(
            model_name='todo',
            constraint=models.CheckConstraint(condition=queues.models.CheckSQL("{0}::text = ANY ('{{pending,claimed,done,failed,discarded}}'::text[])", 'state'), name='todo_state_valid'),
        ),
    ]
