"""Prometheus counters shared by every process, kept in Redis and moved only after commit.

Web processes, Celery workers and the CLI all change todos; an in-process counter would only see
its own share. Each increment is a ``HINCRBY`` on ``switchboard:counter:<name>`` keyed by the
label values, queued with ``transaction.on_commit`` so a rolled-back claim never counts. The
``/metrics`` collector reads the hashes at scrape time.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter

import redis
from django.conf import settings
from django.db import transaction

log = logging.getLogger(__name__)
KEY_PREFIX = "switchboard:counter:"

_client_lock = threading.Lock()
_client: redis.Redis | None = None


def client() -> redis.Redis:
    global _client
    with _client_lock:
        if _client is None:
            _client = redis.Redis.from_url(
                settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2
            )
        return _client


def reset_client() -> None:
    """Forget the connection (after a fork, or when tests point REDIS_URL elsewhere)."""
    global _client
    with _client_lock:
        _client = None


def label_key(labels: dict[str, str]) -> str:
    return json.dumps(labels, sort_keys=True, separators=(",", ":"))


class _Batch:
    """The increments of one transaction, sent in one round trip after it commits."""

    def __init__(self) -> None:
        self.items: Counter[tuple[str, str]] = Counter()

    def add(self, name: str, key: str, amount: int) -> None:
        self.items[(name, key)] += amount

    def flush(self) -> None:
        _send(self.items)


def incr(name: str, labels: dict[str, str], amount: int = 1) -> None:
    """Count after the surrounding transaction commits (at once when there is none)."""
    key = label_key(labels)
    connection = transaction.get_connection()
    if not connection.in_atomic_block:
        _send(Counter({(name, key): amount}))
        return
    batch: _Batch | None = getattr(connection, "_switchboard_counter_batch", None)
    # A rollback clears the commit hooks; a batch that is no longer registered is stale.
    registered = batch is not None and any(
        getattr(hook[1], "__self__", None) is batch for hook in connection.run_on_commit
    )
    if batch is None or not registered:
        batch = _Batch()
        connection._switchboard_counter_batch = batch  # type: ignore[attr-defined]
        transaction.on_commit(batch.flush)
    batch.add(name, key, amount)


def _send(items: Counter[tuple[str, str]]) -> None:
    if not items:
        return
    try:
        pipe = client().pipeline(transaction=False)
        for (name, key), amount in items.items():
            pipe.hincrby(KEY_PREFIX + name, key, amount)
        pipe.execute()
    except redis.RedisError:
        log.exception("could not record %d counter increments", len(items))


def read(name: str) -> dict[tuple[tuple[str, str], ...], int]:
    """Every label set of a counter and its value."""
    raw: dict[bytes, bytes] = client().hgetall(KEY_PREFIX + name)  # type: ignore[assignment]
    out: dict[tuple[tuple[str, str], ...], int] = {}
    for key, value in raw.items():
        labels = json.loads(key)
        out[tuple(sorted(labels.items()))] = int(value)
    return out


def value(name: str, labels: dict[str, str]) -> int:
    raw = client().hget(KEY_PREFIX + name, label_key(labels))
    return int(raw) if raw is not None else 0  # type: ignore[arg-type]
