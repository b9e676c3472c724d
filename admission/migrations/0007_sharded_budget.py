# A budget with no serial section (issue 12, item 1). Until 0006 every budgeted claim locked its
# policy row FOR UPDATE inside the claim statement and upserted the window's one counter row; both
# were held through the rest of the statement and its commit, so the claims of one budget ran one
# at a time (on two cores with many claimers the holder was often descheduled holding them).
#
# The budget's lock is now K = 8 shard locks: transaction-scoped advisory locks
# (19550 + shard, hashtext(policy id)) (admission.models.SHARD_LOCK_CLASS, WINDOW_SHARDS; a hash
# collision between two policies only makes them wait for each other more, never admits more).
# Each window's counter is K rows (admission_admissionwindow.shard); a window's count is their sum.
#
# admission_check (v4), called by the claim statement for a budgeted candidate:
# - Fast mode: take ONE shard, trying them from pg_backend_pid() % K round with
#   pg_try_advisory_xact_lock; when all K are held, wait on one holding none. Then, in statements
#   of their own (fresh snapshots), read the policy (no row lock) and the usage, and admit when
#   in_flight + K <= max_in_flight and used + K <= limit for every window. The claim charges the
#   counter row of the shard it holds, so no two claimers write one row at once.
# - Exact mode (the read under the shard leaves less than K of room under some limit, but 1):
#   give the shard back, take all K in ascending order (holding none before), read again and admit
#   when in_flight + 1 <= max_in_flight and used + 1 <= limit: the arithmetic of 0006. Charged to
#   shard 0.
# - Anything else (a limit reached, paused, the window bounds stale, a policy cleared) answers as
#   0006 did, holding no shard, and the locked path (engine.lock_policy: the policy row FOR
#   UPDATE, then all K shards) refuses, waives or admits as before.
# A shard is given back by taking it inside a PL/pgSQL block with an exception handler (a
# subtransaction): raising the private SQLSTATE 'SBA01' rolls the block back, and PostgreSQL
# releases the locks a rolled-back subtransaction took. No write happens inside it, so it gets no
# transaction id of its own.
#
# Why fast mode is exact. Every admitted claim holds a shard (fast: one; exact and the locked
# path: all K) from before its usage read until its commit, and a committed claim is visible to
# any snapshot taken after its locks are released (PostgreSQL makes a transaction visible before
# it releases its locks). Take the admitted claims of one window (or the claims in flight at one
# instant) and among them the claim X whose usage read came last. Every other claim Y of them
# read earlier, so at X's read Y had either committed (then X's read counts it) or still held
# its shard; X holds a shard too, so at most K - 1 such Y were in progress, each on a distinct
# shard (an exact-mode Y holding all K cannot overlap X at all). Hence the total <= X's read +
# (K - 1) + 1 = X's read + K <= the limit (fast X), or X's read + 1 <= the limit (exact X: no
# other claim in progress). A policy change, the locked path and anything else that must
# serialise with claims takes the policy row lock and then all K shards (lock order: policy row ->
# shards -> pool/tags -> rate -> ledger; a claim never waits for a shard while holding one,
# except in ascending order holding a prefix, so no cycle is possible), so the policy a claim
# reads under its shard is in force until it commits.
#
# K = 8: at least the claimers a hot queue runs at once on this kind of machine (the bench's 8),
# so fast claimers rarely find every shard taken; larger costs a margin of K claims of each limit
# before exact mode and K counter rows per window.

import importlib

from django.db import migrations, models

SHARDS_LOCK = r"""
CREATE OR REPLACE FUNCTION admission_shards_lock(p_policy uuid) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    h integer := hashtext(p_policy::text);
BEGIN
    -- All K shards, in ascending order: exact mode, the locked path, policy writes.
    FOR s IN 0..7 LOOP
        PERFORM pg_advisory_xact_lock(19550 + s, h);
    END LOOP;
END
$$;
"""

