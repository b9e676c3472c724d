# The lean claim statement decides and charges a budget in one call (issue 12, item 1: the
# ten-queue budget point, where the claimers hardly wait for each other and the budget's price
# is its CPU per claim).
#
# The lean statement (queues.sql._lean_claim_sql) took a budget's verdict in a CTE of its own
# (admission_check), then, after the claim row was written, spent it in another
# (admission_charge over the verdict and the claimed row), and answered both: two more
# materialised CTEs, their scans, two InitPlans and a second plpgsql call per claim, executor
# set-up on every execution. In that statement the claim is certain once the budget admits: its
# candidate is locked (FOR UPDATE) before the verdict, no other gate decides it (it names no
# pool, tag or rate limit, is no takeover and holds no grant), and the claim's UPDATE of a row
# this statement holds locked always writes it. So admission_admit takes the verdict and, when
# it admits, charges it at once, in the same statement and transaction as the claim: the same
# counter rows, under the same shard (the one admission_check took, or shard 0 after exact
# mode), committed with the claim or not at all. A verdict that does not admit charges nothing
# and the locked path decides, as before. STRICT: a candidate no budget claims (a NULL policy
# key) is answered NULL without a call, which the statement reads as "nothing to say".
#
# The full statement, which may also ask the limits' gates after the budget, keeps the verdict
# then the charge once the claim is written (admission_check, admission_charge: unchanged).
# Exactness rests on the shard's lock and the read under it (migration 0007's header); when the
# counter row is written within the claim's transaction does not enter it.

from django.db import migrations

ADMIT = r"""
CREATE OR REPLACE FUNCTION admission_admit(p_policy uuid, p_todo uuid, p_windows jsonb)
RETURNS jsonb LANGUAGE plpgsql VOLATILE STRICT AS $$
DECLARE
    v jsonb := admission_check(p_policy, p_todo, p_windows);
    n integer;
BEGIN
    IF (v ->> 'ok')::boolean THEN
        n := admission_charge(v);
    END IF;
    RETURN v;
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
