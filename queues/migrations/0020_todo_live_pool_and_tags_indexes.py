# The named limits' four partial indexes on queues_todo become two (issue 12 item 2).
#
# Every UPDATE of a todo opens every index of the table and, for each partial index, copies its
# predicate and prepares it again (executor set-up: PostgreSQL keeps no prepared predicate across
# statements), whether the row enters the index or not; a claim cycle updates its todo twice.
# A todo naming no pool and no tag entered none of todo_claimed_pool_idx, todo_pending_pool_idx,
# todo_claimed_tags_idx and todo_pending_tags_idx, and paid for all four. Callgrind, one plain
# claim + complete cycle: the indexes' set-up (ExecOpenIndices, ExecCloseIndices and
# ExecInsertIndexTuples less the inserts) 226.7k -> 187.9k backend instructions, of ~1.4M.
#
# - todo_live_pool_idx: (pool, state) over the live rows naming a pool. A read's
#   ``state = 'claimed' AND pool = $1`` implies its predicate and is one range of it.
# - todo_live_tags_idx: GIN over (state, tags) for the live rows naming tags, ``state`` through
#   btree_gin. A tag's occupancy intersects the tag's entry with the 'claimed' entry: pending
#   rows naming the tag are passed over in the index, never fetched. No pending list
#   (fastupdate off): every scan reads all of a GIN index's pending list, and this one's would
#   hold the backlog's new todos (EXPLAIN (ANALYZE, BUFFERS) of limits_full_tags on 3,000
#   pending todos naming two tags: 72 buffers with it, 10 without, 8 through the old
#   todo_claimed_tags_idx). The price: a claim naming tags inserts its entries ('claimed' and
#   each tag) into the entry tree at once, not into a pending list: gininsert 17-37k -> 104-111k
#   instructions per named cycle (of ~5-6M; the set-up above saves ~16k of it).
# - Statistics of (pool, state) together (MCV): the planner took the two as independent and
#   priced a pool's claims at its share of the table times the share claimed (603 rows for 4
#   in the plan test's backlog), so a custom plan counted a pool's claims by reading every
#   claim in flight through todo_claimed_idx. The old claimed-only index was small enough
#   that its size said the same thing.
#
# btree_gin ships with PostgreSQL's contrib and is a trusted extension (PostgreSQL 13+): a role
# with CREATE on the database may create it; the README says so for a production server.

import django.contrib.postgres.indexes
from django.contrib.postgres.operations import BtreeGinExtension
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("queues", "0019_checks_one_expression_when_they_hold"),
    ]

    operations = [
        BtreeGinExtension(),
        migrations.AddIndex(
            model_name="todo",
            index=models.Index(
                condition=models.Q(("pool__isnull", False), ("state__in", ["pending", "claimed"])),
                fields=["pool", "state"],
                name="todo_live_pool_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="todo",
            index=django.contrib.postgres.indexes.GinIndex(
                condition=models.Q(
                    models.Q(("tags", []), _negated=True), ("state__in", ["pending", "claimed"])
                ),
                fields=["state", "tags"],
                name="todo_live_tags_idx",
                fastupdate=False,
            ),
        ),
        migrations.RunSQL(
            "CREATE STATISTICS queues_todo_pool_state (mcv) ON pool, state FROM queues_todo",
            "DROP STATISTICS IF EXISTS queues_todo_pool_state",
        ),
        migrations.RemoveIndex(model_name="todo", name="todo_claimed_pool_idx"),
        migrations.RemoveIndex(model_name="todo", name="todo_claimed_tags_idx"),
        migrations.RemoveIndex(model_name="todo", name="todo_pending_pool_idx"),
        migrations.RemoveIndex(model_name="todo", name="todo_pending_tags_idx"),
    ]
