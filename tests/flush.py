"""The database reset after each ``transactional_db`` test, made cheap.

Django's reset (``TransactionTestCase._fixture_teardown``, the ``flush`` command) TRUNCATEs every
table in one statement, then refills the content types and permissions through ``post_migrate``.
On PostgreSQL a TRUNCATE makes every table and index a new file, so each transactional test paid
for some forty tables (and their indexes) whatever it touched, then for a hundred-odd inserts.

This reset leaves the same database behind: it empties, in one transaction, only the tables that
hold rows (DELETE: a handful of rows, no new files), keeps the content types and permissions when
they are exactly what the migrations made (``post_migrate`` still runs, and finds nothing to
make), and falls back to Django's own reset for anything else (those two tables changed, or a
constraint that cannot wait for the commit).
"""

from __future__ import annotations

from typing import Any

from django.core.management.sql import emit_post_migrate_signal
from django.db import DatabaseError, connections, transaction
from django.test import TransactionTestCase

# What post_migrate refills. Kept when unchanged (a digest of every row against the one taken
# after the migrations), so their rows keep their ids, as on a real deployment.
REFILLED = ("django_content_type", "auth_permission")

# Private in Django (and so not in its stubs): the method this module stands in for.
_djangos_reset: Any = getattr(TransactionTestCase, "_fixture_teardown")  # noqa: B009
_baseline: dict[str, str] = {}


def _digest(cursor: Any, table: str) -> str:
    cursor.execute(
        f"SELECT md5(coalesce(string_agg(t::text, ',' ORDER BY t.id), '')) FROM {table} t"
    )
    return str(cursor.fetchone()[0])


def remember_refilled(alias: str = "default") -> None:
    """Take the digest of the post_migrate tables, once the migrations have run."""
    with connections[alias].cursor() as cursor:
        for table in REFILLED:
            _baseline[table] = _digest(cursor, table)


def _reset(alias: str) -> bool:
    """Empty the tables holding rows; False when Django's full reset is needed instead."""
    connection = connections[alias]
    qn = connection.ops.quote_name
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    with connection.cursor() as cursor:
        for table in REFILLED:
            if table not in _baseline or _digest(cursor, table) != _baseline[table]:
                return False
        probes = " UNION ALL ".join(
            f"SELECT %s WHERE EXISTS (SELECT 1 FROM {qn(t)})" for t in tables if t not in REFILLED
        )
        cursor.execute(probes, [t for t in tables if t not in REFILLED])
        holding = [row[0] for row in cursor.fetchall()]
    if holding:
        try:
            # One transaction: Django's foreign keys are checked at its commit, so the order of
            # the deletes does not matter.
            with transaction.atomic(using=alias), connection.cursor() as cursor:
                for table in holding:
                    cursor.execute(f"DELETE FROM {qn(table)}")
        except DatabaseError:
            return False
    return True


def fixture_teardown(self: TransactionTestCase) -> None:
    """``TransactionTestCase._fixture_teardown`` for tests without ``available_apps`` or
    serialized rollback (this suite uses neither); Django's own otherwise."""
    if self.available_apps is not None or self.serialized_rollback:
        _djangos_reset(self)
        return
    aliases: list[str] = getattr(self, "_databases_names")(include_mirrors=False)  # noqa: B009
    if not all(_reset(alias) for alias in aliases):
        _djangos_reset(self)  # the full reset: TRUNCATE everything, refill through post_migrate
        for alias in aliases:
            remember_refilled(alias)  # the refilled rows have new ids
        return
    for alias in aliases:
        emit_post_migrate_signal(verbosity=0, interactive=False, db=alias)


def install() -> None:
    setattr(TransactionTestCase, "_fixture_teardown", fixture_teardown)  # noqa: B010