USAGE = r"""
CREATE OR REPLACE FUNCTION admission_usage(
    p_endpoint uuid, p_queue text, p_policy uuid, p_window_start timestamptz, p_exclude uuid
) RETURNS TABLE (in_flight integer, earliest_lease timestamptz, used integer)
LANGUAGE sql STABLE AS $$
    SELECT f.n, f.earliest,
           -- admission_window_key: the first window's counter, summed over its shard rows
           coalesce((SELECT sum(w.used)::integer FROM admission_admissionwindow w
                     WHERE w.policy_id = p_policy AND w.window_key = ''
                       AND w.window_start = p_window_start), 0)
    FROM (
        -- todo_claimed_idx
        SELECT count(*)::integer AS n, min(t.lease_expires_at) AS earliest FROM queues_todo t
        WHERE t.endpoint_id = p_endpoint AND t.queue = p_queue AND t.state = 'claimed'
          AND t.id IS DISTINCT FROM p_exclude
    ) f
$$;
"""

WINDOWS_USED = r"""
CREATE OR REPLACE FUNCTION admission_windows_used(
    p_policy uuid, p_keys text[], p_starts timestamptz[]
) RETURNS integer[] LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(coalesce((
        -- admission_window_key: each window's counter, summed over its shard rows
        SELECT sum(w.used)::integer FROM admission_admissionwindow w
        WHERE w.policy_id = p_policy AND w.window_key = k.key AND w.window_start = k.ws
    ), 0) ORDER BY k.n), '{}')
    FROM unnest(p_keys, p_starts) WITH ORDINALITY AS k(key, ws, n)
$$;
"""

# The reads and the arithmetic of 0006's admission_check pass, with the room a claim needs under
# every limit (p_margin: K in fast mode, 1 in exact mode). Takes no lock. Answers
# {"ok": true, ...verdict}, {"ok": false} (a limit reached), {"ok": false, "stale": true}, or
# {"ok": false, "tight": true} (room for one claim, not for p_margin).
VERDICT = r"""
CREATE OR REPLACE FUNCTION admission_verdict(
    p_policy uuid, p_todo uuid, p_windows jsonb, p_margin integer
) RETURNS jsonb LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    p admission_admissionpolicy%ROWTYPE;
    w jsonb;
    ws timestamptz;
    resets timestamptz;
    spent integer;
    flying integer;
    tight boolean := false;
    more jsonb := '[]'::jsonb;
    x jsonb;
    k text;
    e jsonb;
    x_ws timestamptz;
    x_resets timestamptz;
    x_used integer;
    x_limit integer;
BEGIN
    SELECT * INTO p FROM admission_admissionpolicy WHERE id = p_policy;
    IF NOT FOUND THEN
        -- Cleared since the probe: nothing limits the claim, nothing to charge.
        RETURN jsonb_build_object('ok', true);
    END IF;
    IF p.max_claims_per_window IS NOT NULL THEN
        w := p_windows -> (p_policy::text);
        IF w IS NULL OR w ->> 'cfg' IS DISTINCT FROM format('%s|%s|%s|%s', p.window_period,
                p.window_tz, p.window_start, p.window_weekday) THEN
            RETURN jsonb_build_object('ok', false, 'stale', true);
        END IF;
        ws := (w ->> 'ws')::timestamptz;
        resets := (w ->> 'resets')::timestamptz;
        IF clock_timestamp() < ws OR clock_timestamp() >= resets THEN
            RETURN jsonb_build_object('ok', false, 'stale', true);
        END IF;
    END IF;
    SELECT u.in_flight, CASE WHEN ws IS NULL THEN NULL ELSE u.used END INTO flying, spent
    FROM admission_usage(p.endpoint_id, p.queue, p.id, ws, p_todo) u;
    IF p.max_claims_per_window IS NOT NULL THEN
        IF spent + 1 > p.max_claims_per_window THEN
            RETURN jsonb_build_object('ok', false);
        END IF;
        tight := spent + p_margin > p.max_claims_per_window;
    END IF;
    IF p.max_in_flight IS NOT NULL THEN
        IF flying + 1 > p.max_in_flight THEN
            RETURN jsonb_build_object('ok', false);
        END IF;
        tight := tight OR flying + p_margin > p.max_in_flight;
    END IF;
    -- Stacked windows: each against its own counter, its bounds hinted under 'more'.
    IF p.extra_windows <> '[]'::jsonb THEN
        FOR x IN SELECT value FROM jsonb_array_elements(p.extra_windows) LOOP
            k := format('%s|%s|%s|%s', x ->> 'period', x ->> 'tz', x ->> 'start',
                        x ->> 'weekday');
            e := w -> 'more' -> k;
            IF e IS NULL THEN
                RETURN jsonb_build_object('ok', false, 'stale', true);
            END IF;
            x_ws := (e ->> 'ws')::timestamptz;
            x_resets := (e ->> 'resets')::timestamptz;
            IF clock_timestamp() < x_ws OR clock_timestamp() >= x_resets THEN
                RETURN jsonb_build_object('ok', false, 'stale', true);
            END IF;
            x_used := (admission_windows_used(p.id, ARRAY[k], ARRAY[x_ws]))[1];
            x_limit := (x ->> 'limit')::integer;
            IF x_used + 1 > x_limit THEN
                RETURN jsonb_build_object('ok', false);
            END IF;
            tight := tight OR x_used + p_margin > x_limit;
            more := more || jsonb_build_array(jsonb_build_object(
                'key', k, 'limit', x_limit, 'used', x_used,
                'window_start', x_ws, 'window_resets_at', x_resets));
        END LOOP;
    END IF;
    IF tight THEN
        RETURN jsonb_build_object('ok', false, 'tight', true);
    END IF;
    RETURN jsonb_build_object(
        'ok', true, 'policy', p.id, 'queue', p.queue, 'posture', p.posture,
        'max_in_flight', p.max_in_flight, 'in_flight', flying,
        'max_claims_per_window', p.max_claims_per_window, 'used', spent,
        'window_start', ws, 'window_resets_at', resets, 'more', more);
END
$$;
"""

