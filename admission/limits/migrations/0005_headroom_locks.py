# Pools and tags off the serial path (issue 13): every claim, ending and change of a pool or a
# tag now meets the others on a transaction-scoped advisory lock per limit, keyed
# (class, hashtext(name)) (classes: admission.limits.locks), instead of the limit's row lock.
# A claim far from the cap takes it shared, so claims naming one limit no longer wait on each
# other; near the cap, and for every change, it is taken exclusive. The argument that the count
# never passes the limit is in admission/limits/gates.py's docstring.
#
# - limits_headroom_bound(): B, how many claims naming one limit can be in flight unseen at once.
# - limits_lock(class, names, shared): the advisory locks of ``names``, each key once, in key
#   order, shared for the names in ``shared`` and exclusive otherwise.
# - limits_pool_check / limits_tags_check: the fast checks (migrations 0002/0004), deciding a
#   limit under its shared lock when held + B < limit, else under its exclusive lock exactly as
#   before; ``{"ok": false, "stale": true}`` when a limit read far from its cap without locks was
#   within B of it under the lock (the locked path decides, this once).
# - limits_pool_shared / limits_tags_shared: the limits' rows read under their shared locks, for
#   the ending statements' reopen rings (instead of FOR SHARE on the rows).
# - a trigger on limits_pool and limits_taglimit: any insert, update or delete of a declaration
#   takes its limit's lock exclusive, whoever writes it (the services take it first themselves).
#
# Literals in the SQL: 19536 is POOL_LOCK_CLASS and 19540 TAG_LOCK_CLASS (admission.limits.locks;
# tests/limits/test_headroom.py pins them).

import importlib

from django.db import migrations

_OLD = importlib.import_module("admission.limits.migrations.0004_fast_checks_name_their_grants")

BOUND = r"""
CREATE OR REPLACE FUNCTION limits_headroom_bound()
RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT current_setting('max_connections')::integer
         + current_setting('max_prepared_transactions')::integer
         + current_setting('max_worker_processes')::integer
         + current_setting('max_wal_senders')::integer
$$;
"""

LOCK = r"""
CREATE OR REPLACE FUNCTION limits_lock(p_class integer, p_names varchar[], p_shared varchar[])
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    k record;
BEGIN
    -- Each key once, in key order, so two transactions locking overlapping names never wait on
    -- each other in opposite orders; names sharing a key take it exclusive if either needs it.
    FOR k IN SELECT hashtext(n) AS key, bool_and(n = ANY(coalesce(p_shared, '{}'))) AS shared
             FROM unnest(p_names) n WHERE n IS NOT NULL GROUP BY 1 ORDER BY 1 LOOP
        IF k.shared THEN
            PERFORM pg_advisory_xact_lock_shared(p_class, k.key);
        ELSE
            PERFORM pg_advisory_xact_lock(p_class, k.key);
        END IF;
    END LOOP;
END;
$$;
"""

# The statements after the lock each take a fresh snapshot (a VOLATILE function's statements do,
# under READ COMMITTED), so they see every claim committed by the transactions the lock waited
# for and the limit as its last change committed it.
POOL_CHECK = r"""
CREATE OR REPLACE FUNCTION limits_pool_check(p_pool varchar, p_todo uuid)
RETURNS jsonb LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    l_slots integer;
    l_posture varchar;
    l_held bigint;
    l_bound integer := limits_headroom_bound();
    l_shared boolean := false;
BEGIN
    -- Which lock, read without one: shared when the pool is off, or far enough from its cap,
    -- and this transaction has claimed no other todo under a shared lock.
    IF coalesce(current_setting('switchboard.headroom_todo', true), '') IN ('', p_todo::text) THEN
        SELECT p.slots, p.posture INTO l_slots, l_posture FROM limits_pool p WHERE p.name = p_pool;
        IF l_posture = 'off' THEN
            l_shared := true;
        ELSIF l_slots > l_bound THEN
            SELECT count(*) INTO l_held FROM queues_todo t
            WHERE t.state = 'claimed' AND t.pool = p_pool AND t.id IS DISTINCT FROM p_todo;
            l_shared := l_held + l_bound < l_slots;
        END IF;
    END IF;
    IF l_shared THEN
        PERFORM pg_advisory_xact_lock_shared(19536, hashtext(p_pool));
    ELSE
        PERFORM pg_advisory_xact_lock(19536, hashtext(p_pool));
    END IF;
    SELECT p.slots, p.posture INTO l_slots, l_posture FROM limits_pool p WHERE p.name = p_pool;
    IF NOT FOUND THEN
        RETURN '{"ok": false}'::jsonb;
    END IF;
    IF l_posture = 'off' THEN
        RETURN '{"ok": true}'::jsonb;
    END IF;
    SELECT count(*) INTO l_held FROM queues_todo t
    WHERE t.state = 'claimed' AND t.pool = p_pool AND t.id IS DISTINCT FROM p_todo;
    IF l_shared THEN
        IF l_held + l_bound >= l_slots THEN
            RETURN '{"ok": false, "stale": true}'::jsonb;
        END IF;
        PERFORM set_config('switchboard.headroom_todo', p_todo::text, true);
    ELSIF l_held >= l_slots THEN
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
    l_bound integer := limits_headroom_bound();
    l_may boolean;
    l_key integer;
    l_key_shared boolean;
    l_shared varchar[] := ARRAY[]::varchar[];
    l_headroom boolean := false;
BEGIN
    l_may := coalesce(current_setting('switchboard.headroom_todo', true), '') IN ('', p_todo::text);
    -- Each tag's lock in key order, its mode chosen from the tag read without a lock (see
    -- limits_pool_check; a tag with no declaration has nothing to decide: shared). Tags whose
    -- keys collide share the first one's lock and mode, and are decided by that mode.
    FOR l IN SELECT n.tag, hashtext(n.tag) AS key, g."limit", g.posture
             FROM (SELECT DISTINCT unnest(p_tags) AS tag) n
             LEFT JOIN limits_taglimit g ON g.tag = n.tag
             ORDER BY 2, 1 LOOP
        IF l_key IS DISTINCT FROM l.key THEN
            l_key := l.key;
            l_key_shared := false;
            IF l_may THEN
                IF l.posture IS NULL OR l.posture = 'off' THEN
                    l_key_shared := true;
                ELSIF l."limit" > l_bound THEN
                    SELECT count(*) INTO l_held FROM queues_todo t
                    WHERE t.state = 'claimed' AND t.tags <> '{}' AND t.tags @> ARRAY[l.tag]
                      AND t.id IS DISTINCT FROM p_todo;
                    l_key_shared := l_held + l_bound < l."limit";
                END IF;
            END IF;
            IF l_key_shared THEN
                PERFORM pg_advisory_xact_lock_shared(19540, l.key);
            ELSE
                PERFORM pg_advisory_xact_lock(19540, l.key);
            END IF;
        END IF;
        IF l_key_shared THEN
            l_shared := l_shared || l.tag;
        END IF;
    END LOOP;
    FOR l IN SELECT g.tag, g."limit", g.posture FROM limits_taglimit g
             WHERE g.tag = ANY(p_tags) ORDER BY g.tag LOOP
        IF l.posture <> 'off' THEN
            SELECT count(*) INTO l_held FROM queues_todo t
            WHERE t.state = 'claimed' AND t.tags <> '{}' AND t.tags @> ARRAY[l.tag]
              AND t.id IS DISTINCT FROM p_todo;
            IF l.tag = ANY(l_shared) THEN
                IF l_held + l_bound >= l."limit" THEN
                    RETURN '{"ok": false, "stale": true}'::jsonb;
                END IF;
                l_headroom := true;
            ELSIF l_held >= l."limit" THEN
                RETURN '{"ok": false}'::jsonb;
            END IF;
            l_items := l_items || ('{"held":' || l_held || ',"kind":"tag","limit":' || l."limit"
                || ',"name":"' || l.tag || '","posture":"' || l.posture || '"}');
        END IF;
    END LOOP;
    IF l_headroom THEN
        PERFORM set_config('switchboard.headroom_todo', p_todo::text, true);
    END IF;
    IF cardinality(l_items) = 0 THEN
        RETURN '{"ok": true}'::jsonb;
    END IF;
    RETURN jsonb_build_object('ok', true, 'grant', array_to_string(l_items, ','));
END;
$$;
"""

