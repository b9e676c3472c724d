# The pool and tag checks of a named claim, and the reopen rings of its ending, in fewer SQL
# statements (issue 13). Same decisions, same verdicts, same grant items byte for byte, same
# locks in the same order and modes (admission/limits/gates.py has the argument; nothing in it
# changes).
#
# A profile of named claim+complete cycles (claim_profile --named --history --functions) put
# limits_tags_check at ~300 us, limits_pool_check ~130 us and the ending's reopen rings ~350 us
# (with limits_pool_shared, limits_tags_shared and limits_lock under them) of the backend's
# ~2,650 us of CPU per cycle. Each SQL statement a PL/pgSQL function runs starts and ends an
# executor; the checks ran 6 (pool) and 10 (two tags) statements, the ending 9 in 5 calls:
#
# - a check's unlocked guess (which lock mode) reads the limit and counts its occupancy in one
#   statement (the count only where the guess needs it, as before);
# - the locks and set_config are PL/pgSQL expressions (an assignment), not PERFORM statements;
# - after the locks, the limit and its occupancy are read in one statement, so by one snapshot
#   taken after every lock (before: one statement each, each after the locks): the limit cannot
#   change while the lock is held (every change takes it exclusive), and the count sees every
#   claim committed before the statement, which is what the argument needs;
# - the reopen rings (limits_pool_reopens, limits_tags_reopens of migration 0006: STABLE SQL
#   functions over limits_pool_shared / limits_tags_shared, a DISTINCT over a join) are one
#   PL/pgSQL function each: the shared locks (the tags' each key once, in key order, as
#   limits_lock(class, tags, tags) took them), then the limits at their caps and their
#   occupancy in one statement after them, then the waiting identities only for a limit at its
#   cap. The occupancy is now read after the lock too (before: on the ending statement's
#   snapshot, taken before the lock), so a claim that filled the limit while the ending waited
#   for the lock is counted and its ring is not lost (tests/limits/test_lean_named_cycle.py
#   fails on 0006); a claim ending meanwhile can only make a ring spare, never miss one.
#   limits_pool_shared and limits_tags_shared are read by nothing else: dropped.
# - limits_tags_check and limits_tags_reopens plan their statements once
#   (plan_cache_mode = force_generic_plan): with a tag array as parameter PostgreSQL judged the
#   generic plans dearer than custom ones and planned the statements again on every call
#   (limits_tags_check with merged statements: ~620 us per call planning each time, ~180 us
#   with its plans kept).

import importlib

from django.db import migrations

_0005 = importlib.import_module("admission.limits.migrations.0005_headroom_locks")
_0006 = importlib.import_module("admission.limits.migrations.0006_reopen_functions")

POOL_CHECK = r"""
CREATE OR REPLACE FUNCTION limits_pool_check(p_pool varchar, p_todo uuid)
RETURNS jsonb LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    l_slots integer;
    l_posture varchar;
    l_held bigint;
    l_bound integer := limits_headroom_bound();
    l_shared boolean;
    l_void text;
BEGIN
    -- Which lock, read without one: shared when the pool is off, or far enough from its cap,
    -- and this transaction has claimed no other todo under a shared lock.
    IF coalesce(current_setting('switchboard.headroom_todo', true), '') IN ('', p_todo::text) THEN
        SELECT CASE WHEN p.posture = 'off' THEN true
                    WHEN p.slots > l_bound THEN
                        (SELECT count(*) FROM queues_todo t
                         WHERE t.state = 'claimed' AND t.pool = p_pool
                           AND t.id IS DISTINCT FROM p_todo) + l_bound < p.slots
                    ELSE false END
        INTO l_shared FROM limits_pool p WHERE p.name = p_pool;
    END IF;
    IF coalesce(l_shared, false) THEN
        l_void := pg_advisory_xact_lock_shared(19536, hashtext(p_pool));
    ELSE
        l_void := pg_advisory_xact_lock(19536, hashtext(p_pool));
    END IF;
    -- After the lock: the pool and its occupancy, one snapshot.
    SELECT p.slots, p.posture,
           CASE WHEN p.posture <> 'off' THEN
               (SELECT count(*) FROM queues_todo t
                WHERE t.state = 'claimed' AND t.pool = p_pool AND t.id IS DISTINCT FROM p_todo)
           END
    INTO l_slots, l_posture, l_held FROM limits_pool p WHERE p.name = p_pool;
    IF NOT FOUND THEN
        RETURN '{"ok": false}'::jsonb;
    END IF;
    IF l_posture = 'off' THEN
        RETURN '{"ok": true}'::jsonb;
    END IF;
    IF coalesce(l_shared, false) THEN
        IF l_held + l_bound >= l_slots THEN
            RETURN '{"ok": false, "stale": true}'::jsonb;
        END IF;
        l_void := set_config('switchboard.headroom_todo', p_todo::text, true);
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
RETURNS jsonb LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    l record;
    l_items text[] := ARRAY[]::text[];
    l_bound integer := limits_headroom_bound();
    l_may boolean;
    l_key integer;
    l_key_shared boolean;
    l_shared varchar[] := ARRAY[]::varchar[];
    l_headroom boolean := false;
    l_void text;
BEGIN
    l_may := coalesce(current_setting('switchboard.headroom_todo', true), '') IN ('', p_todo::text);
    -- Each tag's lock in key order, its mode chosen from the tag read without a lock (see
    -- limits_pool_check; a tag with no declaration has nothing to decide: shared). Tags whose
    -- keys collide share the first one's lock and mode, and are decided by that mode.
    FOR l IN SELECT n.tag, hashtext(n.tag) AS key,
                    CASE WHEN NOT l_may THEN false
                         WHEN g.posture IS NULL OR g.posture = 'off' THEN true
                         WHEN g."limit" > l_bound THEN
                             (SELECT count(*) FROM queues_todo t
                              WHERE t.state = 'claimed' AND t.tags <> '{}'
                                AND t.tags @> ARRAY[n.tag] AND t.id IS DISTINCT FROM p_todo)
                             + l_bound < g."limit"
                         ELSE false END AS shared
             FROM (SELECT DISTINCT unnest(p_tags) AS tag) n
             LEFT JOIN limits_taglimit g ON g.tag = n.tag
             ORDER BY 2, 1 LOOP
        IF l_key IS DISTINCT FROM l.key THEN
            l_key := l.key;
            l_key_shared := l.shared;
            IF l_key_shared THEN
                l_void := pg_advisory_xact_lock_shared(19540, l.key);
            ELSE
                l_void := pg_advisory_xact_lock(19540, l.key);
            END IF;
        END IF;
        IF l_key_shared THEN
            l_shared := l_shared || l.tag;
        END IF;
    END LOOP;
    -- After every lock: the limits and their occupancy, one snapshot.
    FOR l IN SELECT g.tag, g."limit", g.posture,
                    (SELECT count(*) FROM queues_todo t
                     WHERE t.state = 'claimed' AND t.tags <> '{}' AND t.tags @> ARRAY[g.tag]
                       AND t.id IS DISTINCT FROM p_todo) AS held
             FROM limits_taglimit g
             WHERE g.tag = ANY(p_tags) AND g.posture <> 'off' ORDER BY g.tag LOOP
        IF l.tag = ANY(l_shared) THEN
            IF l.held + l_bound >= l."limit" THEN
                RETURN '{"ok": false, "stale": true}'::jsonb;
            END IF;
            l_headroom := true;
        ELSIF l.held >= l."limit" THEN
            RETURN '{"ok": false}'::jsonb;
        END IF;
        l_items := l_items || ('{"held":' || l.held || ',"kind":"tag","limit":' || l."limit"
            || ',"name":"' || l.tag || '","posture":"' || l.posture || '"}');
    END LOOP;
    IF l_headroom THEN
        l_void := set_config('switchboard.headroom_todo', p_todo::text, true);
    END IF;
    IF cardinality(l_items) = 0 THEN
        RETURN '{"ok": true}'::jsonb;
    END IF;
    RETURN jsonb_build_object('ok', true, 'grant', array_to_string(l_items, ','));
END;
$$;
"""