CHECK = r"""
CREATE OR REPLACE FUNCTION admission_check(p_policy uuid, p_todo uuid, p_windows jsonb)
RETURNS jsonb LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    h integer := hashtext(p_policy::text);
    first_shard integer := pg_backend_pid() % 8;
    shard integer;
    v jsonb;
BEGIN
    -- Fast mode: one shard, K of room under every limit (the migration's header says why).
    BEGIN
        FOR i IN 0..7 LOOP
            IF pg_try_advisory_xact_lock(19550 + (first_shard + i) % 8, h) THEN
                shard := (first_shard + i) % 8;
                EXIT;
            END IF;
        END LOOP;
        IF shard IS NULL THEN
            -- Every shard is held: wait for one, holding none.
            shard := first_shard;
            PERFORM pg_advisory_xact_lock(19550 + shard, h);
        END IF;
        v := admission_verdict(p_policy, p_todo, p_windows, 8);
        IF (v ->> 'ok')::boolean THEN
            -- Leaving the block keeps the shard until the transaction ends.
            RETURN v || jsonb_build_object('shard', shard);
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'SBA01';  -- give the shard back
    EXCEPTION WHEN SQLSTATE 'SBA01' THEN
        NULL;
    END;
    IF NOT coalesce((v ->> 'tight')::boolean, false) THEN
        RETURN v;  -- refused or stale: the locked path decides, holding no shard now
    END IF;
    -- Exact mode: all K shards in ascending order (none held before), room for one claim.
    BEGIN
        PERFORM admission_shards_lock(p_policy);
        v := admission_verdict(p_policy, p_todo, p_windows, 1);
        IF (v ->> 'ok')::boolean THEN
            RETURN v || jsonb_build_object('shard', 0);
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'SBA01';  -- give the shards back
    EXCEPTION WHEN SQLSTATE 'SBA01' THEN
        RETURN v;
    END;
END
$$;
"""

