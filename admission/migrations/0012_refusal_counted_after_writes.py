# A refusal's count in the first window's history waits for a write of its budget in progress.
#
# A refused claim's count is written after the claim, outside the budget's locks
# (admission.engine.record_refusal). The first window counts under the key '' (its place, not
# its definition), and a write that changes the first window moves that key's rows to the old
# window's own key (admission.services._follow_first_window). A count decided under the old list
# and written while such a write was uncommitted read the old definition, passed its guard and
# landed under '' after the move: a refusal in another window's history (regress11: 31 of 49
# rows misplaced while one writer reordered the list under 32 agents).
#
# admission_count_refusal takes shard 0's lock shared first (a write holds every shard,
# admission_shards_lock, migration 0007, until it commits), then, in a statement of its own and
# so a snapshot taken after that write committed, counts the refusal under '' only while the
# budget's first window is the one it was decided under. The other windows count under their
# definition's key, which a move never changes the meaning of, with no lock. Shared: refusals do
# not wait for each other; a claim holding shard 0 (or all) keeps them waiting a statement.

from django.db import migrations

FORWARD = """
CREATE OR REPLACE FUNCTION admission_count_refusal(
    p_policy uuid, p_key text, p_ws timestamptz, p_lim integer, p_first boolean,
    p_period text, p_tz text, p_start text, p_weekday text
) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_first THEN
        PERFORM pg_advisory_xact_lock_shared(19550, hashtext(p_policy::text));
    END IF;
    INSERT INTO admission_admissionwindow AS aw
        (policy_id, window_key, window_start, shard, used, refused, claims_limit, updated_at)
    SELECT p.id, p_key, p_ws, 0, 0, 1, p_lim, now()
    FROM admission_admissionpolicy p
    WHERE p.id = p_policy
      AND (NOT p_first OR (p.window_period, p.window_tz, p.window_start, p.window_weekday)
           IS NOT DISTINCT FROM (p_period, p_tz, p_start, p_weekday))
    ON CONFLICT (policy_id, window_key, window_start, shard)
    DO UPDATE SET refused = aw.refused + 1, claims_limit = EXCLUDED.claims_limit,
                  updated_at = now();
END
$$;
"""

BACKWARD = """
DROP FUNCTION IF EXISTS admission_count_refusal(
    uuid, text, timestamptz, integer, boolean, text, text, text, text
);
"""


class Migration(migrations.Migration):
    dependencies = [("admission", "0011_window_counts_checked_by_their_types")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
