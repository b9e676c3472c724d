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

Either way the rows the data migrations wrote (the auditors group and its view permissions) are
there again after it, as on a fresh deployment. Django's reset loses them; so did this one until
the suite ran on several workers, where a test reading them can follow a transactional test.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from django.apps import apps as django_apps
from django.core.management.sql import emit_post_migrate_signal
from django.db import DatabaseError, connections, transaction
from django.test import TransactionTestCase

# What post_migrate refills. Kept when unchanged (a digest of every row against the one taken
# after the migrations), so their rows keep their ids, as on a real deployment.
REFILLED = ("django_content_type", "auth_permission")

# Private in Django (and so not in its stubs): the method this module stands in for.
_djangos_reset: Any = getattr(TransactionTestCase, "_fixture_teardown")  # noqa: B009
_baseline: dict[str, str] = {}

# The data migrations, run again after Django's reset, which empties what they wrote. Between
# resets their rows are kept when unchanged and put back when a test changed them (_migrated).
DATA_MIGRATIONS = (("switchboard.console.migrations.0001_auditors_group", "create_auditors"),)
# Table: (digest, columns, rows) of a table holding rows once the migrations ran.
_migrated: dict[str, tuple[str, list[str], list[tuple[Any, ...]]]] = {}


def _digest(cursor: Any, table: str) -> str:
    cursor.execute(
        f"SELECT md5(coalesce(string_agg(t::text, ',' ORDER BY t.id), '')) FROM {table} t"
    )
    return str(cursor.fetchone()[0])


def remember_refilled(alias: str = "default") -> None:
    """Take the digest of the post_migrate tables, and the rows of the tables the data
    migrations filled, once the migrations have run."""
    connection = connections[alias]
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    _migrated.clear()
    with connection.cursor() as cursor:
        for table in REFILLED:
            _baseline[table] = _digest(cursor, table)
        for table in _holding(cursor, connection, tables):
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)} ORDER BY id")
            columns = [column.name for column in cursor.description]
            rows = cursor.fetchall()
            _migrated[table] = (_digest(cursor, table), columns, rows)


def _holding(cursor: Any, connection: Any, tables: list[str]) -> list[str]:
    """Which of ``tables`` (the post_migrate ones left out) hold a row: one statement."""
    tables = [t for t in tables if t not in REFILLED]
    qn = connection.ops.quote_name
    cursor.execute(
        " UNION ALL ".join(f"SELECT %s WHERE EXISTS (SELECT 1 FROM {qn(t)})" for t in tables),
        tables,
    )
    return [row[0] for row in cursor.fetchall()]


def _put_back(cursor: Any, connection: Any, table: str) -> None:
    """The rows ``table`` held once the migrations ran, with their ids (into an empty table)."""
    _, columns, rows = _migrated[table]
    qn = connection.ops.quote_name
    names = ", ".join(qn(c) for c in columns)
    marks = ", ".join(["%s"] * len(columns))
    cursor.executemany(f"INSERT INTO {qn(table)} ({names}) VALUES ({marks})", rows)


def _reset(alias: str) -> bool:
    """Empty the tables holding rows; False when Django's full reset is needed instead."""
    connection = connections[alias]
    qn = connection.ops.quote_name
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    with connection.cursor() as cursor:
        for table in REFILLED:
            if table not in _baseline or _digest(cursor, table) != _baseline[table]:
                return False
        holding = _holding(cursor, connection, tables)
        # A table the data migrations filled is left alone while it holds exactly their rows.
        changed = [
            t for t in _migrated if t not in holding or _digest(cursor, t) != _migrated[t][0]
        ]
    emptied = [t for t in holding if t not in _migrated or t in changed]
    if emptied or changed:
        try:
            # One transaction: Django's foreign keys are checked at its commit, so the order of
            # the deletes and inserts does not matter.
            with transaction.atomic(using=alias), connection.cursor() as cursor:
                for table in emptied:
                    cursor.execute(f"DELETE FROM {qn(table)}")
                for table in changed:
                    _put_back(cursor, connection, table)
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
            _run_data_migrations(alias)
            remember_refilled(alias)  # the refilled rows have new ids
        return
    for alias in aliases:
        emit_post_migrate_signal(verbosity=0, interactive=False, db=alias)


def _run_data_migrations(alias: str) -> None:
    """Write again what the data migrations wrote (their permissions now have new ids)."""
    for module, function in DATA_MIGRATIONS:
        with transaction.atomic(using=alias):
            getattr(import_module(module), function)(django_apps, None)


def install() -> None:
    setattr(TransactionTestCase, "_fixture_teardown", fixture_teardown)  # noqa: B010
