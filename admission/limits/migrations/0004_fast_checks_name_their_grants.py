# The fast checks (migration 0002) also say what an admitted claim was granted: under "grant",
# the canonical JSON items (sorted keys, no spaces, as switchboard.ledger.chain.canonical writes
# them) of every limit passed that is not `off`, with its limit and its occupancy at admission.
# The claim statement writes them into its `limits.grant` ledger row (queues.sql). Names match
# LIMIT_NAME_RE and postures are words, so no item needs JSON escaping.

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
    IF l_held >= l_slots THEN
        RETURN '{"ok": false}'::jsonb;
    END IF;
    RETURN jsonb_build_object('ok', true, 'grant',
        '{"held":' || l_held || ',"kind":"pool","limit":' || l_slots || ',"name":"' || p_pool
        || '","posture":"' || l_posture || '"}');
END;
$$;
"""

TAGS_CHECK = r"""
CREATE OR REPLACE FUNCTION limits_tags_check(p_tags varchar[], p_todo uuid)
RETURNS jsonb LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    l record;
    l_held bigint;
    l_items text[] := ARRAY[]::text[];
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
            l_items := l_items || ('{"held":' || l_held || ',"kind":"tag","limit":' || l."limit"
                || ',"name":"' || l.tag || '","posture":"' || l.posture || '"}');
        END IF;
    END LOOP;
    IF cardinality(l_items) = 0 THEN
        RETURN '{"ok": true}'::jsonb;
    END IF;
    RETURN jsonb_build_object('ok', true, 'grant', array_to_string(l_items, ','));
END;
$$;
"""

OLD_POOL_CHECK = r"""
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


class Migration(migrations.Migration):
    dependencies = [
        ("limits", "0003_ratelimit_decay_step"),
    ]

    operations = [
        migrations.RunSQL(POOL_CHECK, OLD_POOL_CHECK),
        # Reversing leaves the tags check naming its grant: the old caller ignores the key.
        migrations.RunSQL(TAGS_CHECK, migrations.RunSQL.noop),
    ]
