# The ending statements' reopen rings for pools and tags (admission.limits.gates: PoolGate and
# TagGate ``reopens``) as functions, called only when the ended todo names a pool or a tag.
#
# Written inline, each was a subquery (a DISTINCT over a join, a count under it) inside the
# ending statement's RETURNING: PostgreSQL builds every subquery's executor state when the
# statement starts, whether or not its CASE ever runs it, so every completion of a todo naming
# no limit paid for both (issue 12: about a twentieth of the database's CPU per plain claim
# cycle, ExecutorStart in a profile of the backend). A function call costs nothing until called.
#
# The SQL is the same as the inline forms' (queues.sql.gated: pending_rows_in_pool,
# claimed_in_pool, pending_rows_with_tag, claimed_with_tag). STABLE, so each runs on the ending
# statement's own snapshot, as the subquery did; the limits' rows are still read by
# limits_pool_shared / limits_tags_shared after their shared locks (migration 0005).

from django.db import migrations

FUNCTIONS = r"""
CREATE OR REPLACE FUNCTION limits_pool_reopens(p_pool varchar, p_todo uuid)
RETURNS text[] LANGUAGE sql STABLE AS $$
    SELECT ARRAY(
        SELECT DISTINCT w.endpoint_id::text || ':' || w.queue
        FROM (SELECT s.o_name AS name, s.o_slots AS slots, s.o_posture AS posture
              FROM limits_pool_shared(p_pool) s) p,
             LATERAL (SELECT w.endpoint_id, w.queue FROM queues_todo w
                      WHERE w.state = 'pending' AND w.pool = p.name) w
        WHERE p.posture = 'enforce'
          AND p.slots = 1 + (SELECT count(*) FROM queues_todo o
                             WHERE o.state = 'claimed' AND o.pool = p.name
                               AND o.id IS DISTINCT FROM p_todo))
$$;

CREATE OR REPLACE FUNCTION limits_tags_reopens(p_tags varchar[], p_todo uuid)
RETURNS text[] LANGUAGE sql STABLE AS $$
    SELECT ARRAY(
        SELECT DISTINCT w.endpoint_id::text || ':' || w.queue
        FROM (SELECT s.o_tag AS tag, s.o_limit AS "limit", s.o_posture AS posture
              FROM limits_tags_shared(p_tags) s) l,
             LATERAL (SELECT w.endpoint_id, w.queue FROM queues_todo w
                      WHERE w.state = 'pending' AND w.tags <> '{}'
                        AND w.tags @> ARRAY[l.tag]) w
        WHERE l.posture = 'enforce'
          AND l."limit" = 1 + (SELECT count(*) FROM queues_todo o
                               WHERE o.state = 'claimed' AND o.tags <> '{}'
                                 AND o.tags @> ARRAY[l.tag] AND o.id IS DISTINCT FROM p_todo))
$$;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("limits", "0005_headroom_locks"),
        ("queues", "0009_todo_pending_pool_and_tags_indexes"),
    ]

    operations = [
        migrations.RunSQL(
            FUNCTIONS,
            "DROP FUNCTION IF EXISTS limits_pool_reopens(varchar, uuid);"
            " DROP FUNCTION IF EXISTS limits_tags_reopens(varchar[], uuid);",
        ),
    ]
