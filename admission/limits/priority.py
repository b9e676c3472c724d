"""Queue priority with aging in claim_next: a todo's score is its queue's ``priority`` plus one
step per ``aging_seconds`` it has waited; claim_next takes the highest score, then the oldest.
The highest-scoring todo of a queue is its oldest, so this orders queues by their head's score.

Which queue names have settings is cached per process for ``QUEUE_SETTINGS_CACHE_SECONDS`` (a
write in this process clears it at commit), so a claim_next over queues without settings runs
exactly today's oldest-first statement and pays nothing. The values themselves are read inside
the claiming statement, never cached. A setting created in another process orders claims here
within that many seconds: priority is an ordering preference, not a limit.
"""

from __future__ import annotations

import functools
import threading
import time

from django.conf import settings

from admission.limits.models import QueueSettings

_lock = threading.Lock()
_names: frozenset[str] = frozenset()
_read_at = float("-inf")


@functools.cache
def _ttl() -> float:
    return float(getattr(settings, "QUEUE_SETTINGS_CACHE_SECONDS", 2.0))


def forget() -> None:
    """After a change in this process: read the names again at the next claim."""
    global _read_at
    with _lock:
        _read_at = float("-inf")


def _known() -> frozenset[str]:
    global _names, _read_at
    now = time.monotonic()
    if now - _read_at < _ttl():  # the common case: one read of two module globals, no lock
        return _names
    names = frozenset(QueueSettings.objects.values_list("queue", flat=True))
    with _lock:
        _names, _read_at = names, now
    return names


class QueuePriority:
    def applies(self, queues: list[str]) -> bool:
        known = _known()
        return bool(known) and not known.isdisjoint(queues)

    def score(self, alias: str) -> str:
        return f"""coalesce((
            SELECT qs.priority + CASE WHEN qs.aging_seconds IS NULL THEN 0 ELSE floor(
                GREATEST(0, extract(epoch FROM now() - {alias}.created_at)) / qs.aging_seconds
            )::bigint END
            FROM limits_queuesettings qs WHERE qs.queue = {alias}.queue), 0)"""
