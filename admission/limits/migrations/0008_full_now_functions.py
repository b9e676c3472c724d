# The skips' lists of full limits as functions (issue 12, item 1: the ten-queue budget point).
#
# Every full claim statement (the budgeted claim's, the named claim's) skips rows naming a
# limit that is full now. Until now each list was an uncorrelated ARRAY(SELECT ... FROM
# limits_pool | limits_taglimit | limits_ratelimit WHERE <count of claimed todos naming it>),
# twice per statement (the candidate's skip and the "was anything skipped" answer). Those
# tables are small and rarely written, so autovacuum never analyses them (and never an empty
# one): the planner assumes ten pages, some 340 rows, and prices each list at ~340 times its
# occupancy count over queues_todo. The statement's estimate was ~21,750, almost all of it
# these six lists, which run only when a candidate names a limit.
#
# PostgreSQL's plan cache keeps a prepared statement's generic plan while its estimate stays
# under the average estimate of the custom plans it made first, plus a planning charge of
# 2.5 per relation (~130 here). Each analyse of queues_todo (autovacuum, during a bench or in
# production) re-estimates the occupancy counts, and ×340 ×6 moved the generic estimate by
# hundreds, often above that average: the connection then planned the whole statement on
# every claim (~2 ms of backend CPU) for hundreds of claims, until the custom plans' average
# caught up. claim_profile --budgeted --queues 10 saw it in 3 runs of 4 (313-834 custom plans
# of 2,140; 1.8-2.5 ms of backend CPU per cycle against 1.2-1.6 ms with generic plans only),
# and never once the three tables were analysed (their estimates then ~0).
#
# Each list is now a STABLE PL/pgSQL function, called in a sub-select so it stays an InitPlan
# (run at most once per statement, and only when a row naming such a limit is met, as
# before). A call the planner cannot inline is priced at its COST, whatever the tables hold:
# the statement's estimate no longer moves with queues_todo's statistics. Same lists, read
# with the statement's snapshot (a STABLE function runs on its caller's), same statement
# timestamp for the rates.

from django.db import migrations

FUNCTIONS = r"""
CREATE OR REPLACE FUNCTION limits_full_pools() RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN ARRAY(
        SELECT p.name FROM limits_pool p
        WHERE p.posture = 'enforce'
          AND p.slots <= (SELECT count(*) FROM queues_todo o
                          WHERE o.state = 'claimed' AND o.pool = p.name));
END
$$;

CREATE OR REPLACE FUNCTION limits_full_tags() RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- `o.tags <> '{}'` states todo_claimed_tags_idx's predicate, so the planner can use it.
    RETURN ARRAY(
        SELECT l.tag FROM limits_taglimit l
        WHERE l.posture = 'enforce'
          AND l."limit" <= (SELECT count(*) FROM queues_todo o
                            WHERE o.state = 'claimed' AND o.tags <> '{}'
                              AND o.tags @> ARRAY[l.tag]));
END
$$;

-- rates.effective_limit and rates.read, in SQL (base_limit < 2^20, so a shift of 31 is 0;
-- decay_step * observations is capped at 31 the same way).
CREATE OR REPLACE FUNCTION limits_full_rates() RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN ARRAY(
        SELECT r.name FROM limits_ratelimit r
        WHERE r.posture = 'enforce'
          AND coalesce((SELECT m.used FROM limits_rateminute m
                        WHERE m.rate_limit_id = r.id
                          AND m.minute = date_trunc('minute', statement_timestamp())), 0)
              >= GREATEST(r.floor, r.base_limit >> LEAST(31, r.decay_step * (
                    SELECT count(*) FROM limits_rateobservation o
                    WHERE o.rate_limit_id = r.id AND o.observed_at <= statement_timestamp()
                      AND o.observed_at > statement_timestamp()
                                          - make_interval(secs => r.decay_window_seconds)))::int));
END
$$;
"""

DROP = """
DROP FUNCTION IF EXISTS limits_full_pools();
DROP FUNCTION IF EXISTS limits_full_tags();
DROP FUNCTION IF EXISTS limits_full_rates();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("limits", "0007_fewer_statements_per_check"),
    ]

    operations = [
        migrations.RunSQL(FUNCTIONS, DROP),
    ]
