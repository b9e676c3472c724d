# queues_todo's autovacuum thresholds by dead rows, not by a share of the table (issue 12 item 3).
#
# Every claim + complete leaves two dead entries at the head of todo_claimable_idx. A claim marks
# them LP_DEAD but every later claim still reads the leaf pages that hold them, from the
# endpoint's left edge, until a vacuum removes them: a claim's cost grows with the claims since
# the table's last vacuum (bench.dead_entries: buffers per claim +7 per 1,000 cycles at 8
# claimers, a sawtooth with autovacuum's period). Autovacuum's default trigger is 20 % of the
# table's rows dead; a work table keeps its finished todos, so the bigger its history, the longer
# its hot head goes unvacuumed (10 million rows: two million dead before the first vacuum).
#
# - autovacuum_vacuum_scale_factor 0, autovacuum_vacuum_threshold 2000: a vacuum once 2,000 rows
#   are dead (about 1,000 claims), whatever the table's size. How often a table past its
#   threshold is visited is the server's autovacuum_naptime (the embedded cluster sets it,
#   switchboard.embedded.CLUSTER_SETTINGS; a production server's is its operator's).
# - autovacuum_vacuum_cost_delay 0: the vacuum of this table is not throttled, so it ends within
#   the naptime instead of spanning several of them while the dead entries pile up behind it.
#
# Storage parameters of the table, so every database migrated here carries them (the benches'
# fresh databases too); RESET on the way back restores the server's defaults.

from django.db import migrations

TABLE = "queues_todo"
RELOPTIONS = {
    "autovacuum_vacuum_scale_factor": "0",
    "autovacuum_vacuum_threshold": "2000",
    "autovacuum_vacuum_cost_delay": "0",
}

FORWARD = f"ALTER TABLE {TABLE} SET ({', '.join(f'{k} = {v}' for k, v in RELOPTIONS.items())})"
REVERSE = f"ALTER TABLE {TABLE} RESET ({', '.join(RELOPTIONS)})"


class Migration(migrations.Migration):
    dependencies = [
        ("queues", "0017_attempt_one_open_locks_without_a_select"),
    ]

    operations = [
        migrations.RunSQL(FORWARD, REVERSE),
    ]
