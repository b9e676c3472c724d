"""Who is calling: agents by ``sbk_`` bearer token, humans by session or ``sbh_`` bearer token.

Tokens are looked up by their SHA-256 hash and the hashes compared in constant time. Unknown or
revoked tokens are 401 ``unauthorized``. Each endpoint's requests pass a token bucket shared
through Redis (ENDPOINT_RATE_LIMIT, overridable per endpoint; 0 is unlimited).
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import math
import os
import threading
import time
from typing import Any

import psycopg
from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models.base import ModelState
from django.db.models.signals import post_delete, post_init, post_save, pre_init
from django.http import HttpRequest
from django.middleware.csrf import CsrfViewMiddleware
from django.utils import timezone
from ninja.security import HttpBearer
from ninja.security.base import AuthBase

from queues.access import AgentActor, HumanActor
from queues.models import Endpoint, EndpointState, HumanToken
from queues.services import touch_endpoint
from queues.sql import hot_cursor
from switchboard.core import availability, ratelimit
from switchboard.core.errors import Forbidden, RateLimited, Unauthorized
from switchboard.core.tokens import (
    ENDPOINT_TOKEN_PREFIX,
    HUMAN_TOKEN_PREFIX,
    bearer_token,
    hash_token,
)

# What an unknown or revoked token is told (a revoked endpoint's open streams end with it too).
REVOKED_MESSAGE = "the bearer token is unknown or revoked"

log = logging.getLogger(__name__)

_ENDPOINT_FIELDS = list(Endpoint._meta.concrete_fields)
_ENDPOINT_ATTNAMES = [f.attname for f in _ENDPOINT_FIELDS]
# The array fields (scopes): copied for each request, so no request changes what another reads.
_ENDPOINT_LISTS = [i for i, f in enumerate(_ENDPOINT_FIELDS) if isinstance(f, ArrayField)]
# Every agent request runs this lookup; as plain SQL it skips the ORM's query compilation, which
# cost more than the rest of a claim, and on the hot cursor (server-side binding, binary results)
# psycopg prepares it and loads uuids and timestamps without parsing text. The owner loads lazily
# where a waiver needs it.
_ENDPOINT_BY_HASH = (
    f"SELECT {', '.join(str(f.column) for f in _ENDPOINT_FIELDS)} FROM queues_endpoint "
    "WHERE token_hash = %s"
)


class _EndpointCache:
    """Endpoint rows by token hash, kept in this process while ``endpoint_watch`` is listening.

    Every agent request authenticates, and the lookup was a third of a claim cycle's database
    round trips and transactions (issue 11). A change to an endpoint row, made anywhere (the
    services, the admin, a bulk update, plain SQL), is announced by a trigger when it commits
    (migration 0012); the web process forgets that row before it serves its next request. A
    change saved in this process empties the cache at once and again at commit. Rows are kept at
    most ``ENDPOINT_CACHE_SECONDS`` besides. The cache keeps the row's values, not a model: each
    request gets an Endpoint of its own.

    ``generation`` moves on with every forgetting: a row read from the database is kept only if
    nothing was forgotten while it was read (else a revoke committed meanwhile could be
    outlived by the row read before it).
    """

    def __init__(self) -> None:
        self._rows: dict[str, tuple[float, list[Any]]] = {}
        self._lock = threading.Lock()
        self.generation = 0

    def get(self, digest: str, ttl: float) -> list[Any] | None:
        hit = self._rows.get(digest)
        if hit is None or time.monotonic() - hit[0] >= ttl:
            return None
        return hit[1]

    def put(self, digest: str, values: list[Any], generation: int) -> None:
        with self._lock:
            if generation != self.generation:
                return  # something changed while the row was read: not kept
            if len(self._rows) >= ENDPOINT_CACHE_SIZE:
                self._rows.clear()
            self._rows[digest] = (time.monotonic(), values)

    def forget(self, digest: str) -> None:
        with self._lock:
            self.generation += 1
            self._rows.pop(digest, None)

    def clear(self) -> None:
        with self._lock:
            self.generation += 1
            self._rows.clear()


ENDPOINT_CACHE_SIZE = 10_000
endpoint_cache = _EndpointCache()

ENDPOINT_CHANNEL = "switchboard_endpoint"
# How the watch connections show in pg_stat_activity.
WATCH_APPLICATION_NAME = "switchboard endpoint watch"


class _EndpointWatch:
    """This process's LISTEN on ``switchboard_endpoint``: a connection of its own, outside the
    pool, which each cached lookup asks with an empty statement that began after the request
    arrived.

    Why that is exact: a change's notification is queued, and the listening backends signalled,
    before its commit is acknowledged; a backend hands the notifications pending to its client
    before it answers a statement (``ReadyForQuery``). So once an empty statement sent after the
    request arrived has been answered, every change committed before the request arrived has
    been applied to the cache. The statement has no snapshot, no table, no transaction ID: far
    cheaper for both sides than the token lookup on a pooled connection. Requests share them:
    one sent after a request arrived (the ASGI app's stamp, ``availability.request_arrived``)
    answers for it, whichever request sent it, so under load a request that waited for a
    worker thread usually finds one answered already and waits for no round trip of its own.

    Fails closed: while the connection is not up or an empty statement fails, ``ready()`` is
    False and every request looks its token up in the database, as without a cache; when it
    listens again the cache starts empty (changes may have been missed meanwhile). Valkey plays
    no part.
    """

    RETRY_EVERY = 1.0
    # A request waits this long for an answer another request asked for, then asks the database.
    WAIT_AT_MOST = 0.5
    # While no request asks, a thread of the process asks this often, reading the notifications
    # that arrived meanwhile. Nothing read them while the process served no agent: they filled
    # the socket, the listening backend blocked writing to it ("ClientWrite"), and a blocked
    # listener holds PostgreSQL's whole NOTIFY queue (every channel: todo_ready's too) from
    # being trimmed, until NOTIFY fails everywhere; it also stalls each DROP DATABASE (its
    # ProcSignalBarrier), which hung the test run's.
    DRAIN_EVERY = 5.0
    # The watch's own statement fails (and the connection is dropped) past this (libpq's
    # tcp_user_timeout, milliseconds), so a server that stopped answering holds no request long.
    TCP_USER_TIMEOUT_MS = 2000

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._connecting = False
        self._conn: psycopg.Connection[Any] | None = None
        self._pid = 0
        self._retry_at = 0.0
        self._asking = False  # one is on its way
        self._asked_at = 0.0  # when the one on its way was sent
        # When the last empty statement answered on this connection was sent: every change
        # committed before then has been applied to the cache.
        self._covered = -math.inf
        self._drainer_pid = 0  # the process whose drain thread runs (a fork has none)

    def ready(self, since: float | None = None) -> bool:
        """Every change committed before ``since`` (a request's arrival, ``time.monotonic()``;
        by default this call) applied to the cache; False: do not use it.

        An empty statement sent after ``since`` and answered is enough, whichever request sent
        it: under load a request usually finds one answered since it arrived, or on its way,
        and waits for no round trip of its own."""
        if since is None:
            since = time.monotonic()
        with self._cond:
            if self._conn is None or self._pid != os.getpid():
                self._conn = None  # a forked child does not share its parent's connection
                now = time.monotonic()
                if self._connecting or now < self._retry_at:
                    return False
                self._retry_at = now + self.RETRY_EVERY
                self._connecting = True
                self._cond.release()  # connecting may take connect_timeout: nobody waits on it
                try:
                    conn = self._connect()
                finally:
                    self._cond.acquire()
                    self._connecting = False
                if conn is None:
                    return False
                self._conn, self._pid = conn, os.getpid()
                self._covered = -math.inf
                endpoint_cache.clear()  # what changed while nobody listened is unknown
                self._start_draining()
            deadline = time.monotonic() + self.WAIT_AT_MOST
            while self._covered <= since:
                if self._conn is None:
                    return False  # the statement waited for failed: the connection is gone
                if self._asking:
                    # Sent after ``since``, the one on its way will do; else wait for it to
                    # come back, then send another.
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False  # slow to answer: this request asks the database
                    self._cond.wait(left)
                    continue
                self._asking = True
                conn = self._conn
                self._asked_at = sent = time.monotonic()
                self._cond.release()
                try:
                    ok = self._ask(conn)
                finally:
                    self._cond.acquire()
                    self._asking = False
                    self._cond.notify_all()
                if not ok:
                    if self._conn is conn:
                        self._drop()
                    return False
                if self._conn is conn:
                    self._covered = max(self._covered, sent)
            return True

    def _start_draining(self) -> None:
        """The drain thread of this process (under the lock), once."""
        if self._drainer_pid == os.getpid():
            return
        self._drainer_pid = os.getpid()
        threading.Thread(target=self._drain, name="endpoint-watch-drain", daemon=True).start()

    def _drain(self) -> None:
        """Ask (``ready``: an empty statement, then the notifications it brought) whenever no
        request has for ``DRAIN_EVERY``, while the connection is up; a lost one is made again
        by the next request, as before."""
        while True:
            time.sleep(self.DRAIN_EVERY)
            with self._cond:
                up = self._conn is not None and self._pid == os.getpid()
                quiet = time.monotonic() - self._asked_at >= self.DRAIN_EVERY
            if up and quiet:
                self.ready()

    def _ask(self, conn: psycopg.Connection[Any]) -> bool:
        """An empty statement, then the notifications it brought (outside the lock: libpq
        waits without the GIL, and other requests queue for the next one meanwhile)."""
        try:
            pgconn = conn.pgconn
            result = pgconn.exec_(b"")
            if result.status != psycopg.pq.ExecStatus.EMPTY_QUERY:
                raise psycopg.OperationalError(pgconn.get_error_message())
            while (note := pgconn.notifies()) is not None:
                self._note(note.extra.decode())
        except Exception:
            log.warning("endpoint watch lost; token lookups go to the database", exc_info=True)
            return False
        return True

    def _note(self, payload: str) -> None:
        if payload == "*":
            endpoint_cache.clear()
        else:
            endpoint_cache.forget(payload)

    def _connect(self) -> psycopg.Connection[Any] | None:
        """A new listening connection, or None."""
        try:
            params = connections[DEFAULT_DB_ALIAS].get_connection_params()
            params.pop("cursor_factory", None)
            params["application_name"] = WATCH_APPLICATION_NAME
            params["tcp_user_timeout"] = self.TCP_USER_TIMEOUT_MS
            params.update(
                keepalives=1, keepalives_idle=5, keepalives_interval=2, keepalives_count=2
            )
            conn = psycopg.connect(**params, autocommit=True)
        except Exception:
            log.warning(
                "endpoint watch unavailable; token lookups go to the database", exc_info=True
            )
            return None
        # What arrives during psycopg's own statements (the LISTEN) is handed here.
        conn.add_notify_handler(lambda note: self._note(note.payload))
        try:
            conn.execute(f"LISTEN {ENDPOINT_CHANNEL}")
        except Exception:
            conn.close()
            log.warning(
                "endpoint watch unavailable; token lookups go to the database", exc_info=True
            )
            return None
        return conn

    def _drop(self) -> None:
        endpoint_cache.clear()
        self._covered = -math.inf
        conn, self._conn = self._conn, None
        if conn is not None and self._pid == os.getpid():
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        with self._cond:
            while self._asking:
                self._cond.wait()
            self._drop()


endpoint_watch = _EndpointWatch()


def _forget_endpoints(**kwargs: Any) -> None:
    endpoint_cache.clear()
    # A row re-read before the change commits must not outlive it either.
    transaction.on_commit(endpoint_cache.clear)


post_save.connect(_forget_endpoints, sender=Endpoint, dispatch_uid="endpoint-cache-save")
post_delete.connect(_forget_endpoints, sender=Endpoint, dispatch_uid="endpoint-cache-delete")


def _endpoint_row(digest: str) -> list[Any] | None:
    ttl = settings.ENDPOINT_CACHE_SECONDS
    cached = ttl > 0 and endpoint_watch.ready(availability.request_arrived())
    generation = endpoint_cache.generation
    if cached:
        hit = endpoint_cache.get(digest, ttl)
        if hit is not None:
            return hit
    with hot_cursor() as cursor:
        cursor.execute(_ENDPOINT_BY_HASH, [digest])
        row = cursor.fetchone()
    if row is None:
        return None
    values = list(row)  # no field of Endpoint converts its database value (checked in tests)
    if cached:
        endpoint_cache.put(digest, values, generation)
    return values


def endpoint_for_token(token: str) -> Endpoint | None:
    if not token.startswith(ENDPOINT_TOKEN_PREFIX):
        return None
    digest = hash_token(token)
    values = _endpoint_row(digest)
    if values is None:
        return None
    fresh = values.copy()
    for i in _ENDPOINT_LISTS:
        if fresh[i] is not None:
            fresh[i] = list(fresh[i])
    endpoint = endpoint_from_row(fresh)
    if not hmac.compare_digest(endpoint.token_hash, digest):
        return None
    if endpoint.state != EndpointState.ACTIVE:
        return None
    return endpoint


def endpoint_from_row(values: list[Any]) -> Endpoint:
    """What ``Endpoint.from_db`` builds from a row of every field, without its ``__init__``
    (the signals asked, then a descriptor call per field: a fifth of the token lookup's CPU,
    issue 11), as ``queues.sql.todo_from_row`` builds a Todo; with an init signal receiver
    for Endpoint, ``from_db`` itself."""
    if (pre_init.receivers or post_init.receivers) and (
        pre_init.has_listeners(Endpoint) or post_init.has_listeners(Endpoint)
    ):
        return Endpoint.from_db(DEFAULT_DB_ALIAS, _ENDPOINT_ATTNAMES, values)
    endpoint = Endpoint.__new__(Endpoint)
    state = endpoint._state = ModelState()
    state.adding = False
    state.db = DEFAULT_DB_ALIAS
    endpoint.__dict__.update(zip(_ENDPOINT_ATTNAMES, values, strict=True))
    return endpoint


def human_for_token(token: str) -> Any:
    if not token.startswith(HUMAN_TOKEN_PREFIX):
        return None
    digest = hash_token(token)
    row = HumanToken.objects.select_related("user").filter(token_hash=digest).first()
    if row is None or row.revoked_at is not None or not hmac.compare_digest(row.token_hash, digest):
        return None
    if not row.user.is_active:
        return None
    now = timezone.now()
    if row.last_used_at is None or (now - row.last_used_at).total_seconds() > 60:
        HumanToken.objects.filter(pk=row.pk).update(last_used_at=now)
    return row.user


def endpoint_rate(endpoint: Endpoint) -> tuple[float, int]:
    """The endpoint's (rate, burst): its own where set, ENDPOINT_RATE_LIMIT's where not (a burst
    set alone keeps the fleet's rate; a rate set alone bursts to twice itself)."""
    rps, burst = settings.ENDPOINT_RATE_LIMIT
    if endpoint.rate_limit_rps is not None:
        rps = endpoint.rate_limit_rps
        burst = endpoint.rate_limit_burst or max(1, int(rps * 2))
    elif endpoint.rate_limit_burst is not None:
        burst = endpoint.rate_limit_burst
    return rps, burst


def check_endpoint_rate(endpoint: Endpoint) -> None:
    rps, burst = endpoint_rate(endpoint)
    allowed, retry_after = ratelimit.take(f"endpoint:{endpoint.id}", rate=rps, burst=burst)
    if not allowed:
        raise RateLimited(
            f"endpoint {endpoint.slug} is over its request rate ({rps:g}/s, burst {burst})",
            retry_after=retry_after,
        )


def authenticate_agent(
    request: HttpRequest | None, token: str, *, via: str, charge_rate: bool = True
) -> AgentActor:
    """The agent behind ``token`` (``request`` is not read; switchboard.asgi's agent path has
    none to give); charges the endpoint's request rate unless the caller charges
    it itself (MCP charges tool calls only, so a low rate still lets a client connect)."""
    endpoint = endpoint_for_token(token)
    if endpoint is None:
        raise Unauthorized(REVOKED_MESSAGE)
    if charge_rate:
        check_endpoint_rate(endpoint)
    touch_endpoint(endpoint)
    return AgentActor(endpoint=endpoint, via=via)


class AgentAuth(HttpBearer):
    """Bearer sbk_… for the agent verbs."""

    openapi_scheme = "bearer"

    def __call__(self, request: HttpRequest) -> AgentActor | None:
        # ninja's reading kept the spaces after the first (``Bearer  sbk_…`` was unknown).
        token = bearer_token(request.headers.get("Authorization", ""))
        return None if token is None else self.authenticate(request, token)

    def authenticate(self, request: HttpRequest, token: str) -> AgentActor | None:
        return authenticate_agent(request, token, via="api")


class HumanAuth(AuthBase):
    """A Django session (with CSRF on writes), or Bearer sbh_… personal access token."""

    openapi_type = "http"
    openapi_scheme = "bearer"

    def __call__(self, request: HttpRequest) -> HumanActor | None:
        token = bearer_token(request.headers.get("Authorization", ""))
        if token is not None:
            user = human_for_token(token)
            if user is None:
                raise Unauthorized(REVOKED_MESSAGE)
            return HumanActor(user=user, via="api")
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            if request.method not in ("GET", "HEAD", "OPTIONS"):
                _check_csrf(request)
            return HumanActor(user=user, via="api")
        return None


def _check_csrf(request: HttpRequest) -> None:

    def _noop(r: HttpRequest) -> Any:
        return None

    reason = CsrfViewMiddleware(_noop).process_view(request, _noop, (), {})
    if reason is not None:
        raise Forbidden("CSRF check failed for this session request")
