# One usage query (issues 10 and 12): a queue identity's in-flight count (excluding a takeover of
# one todo), its earliest lease and one window's counter of its policy, computed by the function
# admission_usage and nowhere else. The claim reads it under the policy lock (inside
# admission_check on the fast path, in engine.decide on the locked path), and every read surface
# (status, reopen, the budget preview, the board, /metrics) through
# admission.selectors.evaluate_policies. A plain SQL function, so the planner inlines it into the
# statement that calls it: that statement's snapshot is the one it reads with.

import importlib

from django.db import migrations

USAGE = r"""
CREATE OR REPLACE FUNCTION admission_usage(
    p_endpoint uuid, p_queue text, p_policy uuid, p_window_start timestamptz, p_exclude uuid
) RETURNS TABLE (in_flight integer, earliest_lease timestamptz, used integer)
LANGUAGE sql STABLE AS $$
    SELECT f.n, f.earliest,
           -- admission_window_key
           coalesce((SELECT w.used FROM admission_admissionwindow w
                     WHERE w.policy_id = p_policy AND w.window_start = p_window_start), 0)
    FROM (
        -- todo_claimed_idx
        SELECT count(*)::integer AS n, min(t.lease_expires_at) AS earliest FROM queues_todo t
        WHERE t.endpoint_id = p_endpoint AND t.queue = p_queue AND t.state = 'claimed'
          AND t.id IS DISTINCT FROM p_exclude
    ) f
$$;
"""

# admission_check of migration 0004, its usage read through admission_usage.
CHECK = r"""
CREATE OR REPLACE FUNCTION admission_check(p_policy uuid, p_todo uuid, p_windows jsonb)
RETURNS jsonb LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    p admission_admissionpolicy%ROWTYPE;
    w jsonb;
    ws timestamptz;
    resets timestamptz;
    spent integer;
    flying integer;
    pass integer;
BEGIN
    -- Pass 1 reads without the lock, as the locked path's pre-read does: a claimer never waits
    -- on the lock of a budget it cannot be admitted to. Pass 2 decides under the lock, its usage
    -- read in a statement of its own (a fresh snapshot: it sees every claim committed by the
    -- transactions the lock waited for).
    FOR pass IN 1..2 LOOP
        IF pass = 1 THEN
            SELECT * INTO p FROM admission_admissionpolicy WHERE id = p_policy;
        ELSE
            SELECT * INTO p FROM admission_admissionpolicy WHERE id = p_policy FOR UPDATE;
        END IF;
        IF NOT FOUND THEN
            -- Cleared since the probe: nothing limits the claim, nothing to charge.
            RETURN jsonb_build_object('ok', true);
        END IF;
        ws := NULL;
        resets := NULL;
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
        IF p.max_claims_per_window IS NOT NULL AND spent >= p.max_claims_per_window THEN
            RETURN jsonb_build_object('ok', false);
        END IF;
        IF p.max_in_flight IS NOT NULL AND flying >= p.max_in_flight THEN
            RETURN jsonb_build_object('ok', false);
        END IF;
    END LOOP;
    RETURN jsonb_build_object(
        'ok', true, 'policy', p.id, 'queue', p.queue, 'posture', p.posture,
        'max_in_flight', p.max_in_flight, 'in_flight', flying,
        'max_claims_per_window', p.max_claims_per_window, 'used', spent,
        'window_start', ws, 'window_resets_at', resets);
END
$$;
"""

PREVIOUS_CHECK = importlib.import_module("admission.migrations.0004_fast_admit").CHECK


class Migration(migrations.Migration):

    dependencies = [
        ('admission', '0004_fast_admit'),
    ]

    operations = [
        migrations.RunSQL(USAGE, "DROP FUNCTION IF EXISTS admission_usage(uuid, text, uuid, timestamptz, uuid)"),
        migrations.RunSQL(CHECK, PREVIOUS_CHECK),
    ]
