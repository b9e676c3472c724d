"""Django's PostgreSQL backend; its connection pool checks a connection only after it sat idle.

With ``CONN_HEALTH_CHECKS`` Django's pool checks every connection it hands out with a round trip
to the server (an empty query): one more round trip per request, a third of an agent request's
(issue 11). A connection whose last use ended less than ``IDLE_CHECK_SECONDS`` ago has just
proved itself; one that broke in use is discarded by the pool when it comes back. So only a
connection idle that long is checked: after a PostgreSQL restart (which takes longer than that)
every connection kept from before is checked, and replaced, before a request can get it.
"""

from __future__ import annotations

import time
from typing import Any

from django.db.backends.postgresql import base
from psycopg_pool import ConnectionPool

IDLE_CHECK_SECONDS = 1.0


def _returned(conn: Any) -> None:
    """The pool's ``reset`` callback: when the connection came back (idle, nothing to reset)."""
    conn._switchboard_returned_at = time.monotonic()


def _check_if_idle(conn: Any) -> None:
    """The pool's ``check`` callback: a round trip only for a connection idle for a while."""
    returned = getattr(conn, "_switchboard_returned_at", None)
    if returned is not None and time.monotonic() - returned < IDLE_CHECK_SECONDS:
        return
    ConnectionPool.check_connection(conn)


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def pool(self) -> ConnectionPool | None:
        options = self.settings_dict["OPTIONS"].get("pool")
        if (
            options
            and self.alias not in self._connection_pools
            and self.settings_dict["CONN_HEALTH_CHECKS"]
            and not self.settings_dict.get("CONN_MAX_AGE")  # else Django's own refusal
        ):
            # Django's pool, built as Django builds it, with the two callbacks above.
            pool = ConnectionPool(
                kwargs={**self.get_connection_params(), "autocommit": True},
                open=False,
                configure=self._configure_connection,
                check=_check_if_idle,
                reset=_returned,
                **({} if options is True else options),
            )
            self._connection_pools.setdefault(self.alias, pool)
        return super().pool  # type: ignore[no-any-return]

