# Stacked windows (issue 12): a policy may hold up to four window limits, every one charged and
# enforced on the same claim. The first window stays in the policy's window columns (so every
# existing policy already is a one-item list and the single-window fast path is unchanged); the
# others are the JSON list ``extra_windows`` [{limit, period, tz, start, weekday}], checked here
# by admission_extra_windows_valid. Counters key on the window too: '' is the first window, any
# other is keyed by its definition "period|tz|start|weekday" (the format admission_check uses).
#
# admission_check (v3) decides every window in the claiming statement: the first as before, then
# each extra window against its own counter, read in a statement of its own after the lock;
# admission_charge spends one unit of every window. admission_windows_used is the one read of
# the extra windows' counters (the claim's locked path and every read surface).

import importlib

from django.db import migrations, models

WINDOWS_VALID = r"""
CREATE OR REPLACE FUNCTION admission_extra_windows_valid(
    extra jsonb, first_limit integer, first_period text, first_tz text, first_start text,
    first_weekday text
) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN extra IS NULL OR jsonb_typeof(extra) <> 'array' THEN false
        WHEN jsonb_array_length(extra) = 0 THEN true
        WHEN first_limit IS NULL OR first_period IS NULL THEN false
        WHEN jsonb_array_length(extra) > 3 THEN false
        ELSE coalesce((
            SELECT bool_and(coalesce(
                jsonb_typeof(w) = 'object'
                AND NOT EXISTS (SELECT 1 FROM jsonb_object_keys(w) k
                                WHERE k NOT IN ('limit', 'period', 'tz', 'start', 'weekday'))
                AND jsonb_typeof(w -> 'limit') = 'number'
                AND (w ->> 'limit') ~ '^[0-9]{1,7}$'
                AND (w ->> 'limit')::integer <= 1000000
                AND w ->> 'period' IN ('hour', 'day', 'week')
                AND jsonb_typeof(w -> 'tz') = 'string'
                AND length(w ->> 'tz') BETWEEN 1 AND 64
                AND jsonb_typeof(w -> 'start') = 'string'
                AND (w ->> 'start') ~ '^([01][0-9]|2[0-3]):[0-5][0-9]$'
                AND CASE WHEN w ->> 'period' = 'week'
                         THEN w ->> 'weekday' IN ('Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat', 'Sun')
                         ELSE coalesce(jsonb_typeof(w -> 'weekday'), 'null') = 'null' END,
                false))
            FROM jsonb_array_elements(extra) w), false)
            -- no two windows alike (the first one included)
            AND (SELECT count(DISTINCT k) = count(*) FROM (
                    SELECT format('%s|%s|%s|%s', first_period, first_tz, first_start,
                                  first_weekday) AS k
                    UNION ALL
                    SELECT format('%s|%s|%s|%s', w ->> 'period', w ->> 'tz', w ->> 'start',
                                  w ->> 'weekday')
                    FROM jsonb_array_elements(extra) w) keys)
    END
$$;
"""

CONSTRAINT = """
ALTER TABLE admission_admissionpolicy ALTER COLUMN extra_windows SET DEFAULT '[]'::jsonb;
ALTER TABLE admission_admissionwindow ALTER COLUMN window_key SET DEFAULT '';
"""

# admission_usage of migration 0005, the first window's counter keyed by ''.
USAGE = r"""
CREATE OR REPLACE FUNCTION admission_usage(
    p_endpoint uuid, p_queue text, p_policy uuid, p_window_start timestamptz, p_exclude uuid
) RETURNS TABLE (in_flight integer, earliest_lease timestamptz, used integer)
LANGUAGE sql STABLE AS $$
    SELECT f.n, f.earliest,
           -- admission_window_key
           coalesce((SELECT w.used FROM admission_admissionwindow w
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
    SELECT coalesce(array_agg(coalesce(w.used, 0) ORDER BY k.n), '{}')
    FROM unnest(p_keys, p_starts) WITH ORDINALITY AS k(key, ws, n)
    -- admission_window_key
    LEFT JOIN admission_admissionwindow w
           ON w.policy_id = p_policy AND w.window_key = k.key AND w.window_start = k.ws
$$;
"""

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
    more jsonb;
    x jsonb;
    k text;
    e jsonb;
    x_ws timestamptz;
    x_resets timestamptz;
    x_used integer;
