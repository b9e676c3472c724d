# The lean claim statement decides and charges a budget in one call (issue 12, item 1: the
# ten-queue budget point, where the claimers hardly wait for each other and the budget's price
# is its CPU per claim).
#
# The lean statement (queues.sql._lean_claim_sql) took a budget's verdict in a CTE of its own
# (admission_check, which calls admission_verdict), then, after the claim row was written,
# spent it in another (admission_charge over the verdict and the claimed row): two more
# materialised CTEs and InitPlans, three nested plpgsql calls, two reads (the policy, then its
# usage) and the verdict's jsonb built, extended with the shard and taken apart again by the
# charge. In that statement the claim is certain once the budget admits: its candidate is
# locked (FOR UPDATE) before the verdict, no other gate decides it (it names no pool, tag or
# rate limit, is no takeover and holds no grant), and the claim's UPDATE of a row this
# statement holds locked always writes it. So admission_admit decides and, when it admits,
# charges at once, in the same statement and transaction as the claim.
#
# Its common case, a budget with at most one window limit far from its limits, is one
# function: the shard as admission_check takes it, ONE read under it (the policy, its first
# window's hinted bounds and admission_usage, in one statement: a fresh snapshot taken after
# the shard, which is what migration 0007's proof needs), admission_verdict's arithmetic with
# the margin K (the same answers: stale, refused, tight, admitted), and the charge of the
# shard's counter row (0008's update, else insert). Everything else is admission_check's own
# path, charged through admission_charge: stacked windows and a policy cleared since the probe
# (admission_verdict, on the shard held), exact mode (all K shards, charged to shard 0), and
# any answer but "admitted" (the shard given back, nothing charged, the locked path decides).
# STRICT: a candidate no budget claims (a NULL policy key) is answered NULL without a call.
#
# The full statement, which may also ask the limits' gates after the budget, keeps
# admission_check then admission_charge once the claim is written (unchanged).
# tests/queues/test_lean_claim.py compares this verdict with admission_check's and the charges
# of both statements; tests/admission/test_shards.py races them near the limits.

from django.db import migrations

ADMIT = r"""
CREATE OR REPLACE FUNCTION admission_admit(p_policy uuid, p_todo uuid, p_windows jsonb)
RETURNS jsonb LANGUAGE plpgsql VOLATILE STRICT AS $$
DECLARE
    h integer := hashtext(p_policy::text);
    first_shard integer := pg_backend_pid() % 8;
    held integer;
    v jsonb;
    n integer;
    found_policy boolean;
    p_queue text;
    p_posture text;
    cap integer;
    lim integer;
    stacked boolean;
    w jsonb;
    ws timestamptz;
    resets timestamptz;
    flying integer;
    spent integer;
    tight boolean := false;
BEGIN
    BEGIN
        FOR i IN 0..7 LOOP
            IF pg_try_advisory_xact_lock(19550 + (first_shard + i) % 8, h) THEN
                held := (first_shard + i) % 8;
                EXIT;
            END IF;
        END LOOP;
        IF held IS NULL THEN
            held := first_shard;
            PERFORM pg_advisory_xact_lock(19550 + held, h);
        END IF;
        -- The one read under the shard (admission_verdict reads the same in two statements).
        SELECT true, p.queue, p.posture, p.max_in_flight, p.max_claims_per_window,
               p.extra_windows <> '[]'::jsonb, k.w, u.in_flight, u.used
        INTO found_policy, p_queue, p_posture, cap, lim, stacked, w, flying, spent
        FROM admission_admissionpolicy p
        CROSS JOIN LATERAL (
            SELECT CASE WHEN p.max_claims_per_window IS NOT NULL THEN p_windows -> format(
                '%s|%s|%s|%s', p.window_period, p.window_tz, p.window_start, p.window_weekday)
            END AS w
        ) k
        CROSS JOIN LATERAL admission_usage(
            p.endpoint_id, p.queue, p.id, (k.w ->> 'ws')::timestamptz, p_todo) u
        WHERE p.id = p_policy;
        IF found_policy IS NULL OR stacked THEN
            -- Cleared since the probe, or stacked windows: admission_check's fast mode.
            v := admission_verdict(p_policy, p_todo, p_windows, 8);
            IF (v ->> 'ok')::boolean THEN
                v := v || jsonb_build_object('shard', held);
                n := admission_charge(v);
                RETURN v;
            END IF;
        ELSE
            IF lim IS NOT NULL THEN
                IF w IS NULL THEN
                    v := '{"ok": false, "stale": true}';
                ELSE
                    ws := (w ->> 'ws')::timestamptz;
                    resets := (w ->> 'resets')::timestamptz;
                    IF clock_timestamp() < ws OR clock_timestamp() >= resets THEN
                        v := '{"ok": false, "stale": true}';
                    ELSIF spent + 1 > lim THEN
                        v := '{"ok": false}';
                    ELSE
                        tight := spent + 8 > lim;
                    END IF;
                END IF;
            ELSE
                spent := NULL;
            END IF;
            IF v IS NULL AND cap IS NOT NULL THEN
                IF flying + 1 > cap THEN
                    v := '{"ok": false}';
                ELSE
                    tight := tight OR flying + 8 > cap;
                END IF;
            END IF;
            IF v IS NULL AND tight THEN
                v := '{"ok": false, "tight": true}';
            END IF;
            IF v IS NULL THEN
                -- Admitted: the counter row of the shard held (migration 0008's charge).
                IF ws IS NOT NULL THEN
                    UPDATE admission_admissionwindow
                    SET used = used + 1, claims_limit = lim, updated_at = now()
                    WHERE policy_id = p_policy AND window_key = '' AND window_start = ws
                      AND shard = held;
                    IF NOT FOUND THEN
                        INSERT INTO admission_admissionwindow AS aw
                            (policy_id, window_key, window_start, shard, used, refused,
                             claims_limit, updated_at)
                        VALUES (p_policy, '', ws, held, 1, 0, lim, now())
                        ON CONFLICT (policy_id, window_key, window_start, shard)
                        DO UPDATE SET used = aw.used + 1, claims_limit = EXCLUDED.claims_limit,
                                      updated_at = now();
                    END IF;
                END IF;
                RETURN jsonb_build_object(
                    'ok', true, 'policy', p_policy, 'queue', p_queue, 'posture', p_posture,
                    'max_in_flight', cap, 'in_flight', flying,
                    'max_claims_per_window', lim, 'used', spent,
                    'window_start', ws, 'window_resets_at', resets, 'more', '[]'::jsonb,
                    'shard', held);
            END IF;
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'SBA01';  -- give the shard back
    EXCEPTION WHEN SQLSTATE 'SBA01' THEN
        NULL;
    END;
    IF NOT coalesce((v ->> 'tight')::boolean, false) THEN
        RETURN v;
    END IF;
    -- Exact mode, as admission_check: all K shards in ascending order, room for one claim.
    BEGIN
        PERFORM admission_shards_lock(p_policy);
        v := admission_verdict(p_policy, p_todo, p_windows, 1);
        IF (v ->> 'ok')::boolean THEN
            v := v || jsonb_build_object('shard', 0);
            n := admission_charge(v);
            RETURN v;
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'SBA01';
    EXCEPTION WHEN SQLSTATE 'SBA01' THEN
        RETURN v;
    END;
END
$$;
"""


class Migration(migrations.Migration):

    dependencies = [
        ('admission', '0009_windows_by_definition'),
    ]

    operations = [
        migrations.RunSQL(
            ADMIT, "DROP FUNCTION IF EXISTS admission_admit(uuid, uuid, jsonb)"
        ),
    ]
