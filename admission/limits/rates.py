"""Adaptive rate limits: claims per minute under a limit that halves with each 429 observed.

effective = max(floor, base >> (n * step)), n = the observations within the decay window before now
and step the rate limit's ``decay_step`` (halvings per observation; 1 by default, 0: no decay)
(an observation at ``t`` counts while ``now - window < t <= now``). Read from the observation
rows every time, never cached.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

from admission.limits.models import RateLimit, RateObservation
from queues.access import AgentActor
from switchboard.core.errors import InvalidArgument


def effective_limit(base: int, floor: int, observations: int, step: int = 1) -> int:
    # base >> n for n past the bit length is 0, which the floor lifts.
    return max(floor, base >> min(observations * step, 63))


def minute_of(now: datetime) -> datetime:
    return now.replace(second=0, microsecond=0)


@dataclass(frozen=True)
class RateState:
    name: str
    base_limit: int
    floor: int
    decay_window_seconds: int
    posture: str
    observations: int
    # The newest NEWEST_READ of the observations in the window, oldest first: when the limit
    # rises over the claims used, as they age out (an older one cannot be that one).
    newest_observations: tuple[datetime, ...]
    used: int  # claims admitted this minute
    now: datetime
    decay_step: int = 1

    @property
    def effective(self) -> int:
        return effective_limit(self.base_limit, self.floor, self.observations, self.decay_step)

    @property
    def exceeded(self) -> bool:
        return self.posture != "off" and self.used >= self.effective

    @property
    def next_eligible_at(self) -> datetime:
        """The next minute boundary, or sooner the moment enough observations have aged out
        that the limit (doubling as each does) is over this minute's claims."""
        boundary = minute_of(self.now) + timedelta(minutes=1)
        window = timedelta(seconds=self.decay_window_seconds)
        unread = self.observations - len(self.newest_observations)
        for aged, observed in enumerate(self.newest_observations, start=unread + 1):
            ages_out = observed + window
            if ages_out >= boundary:
                break
            left = self.observations - aged
            if effective_limit(self.base_limit, self.floor, left, self.decay_step) > self.used:
                return ages_out
        return boundary

    @property
    def exact(self) -> bool:
        return self.next_eligible_at == minute_of(self.now) + timedelta(minutes=1)


# With this many observations left in the window the limit is its floor (``effective_limit``
# shifts by at most 63), which the claims used have reached when the limit holds: the older
# ones' age-outs raise nothing, so they are counted, not read.
NEWEST_READ = 64

_STATE_SQL = f"""
SELECT r.id, r.name, r.base_limit, r.floor, r.decay_window_seconds, r.posture,
       (SELECT count(*) FROM limits_rateobservation o
        WHERE o.rate_limit_id = r.id AND o.observed_at <= %(now)s
          AND o.observed_at > %(now)s - make_interval(secs => r.decay_window_seconds)),
       (SELECT array_agg(newest.observed_at ORDER BY newest.observed_at) FROM (
          SELECT o.observed_at FROM limits_rateobservation o
          WHERE o.rate_limit_id = r.id AND o.observed_at <= %(now)s
            AND o.observed_at > %(now)s - make_interval(secs => r.decay_window_seconds)
          ORDER BY o.observed_at DESC LIMIT {NEWEST_READ}) newest),
       coalesce((SELECT m.used FROM limits_rateminute m
                 WHERE m.rate_limit_id = r.id AND m.minute = %(minute)s), 0),
       r.decay_step
FROM limits_ratelimit r WHERE r.name = %(name)s
"""


def lock(cursor: CursorWrapper, name: str) -> None:
    # NO KEY UPDATE: it serialises the claims of a rate limit and its changes (``limit_set``
    # locks FOR UPDATE) as FOR UPDATE did, without waiting for, or holding up, the intakes that
    # hold the declaration (``intake``: FOR KEY SHARE) while they write a todo naming it.
    cursor.execute("SELECT id FROM limits_ratelimit WHERE name = %s FOR NO KEY UPDATE", [name])


def read(cursor: Any, name: str, now: datetime | None = None) -> tuple[int, RateState] | None:
    """The rate limit's state at ``now`` (its row id, and the state). Under ``lock`` in the claim
    (a later statement, so it sees every claim the lock waited for)."""
    now = now or timezone.now()
    cursor.execute(_STATE_SQL, {"now": now, "minute": minute_of(now), "name": name})
    row = cursor.fetchone()
    if row is None:
        return None
    rid, name, base, floor, window, posture, observations, newest, used, step = row
    return rid, RateState(
        name, base, floor, window, posture, observations, tuple(newest or ()), used, now, step
    )


def state(name: str, now: datetime | None = None) -> RateState | None:
    with connection.cursor() as cursor:
        found = read(cursor, name, now)
    return found[1] if found else None


def charge(cursor: CursorWrapper, rate_id: int, now: datetime) -> None:
    cursor.execute(
        """
        INSERT INTO limits_rateminute (rate_limit_id, minute, used) VALUES (%s, %s, 1)
        ON CONFLICT (rate_limit_id, minute) DO UPDATE SET used = limits_rateminute.used + 1
        """,
        [rate_id, minute_of(now)],
    )


def observe(*, rate_limit: str, actor: Any, todo_id: Any = None) -> RateObservation:
    """Record one 429 against a declared rate limit (``report_rate_limited``, ``fail``)."""
    declared = RateLimit.objects.filter(name=rate_limit).first()
    if declared is None:
        raise InvalidArgument(f"rate limit {rate_limit!r} is not declared", field="rate_limit")
    return RateObservation.objects.create(
        rate_limit=declared,
        observed_at=timezone.now(),
        endpoint_id=actor.endpoint.id if isinstance(actor, AgentActor) else None,
        todo_id=todo_id,
    )
