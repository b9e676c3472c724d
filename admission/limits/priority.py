"""Queue priority with aging in claim_next: a todo's score is its queue's ``priority`` plus one
step per ``aging_seconds`` it has waited; claim_next takes the highest score, then the oldest.
The highest-scoring todo of a queue is its oldest, so this orders queues by their head's score.

Which queue names have settings is known per process without a query of its own: a write here
adds its name at once, and every ``QUEUE_SETTINGS_CACHE_SECONDS`` the next claim_next statement
carries the names back as one more column (so a claim stays one statement). A claim_next over
queues without settings runs exactly today's oldest-first statement; the values themselves are
read inside the claiming statement, never cached. A setting written in another process orders
claims here within that many seconds: priority is an ordering preference, not a limit.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from switchboard.core import hotsettings

_names: frozenset[str] = frozenset()
_read_at = float("-inf")


def _ttl() -> float:
    # Kept until override_settings changes it (switchboard.core.hotsettings).
    return float(hotsettings.setting("QUEUE_SETTINGS_CACHE_SECONDS"))


def learn(queue: str) -> None:
    """A queue's settings were written in this process: order by them from the next claim."""
    global _names
    _names = _names | {queue}


class QueuePriority:
    def applies(self, queues: list[str]) -> bool:
        known = _names
        return bool(known) and not known.isdisjoint(queues)

    def stale(self) -> bool:
        return time.monotonic() - _read_at >= _ttl()

    def names_sql(self) -> str:
        return "ARRAY(SELECT qs.queue FROM limits_queuesettings qs)"

    def refresh(self, names: Iterable[str]) -> None:
        global _names, _read_at
        _names, _read_at = frozenset(names), time.monotonic()

    def score(self, alias: str) -> str:
        return f"""coalesce((
            SELECT qs.priority + CASE WHEN qs.aging_seconds IS NULL THEN 0 ELSE floor(
                GREATEST(0, extract(epoch FROM now() - {alias}.created_at)) / qs.aging_seconds
            )::bigint END
            FROM limits_queuesettings qs WHERE qs.queue = {alias}.queue), 0)"""
