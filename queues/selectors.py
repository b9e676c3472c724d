"""Reads of todos and queues shared by every surface (board, REST, MCP, CLI, /metrics)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import connection
from django.db.models import Count, Exists, OuterRef, Q, QuerySet, TextField
from django.db.models.functions import Cast
from django.utils import timezone

from queues import access, conditions, declared, gates, sql
from queues.access import Actor, AgentActor, HumanActor, todo_scope
from queues.conditions import Condition
from queues.gates import GateState
from queues.models import (
    LIVE_TODO,
    QUARANTINE_QUEUE,
    QUEUE_NAME_RE,
    Attempt,
    Endpoint,
    EndpointState,
    QueuePause,
    SweepRun,
    Todo,
    TodoState,
)
from switchboard.core import versions
from switchboard.core.errors import Conflict, InvalidArgument, NotFound
from switchboard.core.times import iso
from switchboard.core.validation import fullmatch
from switchboard.ledger.models import LedgerEntry, LedgerKind

MAX_PAGE = 200


def todo_get(*, actor: Actor, todo_id: UUID) -> Todo:
    todo = Todo.objects.filter(todo_scope(actor), pk=todo_id).select_related("endpoint").first()
    if todo is None:
        raise NotFound("no such todo", id=str(todo_id))
    return todo


@dataclass(frozen=True)
class ClaimInProgress:
    """The claim a todo holds now, read as an attempt that has not ended: no end, no outcome.
    Not a row: an Attempt row is written when its claim ends (``queues.models.Attempt``)."""

    todo: Todo
    number: int
    claimant: str
    via: str
    claimed_at: datetime
    lease_expires_at: datetime | None
    lease_token_hash: str | None
    ended_at: None = None
    outcome: None = None
    disposition: None = None
    summary: str = ""
    error: None = None
    pk: None = None

    @property
    def todo_id(self) -> UUID:
        return self.todo.pk

    @property
    def endpoint_id(self) -> UUID:
        return self.todo.endpoint_id


def current_attempt(todo: Todo) -> ClaimInProgress | None:
    """The claim ``todo`` holds now, or None when it is not claimed."""
    if todo.state != TodoState.CLAIMED:
        return None
    return ClaimInProgress(
        todo=todo,
        number=todo.attempt,
        claimant=todo.owner,
        via=todo.claim_via,
        claimed_at=todo.claimed_at or todo.updated_at,
        lease_expires_at=todo.lease_expires_at,
        lease_token_hash=todo.lease_token_hash,
    )


def todo_attempts(todo: Todo) -> list[Attempt | ClaimInProgress]:
    """A todo's attempts, newest first: the claim in progress, if any (``current_attempt``),
    then the ended ones."""
    ended: list[Attempt | ClaimInProgress] = list(todo.attempts.order_by("-claimed_at", "-id"))
    current = current_attempt(todo)
    return ended if current is None else [current, *ended]


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
        if queue is not None:
            # As every other verb answers a queue outside the scope (not an empty page).
            access.check_scope(actor, queue)
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
        next_cursor = _encode_cursor(last.created_at, last.id)
    return rows, next_cursor


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _encode_cursor(created_at: datetime, todo_id: UUID) -> str:
    """Where a page ends, URL-safe (digits, ``_`` and hex) so a client can put it in a query
    string as it is: the ISO form's ``+`` (``+00:00``) arrived as a space and was refused as a
    cursor this server never gave out."""
    return f"{(created_at - _EPOCH) // _MICROSECOND}_{todo_id.hex}"


def _decode_cursor(cursor: str) -> tuple[datetime, UUID]:
    try:
        if "|" in cursor:  # as servers before 2026-12-07 gave them out: "<ISO instant>|<id>"
            created, _, ident = cursor.partition("|")
            return datetime.fromisoformat(created), UUID(ident)
        micros, sep, ident = cursor.partition("_")
        if not sep or not micros.isascii() or not micros.isdigit() or len(ident) != 32:
            raise ValueError(cursor)
        return _EPOCH + int(micros) * _MICROSECOND, UUID(hex=ident)
    except (ValueError, OverflowError) as exc:
        raise InvalidArgument("cursor is not one this server gave out", field="cursor") from exc


def admission_for(todos: list[Todo]) -> dict[UUID, dict[str, Any]]:
    """The derived admission status of each pending todo of a budgeted queue identity."""
    pending = [t for t in todos if t.state == TodoState.PENDING]
    if not pending:  # every claim's and ending's answer: no gate to ask (issue 11)
        return {}
    statuses = gates.statuses({(t.endpoint_id, t.queue) for t in pending})
    return {
        t.id: statuses[(t.endpoint_id, t.queue)]
        for t in pending
        if (t.endpoint_id, t.queue) in statuses
    }


_FOREVER = datetime.max.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Explanation:
    """Why a pending todo waits: every gate it is subject to, and the one that binds (the
    holding gate with the latest ``next_eligible_at``, one held until an operator acts before
    any; None when a claim would pass every gate now)."""

    gates: list[GateState]

    @property
    def binding(self) -> GateState | None:
        holding = [g for g in self.gates if g.holds]
        if not holding:
            return None
        # Forever (None) outranks any instant; among equals the first in lock order binds.
        return max(holding, key=lambda g: g.next_eligible_at or _FOREVER)

    def as_dict(self) -> dict[str, Any]:
        binding = self.binding
        return {
            "binding": binding.gate if binding else "none",
            "next_eligible_at": binding.next_eligible_at if binding else None,
            "gates": [g.as_dict() for g in self.gates],
        }


def _pause_state(queue: str) -> GateState:
    pause = pause_of(queue)
    if pause is None:
        return GateState("pause", "admits", None, None, f"{queue} is not paused")
    return GateState(
        "pause",
        "holds",
        "paused",
        None,
        f"{queue} is paused by {pause.by} since {iso(pause.at)}: {pause.reason}",
    )


def todo_explain(todo: Todo) -> Explanation | None:
    """The one explain of a todo, for get_todo (REST and MCP), the operator API and the
    console: None unless it is pending. Read without locks, so it is a snapshot: the claim's
    gates decide under their locks."""
    if todo.state != TodoState.PENDING:
        return None
    return Explanation([_pause_state(todo.queue), *gates.explain(todo)])


def todos_explained(todos: Iterable[Todo]) -> dict[UUID, Explanation | None]:
    """``todo_explain`` of each todo, read once per group of todos that wait alike: what it reads
    of a todo is its state, its queue (the pause), its queue identity (the budget) and the
    pool, tags and rate limit it names (the named limits), so todos alike in these share one
    answer (a list of a hundred pending todos read every gate a hundred times). A gate keyed on
    anything else of a todo must join the key."""
    read: dict[tuple[Any, ...], Explanation | None] = {}
    out: dict[UUID, Explanation | None] = {}
    for todo in todos:
        key = (
            todo.state,
            todo.endpoint_id,
            todo.queue,
            todo.pool,
            tuple(todo.tags),
            todo.rate_limit,
        )
        if key not in read:
            read[key] = todo_explain(todo)
        out[todo.id] = read[key]
    return out


@dataclass(frozen=True)
class PauseInfo:
    """A pause, the one shape every surface shows: the API (``PauseInfoOut``), the board, the
    queue and todo pages, the CLI's --json, the ledger and list_todos' ``paused_queues``."""

    reason: str
    by: str
    at: datetime

    @classmethod
    def of(cls, pause: QueuePause) -> PauseInfo:
        return cls(reason=pause.reason, by=pause.paused_by.get_username(), at=pause.paused_at)

    def as_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "by": self.by, "at": self.at}

    def ledger_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "by": self.by, "at": self.at.isoformat()}


def pauses_of(queues: Iterable[str] | None = None) -> dict[str, PauseInfo]:
    """The pauses in force, by queue name (of ``queues``, or all): the one read of pauses."""
    rows = QueuePause.objects.select_related("paused_by").order_by("queue")
    if queues is not None:
        rows = rows.filter(queue__in=list(queues))
    return {row.queue: PauseInfo.of(row) for row in rows}


# Which queue names are paused, known per process for an empty claim_next's explanation only
# (the claim statement reads the pause table itself, so a claim is never handed out on a paused
# queue whatever this says): read at most every PAUSED_NAMES_SECONDS, so an empty claim stays
# one statement, and again at once after a pause or resume in this process.
PAUSED_NAMES_SECONDS = 2.0
_paused_names: frozenset[str] = frozenset()
_paused_read_at = float("-inf")


def paused_names() -> frozenset[str]:
    global _paused_names, _paused_read_at
    if time.monotonic() - _paused_read_at >= PAUSED_NAMES_SECONDS:
        _paused_names = frozenset(QueuePause.objects.values_list("queue", flat=True))
        _paused_read_at = time.monotonic()
    return _paused_names


def forget_paused_names() -> None:
    """A pause or resume committed in this process: read the names again on the next ask."""
    global _paused_read_at
    _paused_read_at = float("-inf")


def pause_of(queue: str) -> PauseInfo | None:
    return pauses_of([queue]).get(queue)


def paused_among(queues: list[str]) -> list[str]:
    """The names among ``queues`` that are paused (list_todos' ``paused_queues``)."""
    return sorted(pauses_of(queues))


@dataclass
class QueueStat:
    queue: str
    counts: dict[str, int] = field(default_factory=dict)
    dead_letter: int = 0
    oldest_pending_at: datetime | None = None
    paused: PauseInfo | None = None
    # Every condition of the queue name, worst first (``queues.conditions``).
    conditions: list[Condition] = field(default_factory=list)

    @property
    def condition(self) -> Condition:
        return self.conditions[0] if self.conditions else Condition.HEALTHY

    @property
    def oldest_pending_seconds(self) -> float | None:
        if self.oldest_pending_at is None:
            return None
        return max(0.0, (timezone.now() - self.oldest_pending_at).total_seconds())


def queue_stats(
    *, endpoint_ids: list[UUID] | None = None, with_conditions: bool = True
) -> list[QueueStat]:
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
    for name, pause in pauses_of().items():
        stats.setdefault(name, QueueStat(name, dict.fromkeys(TodoState.values, 0)))
        stats[name].paused = pause
    out = [stats[name] for name in sorted(stats)]
    if with_conditions:
        fill_conditions(out, endpoint_ids)
    return out


def fill_conditions(stats: list[QueueStat], endpoint_ids: list[UUID] | None) -> None:
    """Each queue's conditions: its pause, its counts, and why the claim gates (budgets) refuse
    its identities now, asked of ``gates.statuses`` for every endpoint scoped to it."""
    endpoints = Endpoint.objects.all()
    if endpoint_ids is not None:
        endpoints = endpoints.filter(id__in=endpoint_ids)
    names = {s.queue for s in stats}
    identities = {
        (endpoint_id, queue)
        for endpoint_id, scope in endpoints.values_list("id", "scope_queues")
        for queue in scope
        if queue in names
    }
    reasons: dict[str, list[str | None]] = {}
    for (_, queue), status in gates.statuses(identities).items():
        if status.get("state") == "deferred":
            reasons.setdefault(queue, []).append(status.get("reason"))
    for queue in _held_by_limits(stats, identities, reasons):
        reasons[queue] = [LIMIT_HELD]
    for stat in stats:
        stat.conditions = conditions.of(
            quarantine=stat.queue == QUARANTINE_QUEUE,
            paused=stat.paused is not None,
            refusals=reasons.get(stat.queue, []),
            failing=stat.counts[TodoState.FAILED] - stat.dead_letter,
            dead_letter=stat.dead_letter,
        )


# A queue whose pending work named limits hold, all of it (read as "Deferred · a named limit
# is full": queues.conditions, whose reasons not a budget's are a limit's).
LIMIT_HELD = "limit_held"


def _held_by_limits(
    stats: list[QueueStat],
    identities: set[tuple[UUID, str]],
    reasons: dict[str, list[str | None]],
) -> set[str]:
    """The queues with pending work of which a claim could take none now, with no pause and
    no budget to say why: named limits hold it (``sql.waiting_sql``, the claim's own skips, as
    the board asks of its sections). It read "Healthy" before. One query."""
    asked = {
        s.queue
        for s in stats
        if s.counts[TodoState.PENDING]
        and s.paused is None
        and s.queue != QUARANTINE_QUEUE
        and s.queue not in reasons
    }
    waiting = claimable_identities((e, q) for e, q in identities if q in asked)
    return asked - {queue for _, queue in waiting}


def claimable_identities(identities: Iterable[tuple[UUID | str, str]]) -> set[tuple[str, str]]:
    """Of these queue identities, those holding a todo a claim could take now (as endpoint id
    text and queue): claimable, and passed over by no per-todo gate's skip, as claim_next
    passes it over (``sql.waiting_sql``, the reopen ring's check). One query. An identity with
    pending work missing here has all of it held by its named limits (or its queue paused)."""
    keys = sorted({f"{endpoint_id}:{queue}" for endpoint_id, queue in identities})
    if not keys:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(sql.waiting_sql(), {"keys": keys})
        found = [key for (key,) in cursor.fetchall()]
    return {(endpoint_id, queue) for endpoint_id, _, queue in (k.partition(":") for k in found)}


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


# --- selections: the todos a filter matches, and what a bulk action would change ----------------

# The state words a selection may name: a todo state, "dead_letter" (failed, no retry to come)
# or "live" (claimed and pending, the board's default).
SELECTION_STATES: tuple[str, ...] = (*TodoState.values, "dead_letter", "live")
# Which states each bulk action takes a todo from. Claimed work is the agent's: release it first.
BULK_ACTIONS: dict[str, tuple[str, ...]] = {
    "retry": (TodoState.FAILED,),
    "discard": (TodoState.PENDING, TodoState.FAILED),
}
BULK_SAMPLE = 10
MAX_SEARCH = 200


def todos_matching(
    actor: Actor,
    *,
    endpoint_ids: Iterable[UUID] | None = None,
    queue: str = "",
    states: Iterable[str] = (),
    q: str = "",
) -> QuerySet[Todo]:
    """The todos a filter matches (the board's cards and a bulk action's selection): in the
    actor's read scope, on those endpoints and that queue, in those states ("dead_letter" and
    "live" included; none means every state), and, with ``q``, whose title or payload text
    contains it or whose id it is."""
    qs: QuerySet[Todo] = Todo.objects.filter(todo_scope(actor))
    if endpoint_ids is not None:
        qs = qs.filter(endpoint_id__in=list(endpoint_ids))
    if queue:
        qs = qs.filter(queue=queue)
    wanted = set(states)
    if "live" in wanted:
        wanted |= {TodoState.CLAIMED, TodoState.PENDING}
    if wanted:
        match = Q(state__in=sorted(wanted & set(TodoState.values)))
        if "dead_letter" in wanted:
            match |= Q(state=TodoState.FAILED, next_retry_at__isnull=True)
        qs = qs.filter(match)
    if q:
        found = Q(title__icontains=q) | Q(payload_text__icontains=q)
        try:
            found |= Q(id=UUID(q))
        except ValueError:
            pass
        qs = qs.annotate(payload_text=Cast("payload", TextField())).filter(found)
    return qs


@dataclass(frozen=True)
class Selection:
    """A bulk action's filter: the board's (endpoint slug, queue, state, search), narrowed on the
    console to the identities its condition filter shows. Every field is optional: empty means
    any. ``identities`` None means every identity the other fields allow."""

    endpoint: str = ""
    queue: str = ""
    state: str = ""
    q: str = ""
    identities: frozenset[tuple[UUID, str]] | None = None

    def check(self) -> Selection:
        """The selection, or ``invalid_argument`` naming the first wrong field."""
        if self.queue and not fullmatch(QUEUE_NAME_RE, self.queue):
            raise InvalidArgument("queue is not a queue name", field="queue")
        if self.state and self.state not in SELECTION_STATES:
            raise InvalidArgument(
                f"state must be one of {', '.join(SELECTION_STATES)}", field="state"
            )
        if len(self.q) > MAX_SEARCH:
            raise InvalidArgument(f"q is at most {MAX_SEARCH} characters", field="q")
        if len(self.endpoint) > 63:
            raise InvalidArgument("endpoint is at most 63 characters", field="endpoint")
        return self


def bulk_rows(
    actor: HumanActor, action: str, selection: Selection, *, retryable_only: bool = True
) -> QuerySet[Todo]:
    """The todos a bulk action would change: the selection's, in the states the action takes,
    on endpoints the actor may change. Ordered by id, the order the service locks them in."""
    if action not in BULK_ACTIONS:
        raise InvalidArgument(f"action must be one of {', '.join(BULK_ACTIONS)}", field="action")
    selection.check()
    endpoints = Endpoint.objects.filter(
        Q() if actor.is_superuser else Q(owner_id=getattr(actor.user, "pk", None))
    )
    if selection.endpoint:
        endpoints = endpoints.filter(slug=selection.endpoint)
    qs = todos_matching(
        actor,
        endpoint_ids=endpoints.values_list("id", flat=True),
        queue=selection.queue,
        states=[selection.state] if selection.state else [],
        q=selection.q,
    ).filter(state__in=BULK_ACTIONS[action])
    if action == "retry" and retryable_only:
        qs = retryable(qs)
    if selection.identities is not None:
        narrowed = Q(pk__in=[])
        for endpoint_id, queue in selection.identities:
            narrowed |= Q(endpoint_id=endpoint_id, queue=queue)
        qs = qs.filter(narrowed)
    return qs.order_by("id")


# What endpoint_update changes (the admin's change form edits exactly these).
ENDPOINT_EDITABLE = (
    "name",
    "owner",
    "notify_url",
    "default_lease_ttl_seconds",
    "rate_limit_rps",
    "rate_limit_burst",
)


def endpoint_version(endpoint: Endpoint) -> str:
    """The version of what can change of an endpoint after vend (``switchboard.core.versions``):
    a digest of those fields, so it moves with every write that changes one of them and with
    nothing else (a claim's ``last_seen_at``, a hook's failure)."""
    values = {name: endpoint.serializable_value(name) for name in ENDPOINT_EDITABLE}
    if values["rate_limit_rps"] is not None:  # 5 as given, 5.0 as read back: one version
        values["rate_limit_rps"] = float(values["rate_limit_rps"])
    return versions.digest(values)


def live_todo_counts(endpoint_ids: Iterable[UUID]) -> dict[UUID, int]:
    """How many live todos (pending or claimed: what a revoke dead-letters) each endpoint holds;
    an endpoint holding none is absent."""
    return dict(
        Todo.objects.filter(LIVE_TODO, endpoint_id__in=list(endpoint_ids))
        .values("endpoint_id")
        .annotate(n=Count("pk"))
        .values_list("endpoint_id", "n")
    )


def endpoint_last_change(endpoint: Endpoint) -> str:
    """Who changed the endpoint last and when, from its ledger, as a refusal says it ("" when
    the ledger holds no change of it)."""
    last = (
        LedgerEntry.objects.filter(
            kind=LedgerKind.ENDPOINT_UPDATE, scope=f"endpoint:{endpoint.slug}"
        )
        .order_by("-seq")
        .first()
    )
    if last is None:
        return ""
    who = last.actor_human_name or last.actor_endpoint_slug or "someone"
    return f"last changed by {who} at {iso(last.at)}"


def retryable(todos: QuerySet[Todo]) -> QuerySet[Todo]:
    """The todos a retry may bring back to pending, of ``todos`` (failed ones): not of a revoked
    endpoint (nothing could claim them again), and not holding an idempotency key that another
    todo of the endpoint holds now (live) or would hold (a newer dead letter with the key: of
    two, only the newest comes back), as the live-key index would refuse, and not naming a
    limit that is not declared now (a deleted pool, tag or rate limit: nothing would hold it)."""
    taken = Exists(
        _key_holders(
            OuterRef("endpoint_id"),
            OuterRef("idempotency_key"),
            OuterRef("pk"),
            OuterRef("created_at"),
        )
    )
    return (
        todos.exclude(endpoint__state=EndpointState.REVOKED)
        .exclude(Q(idempotency_key__isnull=False) & taken)
        .filter(declared.declared())
    )


def _key_holders(endpoint_id: Any, key: Any, pk: Any, created_at: Any) -> QuerySet[Todo]:
    """The other todos of an endpoint that hold this idempotency key now (live) or would once
    retried (a newer dead letter): values, or OuterRefs in ``retryable``'s subquery."""
    return (
        Todo.objects.filter(endpoint_id=endpoint_id, idempotency_key=key)
        .exclude(pk=pk)
        .filter(
            LIVE_TODO
            | Q(state=TodoState.FAILED, next_retry_at__isnull=True, created_at__gt=created_at)
        )
    )


def retry_refusal(todo: Todo) -> Conflict | None:
    """Why this failed todo may not be retried (``retryable``'s reasons, in words), or None."""
    endpoint = Endpoint.objects.only("slug", "state").get(pk=todo.endpoint_id)
    if endpoint.state == EndpointState.REVOKED:
        return Conflict(
            f"endpoint {endpoint.slug} is revoked: nothing can claim this todo again "
            "(discard it, or push the work to a live endpoint)",
            state=todo.state,
            reason="endpoint_revoked",
        )
    missing = declared.undeclared(declared.of(todo))
    if missing:
        field, name = missing[0]
        kind = declared.KINDS[field]
        return Conflict(
            f"this todo names {kind} limit {name!r}, which is not declared now: nothing would "
            "hold it (declare the limit again, or discard the todo)",
            state=todo.state,
            reason=declared.UNDECLARED,
            kind=kind,
            name=name,
        )
    if todo.idempotency_key is None:
        return None
    holder = (
        _key_holders(todo.endpoint_id, todo.idempotency_key, todo.pk, todo.created_at)
        .values_list("id", "state")
        .first()
    )
    if holder is None:
        return None
    return Conflict(
        f"todo {holder[0]} ({holder[1]}) holds this todo's idempotency key now: retrying this "
        "one would run the same work twice",
        state=todo.state,
        reason="idempotency_key_taken",
        holder=str(holder[0]),
    )


def selection_token(rows: Iterable[tuple[UUID, str, datetime]]) -> str:
    """A fingerprint of exactly which todos, in which state and version, a confirmation showed:
    the service changes nothing unless the selection still has it (no todo moved since)."""
    digest = hashlib.sha256()
    for todo_id, state, updated_at in rows:
        digest.update(f"{todo_id}:{state}:{updated_at.timestamp():.6f}\n".encode())
    return digest.hexdigest()[:32]


@dataclass(frozen=True)
class BulkPreview:
    """What a confirmation shows: how many todos the action would change, a sample of them, and
    the token that confirms exactly this selection."""

    action: str
    count: int
    sample: list[Todo]
    token: str
    # A retry's: failed todos of the selection it leaves out (``retryable``: a revoked
    # endpoint's, one whose idempotency key another todo holds, or one naming an undeclared
    # limit).
    left_out: int = 0


def bulk_preview(*, actor: HumanActor, action: str, selection: Selection) -> BulkPreview:
    rows = bulk_rows(actor, action, selection)
    seen = list(rows.values_list("id", "state", "updated_at"))
    sample_ids = [row[0] for row in seen[:BULK_SAMPLE]]
    sample = list(Todo.objects.filter(pk__in=sample_ids).select_related("endpoint").order_by("id"))
    left_out = 0
    if action == "retry":
        left_out = bulk_rows(actor, action, selection, retryable_only=False).count() - len(seen)
    return BulkPreview(action, len(seen), sample, selection_token(seen), left_out)


# A sweep is late once this many of its intervals passed with no run: the beat or the worker has
# stopped (one missed tick is a busy worker; three are not).
SWEEP_LATE_INTERVALS = 3


@dataclass(frozen=True)
class LateSweep:
    name: str
    finished_at: datetime


def late_sweeps(now: datetime | None = None) -> list[LateSweep]:
    """The sweeps that ran once and not for ``SWEEP_LATE_INTERVALS`` intervals since: what the
    board says above the fleet (leases are not reaped, retries not requeued). One that never
    ran is not late: a fresh start, whose beat has not ticked yet, cannot be told from one
    never started, and the README's commands start the beat."""
    now = now or timezone.now()
    late_after = now - timedelta(seconds=settings.SWEEP_INTERVAL_SECONDS * SWEEP_LATE_INTERVALS)
    return [
        LateSweep(name, finished_at)
        for name, finished_at in SweepRun.objects.filter(finished_at__lt=late_after)
        .order_by("finished_at", "name")
        .values_list("name", "finished_at")
    ]
