# The fast path for pools and tags (queues.gates): limits_pool_check(pool, todo) and
# limits_tags_check(tags, todo), evaluated inside the claim_next statement for a candidate that
# names a pool or tags. Each locks the declaration rows (tags in name order, so two claims never
# wait on each other in opposite orders), then counts occupancy in statements of its own (a
# VOLATILE function's statements each take a fresh snapshot under READ COMMITTED, so they see
# every claim committed by the transactions the lock waited for), excluding a takeover of this
# very todo. {"ok": true} admits (nothing to spend: occupancy is the claimed rows themselves);
# {"ok": false} (a limit at its cap under enforce or advise, or a declaration gone) sends the
# candidate to the locked path, which refuses or waives exactly as before. The statement commits
# on its own, so these locks are never held across a client round trip.

from django.db import migrations

POOL_CHECK = r"""
CREATE OR REPLACE FUNCTION limits_pool_check(p_pool varchar, p_todo uuid)
RETURNS jsonb LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    l_slots integer;
    l_posture varchar;
    l_held bigint;
BEGIN
    SELECT p.slots, p.posture INTO l_slots, l_posture
    FROM limits_pool p WHERE p.name = p_pool FOR UPDATE;
    IF NOT FOUND THEN
        RETURN '{"ok": false}'::jsonb;
    END IF;
    IF l_posture = 'off' THEN
        RETURN '{"ok": true}'::jsonb;
    END IF;
    SELECT count(*) INTO l_held FROM queues_todo t
    WHERE t.state = 'claimed' AND t.pool = p_pool AND t.id IS DISTINCT FROM p_todo;
    RETURN jsonb_build_object('ok', l_held < l_slots);
END;
$$;
"""

TAGS_CHECK = r"""
CREATE OR REPLACE FUNCTION limits_tags_check(p_tags varchar[], p_todo uuid)
RETURNS jsonb LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    l record;
    l_held bigint;
BEGIN
    FOR l IN SELECT g.tag, g."limit", g.posture FROM limits_taglimit g
             WHERE g.tag = ANY(p_tags) ORDER BY g.tag FOR UPDATE LOOP
        IF l.posture <> 'off' THEN
            SELECT count(*) INTO l_held FROM queues_todo t
            WHERE t.state = 'claimed' AND t.tags <> '{}' AND t.tags @> ARRAY[l.tag]
              AND t.id IS DISTINCT FROM p_todo;
            IF l_held >= l."limit" THEN
                RETURN '{"ok": false}'::jsonb;
            END IF;
        END IF;
    END LOOP;
    RETURN '{"ok": true}'::jsonb;
END;
$$;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("limits", "0001_initial"),
        ("queues", "0005_todo_named_limits"),
    ]

    operations = [
        migrations.RunSQL(POOL_CHECK, "DROP FUNCTION IF EXISTS limits_pool_check(varchar, uuid)"),
        migrations.RunSQL(TAGS_CHECK, "DROP FUNCTION IF EXISTS limits_tags_check(varchar[], uuid)"),
    ]