BEGIN
    -- Pass 1 reads without the lock, as the locked path's pre-read does: a claimer never waits
    -- on the lock of a budget it cannot be admitted to. Pass 2 decides under the lock, its usage
    -- read in statements of their own (a fresh snapshot: they see every claim committed by the
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
        more := '[]'::jsonb;
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
                IF x_used >= (x ->> 'limit')::integer THEN
                    RETURN jsonb_build_object('ok', false);
                END IF;
                more := more || jsonb_build_array(jsonb_build_object(
                    'key', k, 'limit', (x ->> 'limit')::integer, 'used', x_used,
                    'window_start', x_ws, 'window_resets_at', x_resets));
            END LOOP;
        END IF;
    END LOOP;
    RETURN jsonb_build_object(
        'ok', true, 'policy', p.id, 'queue', p.queue, 'posture', p.posture,
        'max_in_flight', p.max_in_flight, 'in_flight', flying,
        'max_claims_per_window', p.max_claims_per_window, 'used', spent,
        'window_start', ws, 'window_resets_at', resets, 'more', more);
END
$$;
"""

CHARGE = r"""
CREATE OR REPLACE FUNCTION admission_charge(v jsonb) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    x jsonb;
BEGIN
    IF v ->> 'window_start' IS NULL THEN
        RETURN 0;
    END IF;
    INSERT INTO admission_admissionwindow
        (policy_id, window_key, window_start, used, refused, claims_limit, updated_at)
    VALUES ((v ->> 'policy')::uuid, '', (v ->> 'window_start')::timestamptz, 1, 0,
            (v ->> 'max_claims_per_window')::integer, now())
    ON CONFLICT (policy_id, window_key, window_start)
    DO UPDATE SET used = admission_admissionwindow.used + 1,
                  claims_limit = EXCLUDED.claims_limit, updated_at = now();
    IF v -> 'more' IS NOT NULL AND v -> 'more' <> '[]'::jsonb THEN
        FOR x IN SELECT value FROM jsonb_array_elements(v -> 'more') LOOP
            INSERT INTO admission_admissionwindow
                (policy_id, window_key, window_start, used, refused, claims_limit, updated_at)
            VALUES ((v ->> 'policy')::uuid, x ->> 'key', (x ->> 'window_start')::timestamptz,
                    1, 0, (x ->> 'limit')::integer, now())
            ON CONFLICT (policy_id, window_key, window_start)
            DO UPDATE SET used = admission_admissionwindow.used + 1,
                          claims_limit = EXCLUDED.claims_limit, updated_at = now();
        END LOOP;
    END IF;
    RETURN 1;
END
$$;
"""

_0004 = importlib.import_module("admission.migrations.0004_fast_admit")
_0005 = importlib.import_module("admission.migrations.0005_one_usage_query")


class Migration(migrations.Migration):

    dependencies = [
        ('admission', '0005_one_usage_query'),
    ]

    operations = [
        migrations.AddField(
            model_name='admissionpolicy',
            name='extra_windows',
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name='admissionwindow',
            name='window_key',
            field=models.CharField(blank=True, default='', max_length=96),
        ),
        migrations.RemoveConstraint(
            model_name='admissionwindow',
            name='admission_window_key',
        ),
        migrations.AddConstraint(
            model_name='admissionwindow',
            constraint=models.UniqueConstraint(
                fields=('policy', 'window_key', 'window_start'), name='admission_window_key'
            ),
        ),
        migrations.RunSQL(WINDOWS_VALID, "DROP FUNCTION IF EXISTS admission_extra_windows_valid(jsonb, integer, text, text, text, text)"),
        migrations.RunSQL(CONSTRAINT, migrations.RunSQL.noop),
        migrations.AddConstraint(
            model_name='admissionpolicy',
            constraint=models.CheckConstraint(
                condition=models.Func(
                    models.F('extra_windows'),
                    models.F('max_claims_per_window'),
                    models.F('window_period'),
                    models.F('window_tz'),
                    models.F('window_start'),
                    models.F('window_weekday'),
                    function='admission_extra_windows_valid',
                    output_field=models.BooleanField(),
                ),
                name='policy_extra_windows_valid',
            ),
        ),
        migrations.RunSQL(WINDOWS_USED, "DROP FUNCTION IF EXISTS admission_windows_used(uuid, text[], timestamptz[])"),
        migrations.RunSQL(USAGE, _0005.USAGE),
        migrations.RunSQL(CHECK, _0005.CHECK),
        migrations.RunSQL(CHARGE, _0004.CHARGE),
    ]
