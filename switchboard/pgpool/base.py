"""Django's PostgreSQL backend; its connection pool hands out the connection returned last, and
checks a connection only after it sat idle.

With ``CONN_HEALTH_CHECKS`` Django's pool checks every connection it hands out with a round trip
to the server (an empty query): one more round trip per request, a third of an agent request's
(issue 11). A connection handed out less than ``IDLE_CHECK_SECONDS`` ago has just proved
itself (one that broke in use is discarded by the pool when it comes back). So only a
connection idle that long is checked: after a PostgreSQL restart (which takes longer than that)
every connection kept from before is checked, and replaced, before a request can get it.

psycopg_pool hands connections out oldest-returned first (FIFO), so requests rotate through every
idle connection: with N of them, each is handed out only every Nth request, and at fewer than N
requests a second (a few agents polling) every request found its connection idle past
``IDLE_CHECK_SECONDS`` and paid the check's round trip; each PostgreSQL backend's caches (and
psycopg's prepared statements, made after a statement's fifth run on a connection) also warmed
N times slower. ``LifoConnectionPool`` hands out the one returned last: the busy few connections
stay warm and checked, the rest stay idle (and are the ones the pool shrinks away).
"""

from __future__ import annotations

import time
from typing import Any

from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.postgresql import base
from psycopg_pool import ConnectionPool

IDLE_CHECK_SECONDS = 1.0


# When each pooled connection was last handed out, by id(): psycopg connections take no
# attributes. Idle time is at most the time since then, so this errs towards checking. A reused
# id is a connection made since, which has nothing to prove either.
_handed_out_at: dict[int, float] = {}


def _check_if_idle(conn: Any) -> None:
    """The pool's ``check`` callback: a round trip only for a connection idle for a while."""
    now = time.monotonic()
    last = _handed_out_at.get(id(conn))
    if len(_handed_out_at) > 10_000:  # ids of connections closed meanwhile
        _handed_out_at.clear()
    _handed_out_at[id(conn)] = now
    if last is not None and now - last < IDLE_CHECK_SECONDS:
        return
    ConnectionPool.check_connection(conn)


class LifoConnectionPool(ConnectionPool):
    """psycopg_pool's ConnectionPool, handing out the idle connection returned last."""

    def _get_ready_connection(self, timeout: float | None) -> Any:
        # Called under the pool's lock, which guards the deque of idle connections: returned
        # ones are appended on the right and this takes from the left, so the most recently
        # returned moves to the front. The rest keep their order; the pool's shrinking still
        # closes the leftmost, the longest unused.
        if len(self._pool) > 1:
            self._pool.rotate(1)
        return super()._get_ready_connection(timeout)


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def existing_pool(self) -> ConnectionPool | None:
        """This process's pool of this alias if one was made, never making one (``pool`` makes
        one on first read, for the database the settings name at that moment)."""
        pools: dict[str, ConnectionPool] = self._connection_pools  # type: ignore[attr-defined]
        return pools.get(self.alias)

    @property
    def pool(self) -> ConnectionPool | None:
        made = self.existing_pool
        if made is not None:  # read on every connect: kept cheap
            return made
        pools: dict[str, ConnectionPool] = self._connection_pools  # type: ignore[attr-defined]
        options = self.settings_dict["OPTIONS"].get("pool")
        if (
            options
            and self.alias != NO_DB_ALIAS  # Django pools no maintenance connection
            and self.settings_dict["CONN_HEALTH_CHECKS"]
            and not self.settings_dict.get("CONN_MAX_AGE")  # else Django's own refusal
        ):
            # Django's pool, built as Django builds it, with the check above.
            pool = LifoConnectionPool(
                kwargs={**self.get_connection_params(), "autocommit": True},
                open=False,
                configure=self._configure_connection,  # type: ignore[attr-defined]
                check=_check_if_idle,
                **({} if options is True else options),
            )
            pools.setdefault(self.alias, pool)
        return super().pool