CHARGE = r"""
CREATE OR REPLACE FUNCTION admission_charge(v jsonb) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    x jsonb;
    s smallint := coalesce((v ->> 'shard')::smallint, 0);
BEGIN
    IF v ->> 'window_start' IS NULL THEN
        RETURN 0;  -- no window limit (stacked windows come after a first one)
    END IF;
    -- The counter rows of the shard the claim holds: no other claimer writes them meanwhile.
    INSERT INTO admission_admissionwindow
        (policy_id, window_key, window_start, shard, used, refused, claims_limit, updated_at)
    VALUES ((v ->> 'policy')::uuid, '', (v ->> 'window_start')::timestamptz, s, 1, 0,
            (v ->> 'max_claims_per_window')::integer, now())
    ON CONFLICT (policy_id, window_key, window_start, shard)
    DO UPDATE SET used = admission_admissionwindow.used + 1,
                  claims_limit = EXCLUDED.claims_limit, updated_at = now();
    IF v -> 'more' IS NOT NULL AND v -> 'more' <> '[]'::jsonb THEN
        FOR x IN SELECT value FROM jsonb_array_elements(v -> 'more') LOOP
            INSERT INTO admission_admissionwindow
                (policy_id, window_key, window_start, shard, used, refused, claims_limit,
                 updated_at)
            VALUES ((v ->> 'policy')::uuid, x ->> 'key', (x ->> 'window_start')::timestamptz,
                    s, 1, 0, (x ->> 'limit')::integer, now())
            ON CONFLICT (policy_id, window_key, window_start, shard)
            DO UPDATE SET used = admission_admissionwindow.used + 1,
                          claims_limit = EXCLUDED.claims_limit, updated_at = now();
        END LOOP;
    END IF;
    RETURN 1;
END
$$;
"""

# Back to 0006 (one row per window): each window's lowest shard row becomes its shard 0 row with
# the sums, the others are deleted. One update per row and no insert: an insert, or a second
# update of a row this transaction wrote, queues a deferred foreign key check, and PostgreSQL
# refuses the ALTER TABLE that follows in the same transaction while one is pending.
MERGE_SHARDS = r"""
UPDATE admission_admissionwindow w
SET shard = 0, used = s.used, refused = s.refused, claims_limit = s.lim, updated_at = s.at
FROM (
    SELECT policy_id, window_key, window_start, min(shard) AS keep, sum(used)::integer AS used,
           sum(refused)::integer AS refused,
           (array_agg(claims_limit ORDER BY updated_at DESC))[1] AS lim, max(updated_at) AS at
    FROM admission_admissionwindow GROUP BY policy_id, window_key, window_start
) s
WHERE w.policy_id = s.policy_id AND w.window_key = s.window_key
  AND w.window_start = s.window_start AND w.shard = s.keep;
DELETE FROM admission_admissionwindow WHERE shard <> 0;
"""

_0006 = importlib.import_module("admission.migrations.0006_stacked_windows")


class Migration(migrations.Migration):

    dependencies = [
        ('admission', '0006_stacked_windows'),
    ]

    operations = [
        migrations.AddField(
            model_name='admissionwindow',
            name='shard',
            # NOT NULL DEFAULT 0 in the database too: a counter written by SQL elsewhere (the
            # locked path, refusals) without naming a shard is shard 0's.
            field=models.SmallIntegerField(db_default=0, default=0),
        ),
        migrations.RemoveConstraint(
            model_name='admissionwindow',
            name='admission_window_key',
        ),
        migrations.AddConstraint(
            model_name='admissionwindow',
            constraint=models.UniqueConstraint(
                fields=('policy', 'window_key', 'window_start', 'shard'),
                name='admission_window_key',
            ),
        ),
        migrations.AddConstraint(
            model_name='admissionwindow',
            constraint=models.CheckConstraint(
                condition=models.Q(('shard__gte', 0), ('shard__lt', 8)),
                name='window_shard_range',
            ),
        ),
        # Reversed after the functions and before the old unique key comes back.
        migrations.RunSQL(migrations.RunSQL.noop, MERGE_SHARDS),
        migrations.RunSQL(SHARDS_LOCK, "DROP FUNCTION IF EXISTS admission_shards_lock(uuid)"),
        migrations.RunSQL(USAGE, _0006.USAGE),
        migrations.RunSQL(WINDOWS_USED, _0006.WINDOWS_USED),
        migrations.RunSQL(
            VERDICT, "DROP FUNCTION IF EXISTS admission_verdict(uuid, uuid, jsonb, integer)"
        ),
        migrations.RunSQL(CHECK, _0006.CHECK),
        migrations.RunSQL(CHARGE, _0006.CHARGE),
    ]
