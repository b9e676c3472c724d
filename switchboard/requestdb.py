"""The agents' REST and MCP POSTs keep their thread's pooled database connection between them.

Django sends ``request_started`` and ``request_finished`` around every request; their receivers
(``close_old_connections`` above all) give the thread's connection back to the pool at the end
(``CONN_MAX_AGE`` is 0 with the pool), and the next request takes one again: the pool's
``getconn`` and ``putconn``, Django's ``connect()`` (its ``connection_created`` signal included)
and the two signals' dispatch cost about a tenth of an agent request's CPU in the web process
(issue 11; py-spy ``--gil`` under the HTTP bench: signals 7.4 %, ``ensure_connection`` 3.8 %).

``AgentRequest`` does what those receivers do, in the same order, except that a connection an
agent's request leaves clean is kept by its thread for that thread's next request. It stays
exactly as safe as giving it back:

* **Kept only clean**: autocommit on (as ``settings`` wants it), no atomic block, no error since
  its last commit, psycopg's transaction status idle, not closed, not broken. Anything else is
  handled as Django handles it (``close_if_unusable_or_obsolete``): the pool's ``putconn``
  rolls back or discards it. A request never sees another's transaction or a broken connection.
* **Kept briefly**: a connection idle ``IDLE_CHECK_SECONDS`` (the pool's own: past that, the
  pool proves a connection with a round trip before handing it out) is given back before the
  request starts, so it is checked as before; the worker pool gives a thread's kept connection
  back once the thread has waited that long for work (``give_back``). Kept at most
  ``KEEP_AT_MOST_SECONDS`` in all, then given back, so the pool's lifetime limit still applies.
* **Only what it mirrors**: the signals' receivers must be Django's own (``reset_queries`` and
  ``close_old_connections``; ``close_old_connections``, ``close_caches`` and ``reset_urlconf``);
  while another is connected, the signals are sent as before. Only a pooled connection is kept
  (``DATABASE_POOL``; without it ``CONN_MAX_AGE`` decides, as in Django).

What the receivers' work costs is kept small (issue 11: started and finished were ~13 % of a
REST request's CPU in the web thread): the thread's connection wrappers are looked up once per
request, by alias (``connections.all`` twice, through asgiref's ``Local``, cost more), and
``close_caches`` is skipped while no configured cache backend has a ``close`` of its own (every
one of Django's ``BaseCache.close`` does nothing), checked again whenever ``CACHES`` changes.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from django.core import signals
from django.core.cache import caches, close_caches
from django.core.cache.backends.base import BaseCache
from django.core.handlers.base import reset_urlconf
from django.db import close_old_connections, connections, reset_queries
from django.db.backends.base.base import BaseDatabaseWrapper
from django.urls.base import _urlconfs  # type: ignore[attr-defined]
from django.utils.module_loading import import_string
from psycopg.pq import TransactionStatus

# The window is the pool's (``pgpool.IDLE_CHECK_SECONDS``), read where it is used: one name, so
# nothing can set the pool's and leave a copy here behind.
from switchboard.pgpool import base as pgpool

# A connection kept by its thread goes back to the pool after this long, busy or not.
KEEP_AT_MOST_SECONDS = 30.0

_STARTED = frozenset((reset_queries, close_old_connections))
_FINISHED = frozenset((close_old_connections, close_caches, reset_urlconf))
# The attribute of a DatabaseWrapper (one per thread and alias) recording what its thread kept:
# (the psycopg connection, when it was first kept, when last used).
_KEPT = "_switchboard_kept"


def _receivers(signal: Any, sender: type) -> frozenset[Any] | None:
    """The signal's live receivers for ``sender`` (in any order: Django's test client
    reconnects ``close_old_connections``), or None when they cannot be read or repeat."""
    try:
        sync, asynchronous = signal._live_receivers(sender)
    except Exception:
        return None
    found = frozenset(sync)
    return None if asynchronous or len(found) != len(sync) else found


class AgentRequest:
    """The request signals' work for the agents' lean path (REST and MCP POSTs), keeping clean
    connections."""

    def __init__(self, sender: type) -> None:
        self.sender = sender
        self._started: list[Any] = []
        self._finished: list[Any] = []
        self.mirrored = False
        self._look()
        self._cache_settings: Any = None
        self._caches_close = True

    def _look(self) -> None:
        """Whether the receivers are Django's own, as they are now."""
        self._started = list(signals.request_started.receivers)
        self._finished = list(signals.request_finished.receivers)
        self.mirrored = (
            _receivers(signals.request_started, self.sender) == _STARTED
            and _receivers(signals.request_finished, self.sender) == _FINISHED
        )

    def _mirrors(self) -> bool:
        """Whether the receivers are still those looked at (else looks again: a test's or a
        later app's receiver connected or disconnected)."""
        if not (
            _same(signals.request_started.receivers, self._started)
            and _same(signals.request_finished.receivers, self._finished)
        ):
            self._look()
        return self.mirrored

    def started(self, scope: dict[str, Any]) -> list[BaseDatabaseWrapper] | None:
        """``request_started``'s work. Returns the thread's connection wrappers, which
        ``finished`` is to be given (it then mirrors ``request_finished``); None when the signal
        was sent (``finished`` sends its own).

        Every alias's wrapper is made here if this thread has none yet (a wrapper is a Python
        object: it connects on first use), so that ``finished`` sees the connection the request
        opens without looking the wrappers up again; a wrapper never connected is left alone
        by both, as ``connections.all(initialized_only=True)`` would leave it out."""
        if not self._mirrors():
            signals.request_started.send(sender=self.sender, scope=scope)
            return None
        now = time.monotonic()
        wrappers = [connections[alias] for alias in connections]
        for conn in wrappers:  # reset_queries
            conn.queries_log.clear()
        for conn in wrappers:  # close_old_connections, but a fresh kept one stays
            if conn.connection is not None and not _fresh(conn, now):
                _forget(conn)
                conn.close_if_unusable_or_obsolete()
        return wrappers

    def finished(self, mirrored: list[BaseDatabaseWrapper] | None) -> None:
        """``request_finished``'s work, given what ``started`` returned (sent as a signal
        unless ``started`` mirrored)."""
        if mirrored is None:
            signals.request_finished.send(sender=self.sender)
            return
        now = time.monotonic()
        try:
            for conn in mirrored:
                if conn.connection is not None and not _keep(conn, now):
                    _forget(conn)
                    conn.close_if_unusable_or_obsolete()
        finally:
            if self._closes_caches():
                close_caches()
            if _urlconf_set():
                reset_urlconf(sender=self.sender)

    def _closes_caches(self) -> bool:
        """Whether ``close_caches`` may do anything: some configured backend's ``close`` is
        not ``BaseCache.close`` (which does nothing). Looked at again when ``CACHES``
        changes (Django then sets ``caches.settings`` anew)."""
        current = caches.settings
        if current is not self._cache_settings:
            try:
                self._caches_close = any(
                    import_string(options["BACKEND"]).close is not BaseCache.close
                    for options in current.values()
                )
            except Exception:
                self._caches_close = True  # unknown: close them, as Django would
            self._cache_settings = current
        return self._caches_close


