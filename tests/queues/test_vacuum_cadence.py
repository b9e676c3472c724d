"""The work table's autovacuum thresholds (queues migration 0018, issue 12 item 3): a vacuum once
a few thousand rows are dead, whatever the table's size, so the claimable index's dead entries at
a hot queue's head are removed within autovacuum's naptime rather than after a fifth of the
table has died. Set by a migration, so every migrated database carries them, and reversible."""

from __future__ import annotations

import importlib

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from queues.models import Todo

m0018 = importlib.import_module("queues.migrations.0018_todo_vacuum_cadence")
BEFORE = ("queues", "0017_attempt_one_open_locks_without_a_select")
AFTER = ("queues", "0018_todo_vacuum_cadence")


def reloptions() -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT reloptions FROM pg_class WHERE oid = %s::regclass", [Todo._meta.db_table]
        )
        (options,) = cursor.fetchone()
    return dict(option.split("=", 1) for option in options or [])


def test_the_migration_sets_the_work_tables_vacuum_thresholds(db: None) -> None:
    assert Todo._meta.db_table == m0018.TABLE
    assert reloptions() == {
        "autovacuum_vacuum_scale_factor": "0",
        "autovacuum_vacuum_threshold": "2000",
        "autovacuum_vacuum_cost_delay": "0",
    }


@pytest.mark.django_db(transaction=True)
def test_the_thresholds_survive_a_reload_of_the_table() -> None:
    """What the benches do before a run (bench.core_bench._reload): delete, VACUUM ANALYZE."""
    before = reloptions()
    Todo.objects.all().delete()
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM ANALYZE {Todo._meta.db_table}")
    assert reloptions() == before == m0018.RELOPTIONS


@pytest.mark.django_db(transaction=True)
def test_the_migration_is_reversed_to_autovacuums_defaults_and_back() -> None:
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes("queues")  # the later migrations come back too
    try:
        executor.migrate([BEFORE])
        assert reloptions() == {}
    finally:
        executor.loader.build_graph()
        executor.migrate(latest)
    assert reloptions() == m0018.RELOPTIONS