# Read by nothing once the reopens take their own locks (above).
DROP_SHARED_READS = """
DROP FUNCTION IF EXISTS limits_pool_shared(varchar);
DROP FUNCTION IF EXISTS limits_tags_shared(varchar[]);
"""

REOPENS = r"""
CREATE OR REPLACE FUNCTION limits_pool_reopens(p_pool varchar, p_todo uuid)
RETURNS text[] LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    l_at_cap boolean;
    l_void text;
BEGIN
    l_void := pg_advisory_xact_lock_shared(19536, hashtext(p_pool));
    -- After the lock: the pool and its occupancy without this claim, one snapshot.
    SELECT p.posture = 'enforce'
           AND p.slots = 1 + (SELECT count(*) FROM queues_todo o
                              WHERE o.state = 'claimed' AND o.pool = p.name
                                AND o.id IS DISTINCT FROM p_todo)
    INTO l_at_cap FROM limits_pool p WHERE p.name = p_pool;
    IF NOT coalesce(l_at_cap, false) THEN
        RETURN '{}'::text[];
    END IF;
    RETURN ARRAY(SELECT DISTINCT w.endpoint_id::text || ':' || w.queue FROM queues_todo w
                 WHERE w.state = 'pending' AND w.pool = p_pool);
END;
$$;

CREATE OR REPLACE FUNCTION limits_tags_reopens(p_tags varchar[], p_todo uuid)
RETURNS text[] LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    l_key integer;
    l_full varchar[];
    l_void text;
BEGIN
    -- Each key once, in key order, shared (limits_lock(19540, p_tags, p_tags)).
    FOR l_key IN SELECT DISTINCT hashtext(n) FROM unnest(p_tags) n WHERE n IS NOT NULL
                 ORDER BY 1 LOOP
        l_void := pg_advisory_xact_lock_shared(19540, l_key);
    END LOOP;
    -- After the locks: the tags at their caps counting this claim, one snapshot.
    SELECT array_agg(g.tag) INTO l_full FROM limits_taglimit g
    WHERE g.tag = ANY(p_tags) AND g.posture = 'enforce'
      AND g."limit" = 1 + (SELECT count(*) FROM queues_todo o
                           WHERE o.state = 'claimed' AND o.tags <> '{}'
                             AND o.tags @> ARRAY[g.tag] AND o.id IS DISTINCT FROM p_todo);
    IF l_full IS NULL THEN
        RETURN '{}'::text[];
    END IF;
    RETURN ARRAY(SELECT DISTINCT w.endpoint_id::text || ':' || w.queue FROM queues_todo w
                 WHERE w.state = 'pending' AND w.tags <> '{}' AND w.tags && l_full);
END;
$$;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("limits", "0006_reopen_functions"),
    ]

    operations = [
        migrations.RunSQL(POOL_CHECK, _0005.POOL_CHECK),
        migrations.RunSQL(TAGS_CHECK, _0005.TAGS_CHECK),
        migrations.RunSQL(REOPENS, _0006.FUNCTIONS),
        # After the reopens: on the way back 0006's SQL functions need them (their bodies are
        # checked when they are made), so they are made again first.
        migrations.RunSQL(DROP_SHARED_READS, _0005.SHARED_READS),
    ]
