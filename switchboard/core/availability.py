"""Fail fast, change nothing, say when to retry.

* ``Unavailable``: PostgreSQL or Redis did not answer within its bound (the timeouts in
  settings: connect, pool, lock and statement for PostgreSQL; socket timeouts for Redis). Every
  surface answers it as 503 ``unavailable`` with ``Retry-After``; ``is_outage`` recognises the
  driver errors that mean it.
* The request deadline: a request that waited (for a pool connection, a lock) past
  ``REQUEST_DEADLINE_SECONDS`` since it arrived is refused before its transaction writes, so no
  claim or create is made for a client that has given up. ``check_deadline()`` is called by the
  writes after their connection is in hand.
* ``redis_breaker``: a stalled Redis costs one request its timeout, once per stall. After a
  failure the breaker stays open for ``REDIS_BREAKER_OPEN_SECONDS``: callers skip Redis (the
  rate limiter admits, counters stay buffered, /metrics reports a collection error) instead of
  each waiting out the timeout again.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings

from switchboard.core.errors import DomainError

RETRY_AFTER_SECONDS = 2


class Unavailable(DomainError):
    code = "unavailable"
    status = 503

    def __init__(self, message: str, **details: object) -> None:
        details.setdefault("retry_after", RETRY_AFTER_SECONDS)
        super().__init__(message, **details)


def is_outage(exc: BaseException) -> bool:
    """Whether an error means a dependency did not answer in time (not a bug)."""
    import psycopg
    import redis
    from django.db import InterfaceError, OperationalError

    if isinstance(exc, OperationalError | InterfaceError | psycopg.OperationalError):
        return True
    from psycopg_pool import PoolTimeout

    if isinstance(exc, PoolTimeout):
        return True
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError | BreakerOpen):
        return True
    cause = exc.__cause__
    return cause is not None and cause is not exc and is_outage(cause)


def outage(exc: BaseException) -> Unavailable:
    import redis

    what = "redis" if isinstance(exc, redis.RedisError | BreakerOpen) else "database"
    return Unavailable(
        f"the {what} did not answer in time; nothing was changed, retry later", dependency=what
    )


# --- the request deadline ---------------------------------------------------------------------

_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "switchboard_deadline", default=None
)


_arrived: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "switchboard_arrived", default=None
)


@contextmanager
def request_deadline(arrived: float) -> Iterator[None]:
    """Within the block, ``check_deadline`` refuses once the request is older than allowed."""
    token = _deadline.set(arrived + float(settings.REQUEST_DEADLINE_SECONDS))
    arrival = _arrived.set(arrived)
    try:
        yield
    finally:
        _arrived.reset(arrival)
        _deadline.reset(token)


def request_arrived() -> float | None:
    """When the request being served arrived (``time.monotonic()``), or None outside one."""
    return _arrived.get()


def check_deadline() -> None:
    """Refuse to start a write for a request past its deadline (no-op outside a request)."""
    deadline = _deadline.get()
    if deadline is not None and time.monotonic() > deadline:
        raise Unavailable(
            "the request waited past its deadline before it could start; nothing was changed",
            dependency="database",
        )


# --- the Redis circuit breaker ----------------------------------------------------------------


class BreakerOpen(Exception):
    """Redis failed a moment ago; not tried again until the open period ends."""


class Breaker:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open_until = 0.0

    def allow(self) -> bool:
        return time.monotonic() >= self._open_until

    def check(self) -> None:
        if not self.allow():
            raise BreakerOpen("redis is not answering; skipped")

    def failed(self) -> None:
        with self._lock:
            self._open_until = time.monotonic() + float(settings.REDIS_BREAKER_OPEN_SECONDS)

    def reset(self) -> None:
        with self._lock:
            self._open_until = 0.0


redis_breaker = Breaker()
