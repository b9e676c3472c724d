"""The test harness leaves each test the world a fresh deployment has, whatever ran before it
in the same process (the suite runs on several pytest-xdist workers, each taking whole files
in an order no single process would)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import pytest
from django.contrib.auth.models import Group, Permission
from django.db import connection
from django.test import TransactionTestCase

from queues import wakes
from queues.access import AUDITORS_GROUP
from switchboard.core import availability
from tests import flush
from tests.admission.racer import race
from tests.celery_worker import real_worker
from tests.conftest import MANY_CONNECTIONS, ONE_FILE_CONNECTIONS, run_threads

# switchboard/console/migrations/0001_auditors_group.py: the admin's view pages they read.
AUDITORS_VIEW = {
    "view_endpoint",
    "view_todo",
    "view_attempt",
    "view_queuepause",
    "view_admissionpolicy",
    "view_admissionwindow",
    "view_ledgerentry",
    "view_ledgerhead",
}


def _auditors_view() -> set[str]:
    group = Group.objects.get(name=AUDITORS_GROUP)
    return set(group.permissions.values_list("codename", flat=True))


def _rows_per_table(tables: Iterable[str]) -> dict[str, int]:
    with connection.cursor() as cursor:
        counts = {}
        for table in tables:
            cursor.execute(f"SELECT count(*) FROM {connection.ops.quote_name(table)}")
            counts[table] = cursor.fetchone()[0]
    return counts


def _reset_as_after_a_test() -> None:
    """What pytest-django runs after a ``transactional_db`` test (tests/flush.py's reset)."""
    getattr(TransactionTestCase(), "_fixture_teardown")()  # noqa: B009


def test_a_reset_puts_back_the_auditors_group_a_test_changed(transactional_db: None) -> None:
    assert _auditors_view() == AUDITORS_VIEW
    Group.objects.get(name=AUDITORS_GROUP).permissions.clear()
    Group.objects.create(name="made by a test")
    _reset_as_after_a_test()
    assert _auditors_view() == AUDITORS_VIEW
    assert list(Group.objects.values_list("name", flat=True)) == [AUDITORS_GROUP]


def test_a_reset_puts_back_the_auditors_group_a_test_deleted(transactional_db: None) -> None:
    Group.objects.filter(name=AUDITORS_GROUP).delete()
    _reset_as_after_a_test()
    assert _auditors_view() == AUDITORS_VIEW


def test_djangos_full_reset_is_followed_by_the_auditors_group(transactional_db: None) -> None:
    # A changed permission sends the reset to Django's own (TRUNCATE, refill through
    # post_migrate), which gives the permissions new ids and loses the group.
    migrated = _rows_per_table(flush._migrated)
    assert migrated  # the auditors group and its permissions, at least
    Permission.objects.filter(codename="view_todo").update(name="changed by a test")
    _reset_as_after_a_test()
    assert Permission.objects.get(codename="view_todo").name == "Can view todo"
    assert _auditors_view() == AUDITORS_VIEW
    # Every table a data migration filled is filled again: one not in flush.DATA_MIGRATIONS
    # would be empty here.
    assert _rows_per_table(migrated) == migrated
    # And the reset after it keeps what it finds unchanged.
    _reset_as_after_a_test()
    assert _auditors_view() == AUDITORS_VIEW


def test_a_real_worker_leaves_the_root_loggers_level_as_it_found_it() -> None:
    root = logging.getLogger()
    level = root.level
    with real_worker():
        # Celery's embedded worker sets its own level (ERROR) when it sets up logging, which it
        # does once per process; whatever it or the block leaves is put back.
        root.setLevel(logging.CRITICAL)
    assert root.level == level
    assert logging.getLogger("queues.services.claiming").isEnabledFor(logging.WARNING)


# The two tests below run in this order in one process (a file is never split between workers).


def test_breakers_opened_by_a_test(settings: Any) -> None:
    settings.REDIS_BREAKER_OPEN_SECONDS = 3600  # open until long after this file has run
    availability.redis_breaker.failed()
    wakes.broker_breaker.failed()
    assert not availability.redis_breaker.allow()
    assert not wakes.broker_breaker.allow()


def test_are_closed_for_the_next() -> None:
    assert availability.redis_breaker.allow()
    assert wakes.broker_breaker.allow()


def test_every_file_listed_as_opening_many_connections_is_there() -> None:
    # A file renamed or moved would drop out of the unit they run in, one after another, and
    # race beside another such file on the other worker.
    root = Path(__file__).resolve().parent.parent
    assert MANY_CONNECTIONS
    assert [f for f in sorted(MANY_CONNECTIONS) if not (root / f).is_file()] == []


def test_a_file_not_listed_may_not_open_many_connections_at_once(tmp_path: Path) -> None:
    # This file is not listed: past the bound, run_threads refuses before any thread starts, and
    # the two-process race (two children of n threads each) before any child starts.
    assert "tests/test_harness.py" not in MANY_CONNECTIONS
    started: list[int] = []
    with pytest.raises(
        AssertionError, match=rf"tests/test_harness\.py opens {ONE_FILE_CONNECTIONS + 1} database"
    ):
        run_threads(ONE_FILE_CONNECTIONS + 1, started.append)
    assert started == []
    assert run_threads(ONE_FILE_CONNECTIONS, started.append) == [None] * ONE_FILE_CONNECTIONS
    assert sorted(started) == list(range(ONE_FILE_CONNECTIONS))
    threads = ONE_FILE_CONNECTIONS // 2 + 1
    with pytest.raises(AssertionError, match=rf"opens {2 * threads} database connections"):
        race("not-an-endpoint", threads, tmp_path, "postgresql://nowhere", "redis://nowhere")
    assert list(tmp_path.iterdir()) == []


# As are these two.


def test_a_race_grows_the_pool(transactional_db: None) -> None:
    barrier = threading.Barrier(8)

    def hold(i: int) -> int:
        with connection.cursor() as cursor:  # each thread takes a pooled connection
            cursor.execute("SELECT 1")
        barrier.wait(timeout=30)  # all eight held at once
        return i

    run_threads(8, hold)
    pool = cast(Any, connection).existing_pool
    assert pool is not None and pool.get_stats()["pool_size"] >= 8


def test_gives_the_next_test_its_connections_back() -> None:
    pool = cast(Any, connection).existing_pool
    assert pool is None or pool.get_stats()["pool_size"] <= pool.get_stats()["pool_min"]


def _pytest_example(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """pytest on tmp_path's test_example.py in a child process, without Django or xdist."""
    plugins = ["-p", "no:cacheprovider", "-p", "no:django", "-p", "no:xdist"]
    return subprocess.run(
        [sys.executable, "-m", "pytest", *plugins, *args, "test_example.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_ci_log_ends_by_naming_each_failed_test(tmp_path: Path) -> None:
    """On CI pytest prints each failure's message whole in its short summary; the log's last
    lines name the failed tests all the same (tests/summary_last.py)."""
    (tmp_path / "test_example.py").write_text(
        "import pytest\n"
        "def test_passes(): pass\n"
        "def test_fails(): assert False, 'a console said:\\n' * 200\n"
        "@pytest.fixture\n"
        "def broken(): raise RuntimeError('no setup')\n"
        "def test_in_error(broken): pass\n"
    )
    env = {**os.environ, "CI": "true", "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    run = _pytest_example(tmp_path, "-p", "tests.summary_last", env=env)
    assert run.returncode == 1, run.stdout + run.stderr
    tail = run.stdout.strip().splitlines()[-4:]
    assert tail[0].strip("= ") == "2 failed or in error, named again", run.stdout
    assert tail[1:3] == [
        "FAILED test_example.py::test_fails",
        "ERROR test_example.py::test_in_error",
    ], run.stdout
    assert "1 failed, 1 passed, 1 error" in tail[3], run.stdout


def test_a_hung_test_fails_with_every_threads_stack_and_the_run_goes_on(
    tmp_path: Path, pytestconfig: pytest.Config
) -> None:
    """pytest-timeout (pyproject.toml's ``timeout``): a test waiting on a thread that never ends
    fails, naming where each thread was, and the tests after it run."""
    assert 120 <= float(pytestconfig.getini("timeout")) <= 900
    (tmp_path / "test_example.py").write_text(
        "import threading\n"
        "def test_hangs():\n"
        "    def spin_for_ever(): threading.Event().wait()\n"
        "    t = threading.Thread(target=spin_for_ever, daemon=True)\n"
        "    t.start()\n"
        "    t.join()\n"
        "def test_after(): pass\n"
    )
    run = _pytest_example(tmp_path, "-o", "timeout=2")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Timeout" in run.stdout and "spin_for_ever" in run.stdout, run.stdout
    assert "1 failed, 1 passed" in run.stdout, run.stdout
