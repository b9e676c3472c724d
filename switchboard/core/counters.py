"""Prometheus counters shared by every process, kept in Redis and moved only after commit.

Web processes, Celery workers and the CLI all change todos; an in-process counter would only see
its own share. Each increment is a ``HINCRBY`` on ``switchboard:counter:<name>`` keyed by the
label values, queued with ``transaction.on_commit`` so a rolled-back claim never counts. The
``/metrics`` collector reads the hashes at scrape time.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import threading
import time
import uuid
from collections import Counter
from typing import Any

import redis
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, transaction

from switchboard.core import availability

log = logging.getLogger(__name__)
KEY_PREFIX = "switchboard:counter:"

_client_lock = threading.Lock()
_client: redis.Redis | None = None


def client() -> redis.Redis:
    global _client
    with _client_lock:
        if _client is None:
            timeout = float(getattr(settings, "REDIS_TIMEOUT_SECONDS", 1))
            _client = redis.Redis.from_url(
                settings.REDIS_URL, socket_timeout=timeout, socket_connect_timeout=timeout
            )
        return _client


def reset_client() -> None:
    """Forget the connection (after a fork, or when tests point REDIS_URL elsewhere)."""
    global _client
    with _client_lock:
        _client = None


@functools.lru_cache(maxsize=8192)
def _label_key(items: tuple[tuple[str, str], ...]) -> str:
    return json.dumps(dict(items), sort_keys=True, separators=(",", ":"))


def label_key(labels: dict[str, str]) -> str:
    return _label_key(tuple(sorted(labels.items())))


class _Batch:
    """The increments of one transaction, sent in one round trip after it commits."""

    def __init__(self) -> None:
        self.items: Counter[tuple[str, str]] = Counter()

    def flush(self) -> None:
        _send(self.items)


Increment = tuple[str, dict[str, str], int]


def incr(name: str, labels: dict[str, str], amount: int = 1) -> None:
    """Count after the surrounding transaction commits (at once when there is none)."""
    incr_many([(name, labels, amount)])


def incr_many(increments: list[Increment]) -> None:
    items: Counter[tuple[str, str]] = Counter()
    for name, labels, amount in increments:
        items[(name, label_key(labels))] += amount
    _incr(items)


# An increment whose label key is already made: (counter name, ``label_key(labels)``), amount.
Keyed = tuple[tuple[str, str], int]


def incr_keyed(increments: tuple[Keyed, ...], connection: Any = None) -> None:
    """``incr_many`` of increments whose keys the caller made once (``label_key``): the claim
    path counts on every claim and every ending (issue 12: its Python per cycle).
    ``connection``: the default database's, when the caller holds it already."""
    if connection is None:
        connection = connections[DEFAULT_DB_ALIAS]
    if not connection.in_atomic_block:
        # Committed already (autocommit): straight into the buffer the flusher sends.
        with _buffer_lock:
            for key, amount in increments:
                _buffer[key] += amount
        _ensure_flusher()
        return
    items: Counter[tuple[str, str]] = Counter()
    for key, amount in increments:
        items[key] += amount
    _incr(items, connection)


def _incr(items: Counter[tuple[str, str]], connection: Any = None) -> None:
    if connection is None:
        connection = connections[DEFAULT_DB_ALIAS]
    if not connection.in_atomic_block:
        _send(items)
        return
    batch: _Batch | None = getattr(connection, "_switchboard_counter_batch", None)
    # A rollback clears the commit hooks; a batch that is no longer registered is stale.
    registered = batch is not None and any(
        getattr(hook[1], "__self__", None) is batch for hook in connection.run_on_commit
    )
    if batch is None or not registered:
        batch = _Batch()
        connection._switchboard_counter_batch = batch
        transaction.on_commit(batch.flush)
    batch.items.update(items)


# Committed increments wait here until the flusher thread sends them, so a claim does not pay a
# Redis round trip. Reads (read/value, the /metrics collector) flush this process's buffer first.
FLUSH_INTERVAL_SECONDS = 0.25
_buffer: Counter[tuple[str, str]] = Counter()
_buffer_lock = threading.Lock()
_flusher_pid: int | None = None


def _send(items: Counter[tuple[str, str]]) -> None:
    if not items:
        return
    with _buffer_lock:
        _buffer.update(items)
    _ensure_flusher()


