"""Reads of todos and queues shared by every surface (board, REST, MCP, CLI, /metrics)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import connection
from django.db.models import Q, QuerySet
from django.utils import timezone

from queues import access, gates, sql
from queues.access import Actor, AgentActor, HumanActor, todo_scope
from queues.models import Endpoint, QueuePause, Todo, TodoState
from switchboard.core.errors import Forbidden, InvalidArgument, NotFound

MAX_PAGE = 200


def todo_get(*, actor: Actor, todo_id: UUID) -> Todo:
    todo = Todo.objects.filter(todo_scope(actor), pk=todo_id).select_related("endpoint").first()
    if todo is None:
        raise NotFound("no such todo", id=str(todo_id))
    return todo


def todos_for(
    *,
    actor: Actor,
    queue: str | None = None,
    state: str | None = None,
    endpoint: Endpoint | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> tuple[list[Todo], str | None]:
    """A page of todos, oldest first, keyed by (created_at, id); returns the next cursor."""
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidArgument(f"limit must be between 1 and {MAX_PAGE}", field="limit")
    if state is not None and state not in TodoState.values and state != "dead_letter":
        raise InvalidArgument(
            f"state must be one of {', '.join([*TodoState.values, 'dead_letter'])}", field="state"
        )
    qs: QuerySet[Todo] = Todo.objects.filter(todo_scope(actor)).select_related("endpoint")
    if isinstance(actor, AgentActor):
        if queue is not None and queue not in actor.endpoint.scope_queues:
            # As every other verb answers a queue outside the scope (not an empty page).
            raise Forbidden(f"queue {queue!r} is not in this endpoint's scope", queue=queue)
        qs = qs.filter(queue__in=actor.endpoint.scope_queues)
    if endpoint is not None:
        qs = qs.filter(endpoint=endpoint)
    if queue is not None:
        qs = qs.filter(queue=queue)
    if state == "dead_letter":
        qs = qs.filter(state=TodoState.FAILED, next_retry_at__isnull=True)
    elif state is not None:
        qs = qs.filter(state=state)
    if cursor:
        created_at, todo_id = _decode_cursor(cursor)
        qs = qs.filter(Q(created_at__gt=created_at) | Q(created_at=created_at, id__gt=todo_id))
    rows = list(qs.order_by("created_at", "id")[: limit + 1])
    next_cursor = None
    if len(rows) > limit:
        rows = rows[:limit]
        last = rows[-1]
        next_cursor = f"{last.created_at.isoformat()}|{last.id}"
    return rows, next_cursor


def _decode_cursor(cursor: str) -> tuple[datetime, UUID]:
    try:
        created, _, ident = cursor.partition("|")
        return datetime.fromisoformat(created), UUID(ident)
    except ValueError as exc:
        raise InvalidArgument("cursor is not one this server gave out", field="cursor") from exc


def admission_for(todos: list[Todo]) -> dict[UUID, dict[str, Any]]:
    """The derived admission status of each pending todo of a budgeted queue identity."""
    pending = [t for t in todos if t.state == TodoState.PENDING]
    statuses = gates.statuses({(t.endpoint_id, t.queue) for t in pending})
    return {
        t.id: statuses[(t.endpoint_id, t.queue)]
        for t in pending
        if (t.endpoint_id, t.queue) in statuses
    }


def paused_among(queues: list[str]) -> list[str]:
    return sorted(QueuePause.objects.filter(queue__in=queues).values_list("queue", flat=True))


@dataclass
class QueueStat:
    queue: str
    counts: dict[str, int] = field(default_factory=dict)
    dead_letter: int = 0
    oldest_pending_at: datetime | None = None
    paused: QueuePause | None = None

    @property
    def oldest_pending_seconds(self) -> float | None:
        if self.oldest_pending_at is None:
            return None
        return max(0.0, (timezone.now() - self.oldest_pending_at).total_seconds())


def queue_stats(*, endpoint_ids: list[UUID] | None = None) -> list[QueueStat]:
    """Every known queue (a todo, policy, pause or scope has used its name) with counts by state,
    the oldest pending todo and its pause. ``endpoint_ids`` narrows counts and names to those
    endpoints (an owner's view); paused queues are always listed, being fleet-wide."""
    with connection.cursor() as cursor:
        if endpoint_ids is None:
            cursor.execute(sql.queue_counts_sql(narrowed=False), [])
        else:
            cursor.execute(sql.queue_counts_sql(narrowed=True), [endpoint_ids])
        rows = cursor.fetchall()
    stats: dict[str, QueueStat] = {}
    for queue, state, count, dead, oldest in rows:
        stat = stats.setdefault(queue, QueueStat(queue, dict.fromkeys(TodoState.values, 0)))
        stat.counts[state] = count
        stat.dead_letter += dead
        if oldest is not None:
            stat.oldest_pending_at = oldest
    endpoints = Endpoint.objects.all()
    if endpoint_ids is not None:
        endpoints = endpoints.filter(id__in=endpoint_ids)
    known = gates.queue_names(endpoint_ids)
    for scope in endpoints.values_list("scope_queues", flat=True):
        known.update(scope)
    for name in known:
        stats.setdefault(name, QueueStat(name, dict.fromkeys(TodoState.values, 0)))
    for pause in QueuePause.objects.select_related("paused_by"):
        stats.setdefault(pause.queue, QueueStat(pause.queue, dict.fromkeys(TodoState.values, 0)))
        stats[pause.queue].paused = pause
    return [stats[name] for name in sorted(stats)]


def queue_overview(*, actor: HumanActor) -> list[QueueStat]:
    """The queue list as a human may see it (``GET /api/v1/queues`` and the board's queue page):
    the fleet for superusers, auditors and pausers (a pause is fleet-wide, so a pauser who owns no
    endpoint still sees what there is to pause); otherwise the queues of their own endpoints,
    with every paused queue listed."""
    user: Any = actor.user
    endpoint_ids = None
    if not access.sees_fleet(actor):
        endpoint_ids = list(Endpoint.objects.filter(owner_id=user.pk).values_list("id", flat=True))
    return queue_stats(endpoint_ids=endpoint_ids)


def queue_known(queue: str) -> bool:
    """Whether any todo, gate (a policy), pause or endpoint scope has used this queue name."""
    return (
        Todo.objects.filter(queue=queue).exists()
        or queue in gates.queue_names(None)
        or QueuePause.objects.filter(queue=queue).exists()
        or Endpoint.objects.filter(scope_queues__contains=[queue]).exists()
    )