SHARED_READS = r"""
CREATE OR REPLACE FUNCTION limits_pool_shared(p_pool varchar)
RETURNS TABLE(o_name varchar, o_slots integer, o_posture varchar)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(19536, hashtext(p_pool));
    RETURN QUERY SELECT p.name, p.slots, p.posture FROM limits_pool p WHERE p.name = p_pool;
END;
$$;

CREATE OR REPLACE FUNCTION limits_tags_shared(p_tags varchar[])
RETURNS TABLE(o_tag varchar, o_limit integer, o_posture varchar)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM limits_lock(19540, p_tags, p_tags);
    RETURN QUERY SELECT g.tag, g."limit", g.posture FROM limits_taglimit g
                 WHERE g.tag = ANY(p_tags) ORDER BY g.tag;
END;
$$;
"""

TRIGGER = r"""
CREATE OR REPLACE FUNCTION limits_declaration_lock()
RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    l_names varchar[] := ARRAY[]::varchar[];
BEGIN
    IF TG_OP <> 'INSERT' THEN
        l_names := l_names || (to_jsonb(OLD) ->> TG_ARGV[1])::varchar;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        l_names := l_names || (to_jsonb(NEW) ->> TG_ARGV[1])::varchar;
    END IF;
    PERFORM limits_lock(TG_ARGV[0]::integer, l_names, NULL);
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER limits_pool_lock BEFORE INSERT OR UPDATE OR DELETE ON limits_pool
FOR EACH ROW EXECUTE FUNCTION limits_declaration_lock('19536', 'name');
CREATE TRIGGER limits_taglimit_lock BEFORE INSERT OR UPDATE OR DELETE ON limits_taglimit
FOR EACH ROW EXECUTE FUNCTION limits_declaration_lock('19540', 'tag');
"""

DROP_TRIGGER = """
DROP TRIGGER IF EXISTS limits_pool_lock ON limits_pool;
DROP TRIGGER IF EXISTS limits_taglimit_lock ON limits_taglimit;
DROP FUNCTION IF EXISTS limits_declaration_lock();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("limits", "0004_fast_checks_name_their_grants"),
    ]

    operations = [
        migrations.RunSQL(BOUND, "DROP FUNCTION IF EXISTS limits_headroom_bound()"),
        migrations.RunSQL(LOCK, "DROP FUNCTION IF EXISTS limits_lock(integer, varchar[], varchar[])"),
        migrations.RunSQL(POOL_CHECK, _OLD.POOL_CHECK),
        migrations.RunSQL(TAGS_CHECK, _OLD.TAGS_CHECK),
        migrations.RunSQL(
            SHARED_READS,
            "DROP FUNCTION IF EXISTS limits_pool_shared(varchar);"
            " DROP FUNCTION IF EXISTS limits_tags_shared(varchar[]);",
        ),
        migrations.RunSQL(TRIGGER, DROP_TRIGGER),
    ]
