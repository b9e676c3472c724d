# The fast verdict's window bounds keyed by window definition (issue 12, item 1: the ten-queue
# budget point, where the claimers hardly wait for each other and the budget's price is its CPU
# per claim).
#
# The hint admission_check reads (admission.gate.fast_params: each window's current bounds,
# computed in Python) was a JSON object keyed by policy id, each entry repeating its window
# definition ('cfg') and its stacked windows' bounds ('more'): ten budgets of one endpoint made
# some 1.5 kB that the claim statement parsed into jsonb on every claim (~18 us of backend CPU in
# a loop of casts) and the client sent. It is now keyed by the window definition itself,
# formatted as before ('period|tz|start|weekday', NULL as empty: admission.policy.Window.key),
# one entry per definition whichever policies and stacked windows use it:
# {"day|UTC|00:00|": {"ws": ..., "resets": ...}}. admission_verdict looks its first window and
# each stacked window up by its own definition, so bounds computed for another definition are
# never used (what the 'cfg' comparison checked); a definition missing from the hint, or bounds
# the clock has left, answer "stale" as before (the locked path decides that claim). A hint in
# the old shape (a process not yet restarted) finds no definition and answers "stale": slower,
# never wrong.
#
# Only the lookups change: same reads, arithmetic, answers and locks (admission_check, which
# calls this, is unchanged). Reading the policy and its usage in one statement instead of two
# was tried and measured no cheaper (a lateral join over admission_usage: 90 against 83 us per
# call, autocommitted calls alternating in blocks).

import importlib

from django.db import migrations

_0007 = importlib.import_module("admission.migrations.0007_sharded_budget")

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
        w := p_windows -> format('%s|%s|%s|%s', p.window_period,
                p.window_tz, p.window_start, p.window_weekday);
        IF w IS NULL THEN
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
    -- Stacked windows: each against its own counter, its bounds under its own definition.
    IF p.extra_windows <> '[]'::jsonb THEN
        FOR x IN SELECT value FROM jsonb_array_elements(p.extra_windows) LOOP
            k := format('%s|%s|%s|%s', x ->> 'period', x ->> 'tz', x ->> 'start',
                        x ->> 'weekday');
            e := p_windows -> k;
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


class Migration(migrations.Migration):

    dependencies = [
        ('admission', '0008_charge_updates_first'),
    ]

    operations = [
        migrations.RunSQL(VERDICT, _0007.VERDICT),
    ]
