"""The database pool (switchboard/pgpool): the idle connection returned last is handed out first,
so a few requests at a time keep reusing the same warm, recently checked connections.

Real PostgreSQL connections; the pool's ``check`` callback is the project's own, counted.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import connection

from switchboard.pgpool import base as pgpool


def _pool(check: Any = None) -> pgpool.LifoConnectionPool:
    # Built as switchboard.pgpool builds the web process's pool, smaller.
    return pgpool.LifoConnectionPool(
        kwargs={**connection.get_connection_params(), "autocommit": True},
        min_size=0,
        max_size=3,
        check=check,
        open=True,
    )


@pytest.mark.django_db
def test_the_web_process_pool_is_the_lifo_one() -> None:
    connection.ensure_connection()
    assert isinstance(getattr(connection, "pool", None), pgpool.LifoConnectionPool)


@pytest.mark.django_db
def test_the_connection_returned_last_is_handed_out_first() -> None:
    pool = _pool()
    try:
        a, b, c = pool.getconn(), pool.getconn(), pool.getconn()
        for conn in (a, b, c):
            pool.putconn(conn)
        # psycopg_pool alone hands out ``a``, the one idle longest.
        first = pool.getconn()
        assert first is c
        second = pool.getconn()
        assert second is b
        pool.putconn(second)
        pool.putconn(first)
        assert pool.getconn() is first
    finally:
        pool.close()


@pytest.mark.django_db
def test_requests_slower_than_the_pool_size_need_no_idle_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three idle connections and one request every 0.4 s: handed out in turn (FIFO), each would
    sit idle 1.2 s, past IDLE_CHECK_SECONDS, and cost a check round trip on every request."""
    checks: list[Any] = []
    check_connection = pgpool.ConnectionPool.check_connection

    def counted(conn: Any) -> None:  # the round trip _check_if_idle decided to make
        checks.append(conn)
        check_connection(conn)

    monkeypatch.setattr(pgpool.ConnectionPool, "check_connection", staticmethod(counted))
    pool = _pool(check=pgpool._check_if_idle)
    try:
        held = [pool.getconn() for _ in range(3)]  # the pool grows to three connections
        for conn in held:
            pool.putconn(conn)
        checks.clear()
        used = set()
        for _ in range(6):
            time.sleep(0.4)
            conn = pool.getconn()
            used.add(id(conn))
            with conn.cursor() as cursor:
                cursor.execute("SELECT 1")
            pool.putconn(conn)
        assert pgpool.IDLE_CHECK_SECONDS < 0.4 * 3
        assert checks == []
        assert len(used) == 1
    finally:
        pool.close()
