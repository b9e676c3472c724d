# The partial unique index "one open attempt per todo" (attempt_one_open, migration 0001) is back,
# and a takeover closes the attempt it replaces with a fresh snapshot.
#
# Migration 0002 altered Attempt.todo to db_index=False; Django's schema editor then dropped every
# single-column index on todo_id, this unique one included, so the database stopped refusing a
# second open attempt. That hid a race in the one-statement claim (issue 12's randomized trials,
# "4 open under a cap of 3"): a takeover's statement takes its snapshot before it locks the
# candidate, so when the lapsed claim it takes over committed in between, the statement's own
# UPDATE of the superseded attempt could not see that attempt and left it open. attempt_supersede
# closes it in a statement of its own (a VOLATILE function's statements take fresh snapshots),
# and the index makes any second open attempt an error rather than a silent row.

from django.db import migrations

# Attempts a later attempt of the same todo replaced but left open (the race above): closed as
# the takeover would have closed them, at the moment the later attempt was claimed.
CLOSE_LEFT_OPEN = """
UPDATE queues_attempt a
SET ended_at = later.claimed_at, outcome = 'superseded', disposition = 'requeued'
FROM (
    SELECT o.id, (SELECT min(n.claimed_at) FROM queues_attempt n
                  WHERE n.todo_id = o.todo_id AND n.claimed_at > o.claimed_at) AS claimed_at
    FROM queues_attempt o WHERE o.ended_at IS NULL
) later
WHERE a.id = later.id AND later.claimed_at IS NOT NULL
"""

INDEX = """
CREATE UNIQUE INDEX IF NOT EXISTS attempt_one_open ON queues_attempt (todo_id)
WHERE ended_at IS NULL
"""

SUPERSEDE = r"""
CREATE OR REPLACE FUNCTION attempt_supersede(p_todo uuid, p_number integer, p_at timestamptz)
RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n integer;
BEGIN
    -- attempt_todo_number_idx
    UPDATE queues_attempt SET ended_at = p_at, outcome = 'superseded', disposition = 'requeued'
    WHERE todo_id = p_todo AND number = p_number AND ended_at IS NULL;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
"""


class Migration(migrations.Migration):

    dependencies = [
        ('queues', '0007_todo_discarded_attempt_errors_and_time_indexes'),
    ]

    operations = [
        migrations.RunSQL(CLOSE_LEFT_OPEN, migrations.RunSQL.noop),
        migrations.RunSQL(INDEX, migrations.RunSQL.noop),
        migrations.RunSQL(SUPERSEDE, "DROP FUNCTION IF EXISTS attempt_supersede(uuid, integer, timestamptz)"),
    ]
