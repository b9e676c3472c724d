# The budget's decision inside the claiming statement (issue 12). The claim statement calls
# admission_check(policy, todo, windows) for a candidate its probe found budgeted: it locks the
# policy row, then, in statements of its own (a VOLATILE function's statements each take a fresh
# snapshot under READ COMMITTED, so they see every claim committed by the transactions the lock
# waited for), counts in-flight and reads the window counter, and answers a verdict. After the
# todo row is written, admission_charge(verdict) spends the unit. One statement in autocommit:
# the policy lock is held for the rest of that statement and its commit, never across a client
# round trip.
#
# The window bounds come from Python (zoneinfo over the tzdata package, as everywhere else), in
# ``windows``: {policy id: {"cfg", "ws", "resets"}}; a verdict is "stale" (take the locked path)
# when the policy's window definition differs from "cfg" or the clock has left [ws, resets).
# Anything but a claim under every limit ("limit": over a limit, paused, advise, off) answers
# ok = false and the claim takes the locked path, which refuses, waives or admits as before.

from django.db import migrations

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
    -- on the lock of a budget it cannot be admitted to (spent counters only grow within a
    -- window). Pass 2 decides under the lock, each read a statement of its own.
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
            SELECT aw.used INTO spent FROM admission_admissionwindow aw
            WHERE aw.policy_id = p.id AND aw.window_start = ws;
            spent := coalesce(spent, 0);
            IF spent >= p.max_claims_per_window THEN
                RETURN jsonb_build_object('ok', false);
            END IF;
        END IF;
        IF p.max_in_flight IS NOT NULL OR pass = 2 THEN
            SELECT count(*) INTO flying FROM queues_todo t
            WHERE t.endpoint_id = p.endpoint_id AND t.queue = p.queue AND t.state = 'claimed'
              AND t.id <> p_todo;
            IF p.max_in_flight IS NOT NULL AND flying >= p.max_in_flight THEN
                RETURN jsonb_build_object('ok', false);
            END IF;
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

CHARGE = r"""
CREATE OR REPLACE FUNCTION admission_charge(v jsonb) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF v ->> 'window_start' IS NULL THEN
        RETURN 0;
    END IF;
    INSERT INTO admission_admissionwindow
        (policy_id, window_start, used, refused, claims_limit, updated_at)
    VALUES ((v ->> 'policy')::uuid, (v ->> 'window_start')::timestamptz, 1, 0,
            (v ->> 'max_claims_per_window')::integer, now())
    ON CONFLICT (policy_id, window_start)
    DO UPDATE SET used = admission_admissionwindow.used + 1,
                  claims_limit = EXCLUDED.claims_limit, updated_at = now();
    RETURN 1;
END
$$;
"""


class Migration(migrations.Migration):

    dependencies = [
        ('admission', '0003_ledger_moves_to_its_own_app'),
        ('queues', '0001_initial'),
    ]

    operations = [
        migrations.RunSQL(CHECK, "DROP FUNCTION IF EXISTS admission_check(uuid, uuid, jsonb)"),
        migrations.RunSQL(CHARGE, "DROP FUNCTION IF EXISTS admission_charge(jsonb)"),
    ]