def _same(receivers: list[Any], snapshot: list[Any]) -> bool:
    """The same receivers as looked at: the same entries (a list's ``==`` takes the same object
    as equal without comparing it, in C; an equal entry is the same receiver, key and ref)."""
    return receivers == snapshot


def _urlconf_set() -> bool:
    """Whether this thread has a URLconf of its own (``set_urlconf``), which ``reset_urlconf``
    removes. Read from asgiref's storage (pinned), as ``Local`` reads it for this thread:
    asking ``Local`` itself when none is set raises and formats an AttributeError, ~2.5 µs
    a request (issue 11). True (reset as Django does) when the storage is not as expected."""
    try:
        storage = _urlconfs._storage._data.get(None)
        return storage is not None and (
            storage.thread_id != threading.get_ident() or "value" in storage.data
        )
    except AttributeError:
        return True


def _fresh(conn: BaseDatabaseWrapper, now: float) -> bool:
    """The connection this thread kept, used less than the pool's ``IDLE_CHECK_SECONDS`` ago and
    clean."""
    kept = getattr(conn, _KEPT, None)
    raw = conn.connection
    return (
        raw is not None
        and kept is not None
        and kept[0] is raw
        and now - kept[2] < pgpool.IDLE_CHECK_SECONDS
        and now - kept[1] < KEEP_AT_MOST_SECONDS
        and _clean(conn)
    )


def _clean(conn: BaseDatabaseWrapper) -> bool:
    raw = conn.connection
    return (
        raw is not None
        and conn.autocommit
        and conn.settings_dict["AUTOCOMMIT"]
        and not conn.in_atomic_block
        and not conn.errors_occurred
        and not conn.needs_rollback
        and not raw.closed
        and not raw.broken
        and raw.info.transaction_status == TransactionStatus.IDLE
    )


def _keep(conn: BaseDatabaseWrapper, now: float) -> bool:
    """Keep the connection for this thread's next request, if it is clean (and recorded)."""
    raw = conn.connection
    if raw is None or getattr(conn, "pool", None) is None or not _clean(conn):
        return False
    kept: tuple[Any, float, float] | None = getattr(conn, _KEPT, None)
    # Kept since ``first`` if the last request kept this very connection (the pool hands the
    # same psycopg connection out again after a Django request gave it back: a new keeping).
    first = now
    if kept is not None and kept[0] is raw and now - kept[2] < pgpool.IDLE_CHECK_SECONDS:
        first = kept[1]
    if now - first >= KEEP_AT_MOST_SECONDS:
        return False
    setattr(conn, _KEPT, (raw, first, now))
    return True


def _forget(conn: BaseDatabaseWrapper) -> None:
    setattr(conn, _KEPT, None)


def give_back() -> None:
    """In a worker thread that waited a while for work: its kept connections back to the pool
    (as a request would at its start)."""
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None:
            _forget(conn)
            conn.close_if_unusable_or_obsolete()
