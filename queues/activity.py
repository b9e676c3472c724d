"""Reads for "what is the fleet doing": claims, completions and failures per queue and minute
over the last hour (the throughput chart), and each endpoint's last sighting and what it holds now
(the agents view). Each is a fixed number of queries however many queues or endpoints there are.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.db import connection
from django.utils import timezone

from queues import sql
from queues.access import HUMAN_PREFIX
from queues.models import Endpoint, EndpointState, Todo
from queues.sql.activity import HELD_SQL, HOLDING_SQL, THROUGHPUT_SQL

WINDOW_MINUTES = 60
# Claimed todos listed per endpoint on the agents view; the count says how many there are.
HELD_SHOWN = 5
SERIES = ("claims", "completions", "failures")


@dataclass
class QueueThroughput:
    """One queue's last hour: per series, a count for each minute, oldest first."""

    queue: str
    minutes: list[datetime]
    series: dict[str, list[int]] = field(default_factory=dict)

    def total(self, kind: str) -> int:
        return sum(self.series[kind])

    def peak(self, kind: str) -> tuple[int, datetime | None]:
        counts = self.series[kind]
        top = max(counts, default=0)
        return top, (self.minutes[counts.index(top)] if top else None)

    @property
    def busiest(self) -> int:
        return max((max(v, default=0) for v in self.series.values()), default=0)

    @property
    def active(self) -> int:
        return sum(self.total(kind) for kind in SERIES)


def throughput(
    endpoint_ids: Iterable[UUID], *, now: datetime | None = None
) -> list[QueueThroughput]:
    """Claims, completions and failures per minute over the last hour, per queue name, for the
    given endpoints; busiest queue first, quiet queues left out. One query."""
    now = now or timezone.now()
    end = now.replace(second=0, microsecond=0)
    minutes = [end - timedelta(minutes=i) for i in range(WINDOW_MINUTES - 1, -1, -1)]
    index = {m: i for i, m in enumerate(minutes)}
    with connection.cursor() as cursor:
        cursor.execute(THROUGHPUT_SQL, {"since": minutes[0], "endpoints": list(endpoint_ids)})
        rows = cursor.fetchall()
    out: dict[str, QueueThroughput] = {}
    for queue, kind, minute, count in rows:
        slot = index.get(minute)
        if slot is None:  # a clock a little ahead of ours; never drawn off the chart
            continue
        entry = out.get(queue)
        if entry is None:
            entry = out[queue] = QueueThroughput(
                queue, minutes, {k: [0] * WINDOW_MINUTES for k in SERIES}
            )
        entry.series[kind][slot] += count
    return sorted(out.values(), key=lambda q: (-q.active, q.queue))


@dataclass
class AgentView:
    """An endpoint as the agents view shows it: when it was last seen, what it holds now."""

    endpoint: Endpoint
    held: list[Todo] = field(default_factory=list)
    holding: int = 0
    by_people: int = 0  # of ``holding``, the claims a person took in the console

    @property
    def queues_held(self) -> list[str]:
        return sorted({t.queue for t in self.held})


def agents(endpoints: Iterable[Endpoint]) -> list[AgentView]:
    """Each endpoint with its claimed todos (the first few, oldest claim first), how many it
    holds and how many of those a person holds (an operator's claim in the console, on the
    endpoint's todo but not the agent's doing); most recently seen first. Three queries
    (todo_claimed_idx serves both counts)."""
    views = {e.id: AgentView(e) for e in endpoints}
    params: dict[str, Any] = {"endpoints": list(views), "shown": HELD_SHOWN, "person": HUMAN_PREFIX}
    with connection.cursor() as cursor:
        cursor.execute(HOLDING_SQL, params)
        for endpoint_id, count, by_people in cursor.fetchall():
            views[endpoint_id].holding = count
            views[endpoint_id].by_people = by_people
        cursor.execute(HELD_SQL, params)
        ids = [row[0] for row in cursor.fetchall()]
    for todo in Todo.objects.filter(pk__in=ids).order_by("claimed_at", "id"):
        views[todo.endpoint_id].held.append(todo)
    return sorted(views.values(), key=_recent_first)


def _recent_first(view: AgentView) -> tuple[bool, bool, float, str]:
    seen = view.endpoint.last_seen_at
    return (
        view.endpoint.state != EndpointState.ACTIVE,
        seen is None,
        -seen.timestamp() if seen else 0.0,
        view.endpoint.slug,
    )


HISTORY_MINUTES = 24 * 60


@dataclass(frozen=True)
class OccupancyHistory:
    """One pool's or tag's last 24 hours: the most claims held at once in each minute, oldest
    minute first."""

    kind: str
    name: str
    limit: int
    posture: str
    minutes: list[datetime]
    held: list[int]

    @property
    def peak(self) -> int:
        return max(self.held, default=0)


def occupancy_history(
    declared: list[tuple[str, str, int, str]], *, now: datetime | None = None
) -> list[OccupancyHistory]:
    """Per pool and tag of ``declared`` (kind, name, limit, posture: admission.limits'
    declarations), the most claims naming it held at once in each minute of the last 24 h (one
    query over the attempts)."""
    now = now or timezone.now()
    last = now.replace(second=0, microsecond=0)
    minutes = [last - timedelta(minutes=HISTORY_MINUTES - 1 - i) for i in range(HISTORY_MINUTES)]
    with connection.cursor() as cursor:
        cursor.execute(sql.OCCUPANCY_HISTORY_SQL, {"since": minutes[0], "now": now})
        found = {(kind, name, minute): (peak, end) for kind, name, minute, peak, end in cursor}
    return [
        OccupancyHistory(kind, name, limit, posture, minutes, _levels(found, kind, name, minutes))
        for kind, name, limit, posture in declared
    ]


def _levels(
    found: dict[tuple[str, str, datetime], tuple[int, int]],
    kind: str,
    name: str,
    minutes: list[datetime],
) -> list[int]:
    """The most held at once in each minute: a minute with claims starting or ending in it
    reached its highest level (or the one it began at); a minute without stayed where the last
    one ended."""
    held, level = [], 0
    for minute in minutes:
        events = found.get((kind, name, minute))
        if events is not None:
            peak, end = events
            held.append(max(level, peak))
            level = end
        else:
            held.append(level)
    return held