_flush_lock = threading.Lock()


def flush() -> None:
    """Send this process's buffered increments now.

    One flush at a time: the exit-time flush must wait for a send the flusher thread has
    already taken from the buffer, or a process that exits just then would lose it."""
    with _flush_lock:
        _flush_locked()


def flush_at_exit() -> int:
    """The process's last flush, at a graceful stop: Redis is tried once more even while the
    breaker is open (a stall a moment ago need not cost what it kept), within its bound. What it
    still cannot send goes with the process: said in a WARNING, with how many, as /metrics is
    behind the database by them (regress9b: lost without a word). Answers how many."""
    availability.redis_breaker.reset()
    flush()
    with _flush_lock, _buffer_lock:
        lost = sum(_buffer.values()) + sum(sum(b.values()) for _, b in _unacknowledged)
        # Gone with the process: a second exit hook (the lifespan's, then atexit's) neither
        # waits on Redis again nor says it twice.
        _buffer.clear()
        _unacknowledged.clear()
    if lost:
        log.warning(
            "%d counter increments lost at exit: Redis did not answer; /metrics stays behind "
            "the database by them",
            lost,
        )
    return lost


# Applies one flush at most once: a flush whose answer was lost (a timeout while Redis was
# stalled) is re-sent with the same id, and Redis, having applied it, skips it.
_APPLY_ONCE = """
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', 86400) then
  for i = 1, #ARGV, 3 do
    redis.call('HINCRBY', ARGV[i], ARGV[i + 1], ARGV[i + 2])
  end
  return 1
end
return 0
"""
FLUSH_KEY_PREFIX = "switchboard:flush:"
# Flushes sent and not acknowledged, oldest first: re-sent as they were, under their own id.
_unacknowledged: list[tuple[str, Counter[tuple[str, str]]]] = []


def _flush_locked() -> None:
    with _buffer_lock:
        items = _buffer.copy()
        _buffer.clear()
    if items:
        _unacknowledged.append((uuid.uuid4().hex, items))
    while _unacknowledged:
        if not availability.redis_breaker.allow():
            return  # kept; sent once Redis answers again
        flush_id, batch = _unacknowledged[0]
        args: list[str | int] = []
        for (name, key), amount in batch.items():
            args.extend((KEY_PREFIX + name, key, amount))
        try:
            client().eval(_APPLY_ONCE, 1, FLUSH_KEY_PREFIX + flush_id, *args)
        except redis.RedisError:
            availability.redis_breaker.failed()
            log.warning("could not record %d counter increments; keeping them", sum(batch.values()))
            return
        _unacknowledged.pop(0)


def _ensure_flusher() -> None:
    global _flusher_pid
    if _flusher_pid == os.getpid():
        return
    with _client_lock:
        if _flusher_pid == os.getpid():
            return
        _flusher_pid = os.getpid()
        threading.Thread(target=_flush_forever, name="counter-flusher", daemon=True).start()
        atexit.register(flush_at_exit)


def _flush_forever() -> None:
    while True:
        time.sleep(FLUSH_INTERVAL_SECONDS)
        flush()


def _after_fork_in_child() -> None:
    # A forked worker must not send its parent's buffer again, nor rely on its parent's thread.
    global _flusher_pid, _client, _flush_lock
    _buffer.clear()
    _unacknowledged.clear()
    _flush_lock = threading.Lock()
    _flusher_pid = None
    _client = None


os.register_at_fork(after_in_child=_after_fork_in_child)


def read(name: str) -> dict[tuple[tuple[str, str], ...], int]:
    """Every label set of a counter and its value (``BreakerOpen`` while Redis is skipped)."""
    flush()
    availability.redis_breaker.check()
    raw: dict[bytes, bytes] = client().hgetall(KEY_PREFIX + name)  # type: ignore[assignment]
    out: dict[tuple[tuple[str, str], ...], int] = {}
    for key, value in raw.items():
        labels = json.loads(key)
        out[tuple(sorted(labels.items()))] = int(value)
    return out


def value(name: str, labels: dict[str, str]) -> int:
    flush()
    raw = client().hget(KEY_PREFIX + name, label_key(labels))
    return int(raw) if raw is not None else 0
