"""Every write to todos and attempts outside the claim: one function per state change.

Called alike by the admin, the pages, the REST API, MCP, the CLI and the sweeps. Keyword-only
arguments; refusals are ``switchboard.core.errors.DomainError`` subclasses. Counters and notifications
happen only after commit.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone
from psycopg.types.json import Jsonb

from queues import access, declared, metrics, selectors, sql, wakes
from queues.access import HUMAN_PREFIX, Actor, AgentActor, HumanActor, acting_endpoint_ids
from queues.models import (
    LIVE_TODO,
    MAX_ATTEMPT_SUMMARY,
    Endpoint,
    EndpointState,
    Todo,
    TodoSource,
    TodoState,
    check_queue_name,
)
from queues.selectors import BULK_ACTIONS, Selection
from queues.services.endpoints import resolve_lease_ttl
from switchboard.core import availability, validation
from switchboard.core.errors import Conflict, InvalidArgument, NotFound
from switchboard.core.times import iso
from switchboard.core.tokens import hash_token
from switchboard.ledger import chain as ledger
from switchboard.ledger.models import LedgerEntry, LedgerKind

BACKOFF_BASE_SECONDS = 30
BACKOFF_CAP_SECONDS = 900


def backoff_seconds(attempt: int) -> int:
    """Retry delay after the given failed attempt: min(30 s · 2^(attempt−1), 15 min)."""
    return int(min(BACKOFF_BASE_SECONDS * 2 ** max(attempt - 1, 0), BACKOFF_CAP_SECONDS))


# --- intake -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TodoCreated:
    todo: Todo
    created: bool
    # created=False: the fields in which the live todo differs from what was asked (none for a
    # retry of the request that made it).
    differs: list[str] = field(default_factory=list)


def todo_create(
    *,
    actor: Actor,
    endpoint: Endpoint,
    queue: str,
    title: str,
    kind: str = "",
    payload: Any = None,
    idempotency_key: str | None = None,
    max_attempts: int | None = None,
    source: str = TodoSource.API,
    pool: str | None = None,
    tags: Sequence[str] | None = None,
    rate_limit: str | None = None,
) -> TodoCreated:
    """Put a todo on a queue. A duplicate idempotency key returns the live todo, created=False.

    ``pool``, ``tags`` and ``rate_limit`` name declared limits the claim enforces; an undeclared
    name is refused naming its field (``queues.declared``)."""
    access.check_actor(actor)
    access.check_todo_write(actor, endpoint)
    check_queue_name(queue)
    if queue not in endpoint.scope_queues:
        access.check_scope(actor, queue)
        # An operator may not strand work where the endpoint can never claim it.
        raise InvalidArgument(
            f"queue {queue!r} is not in endpoint {endpoint.slug}'s scope "
            f"({', '.join(endpoint.scope_queues)})",
            field="queue",
        )
    for name, text in (("title", title), ("kind", kind), ("idempotency_key", idempotency_key)):
        validation.check_text(text, name)
    validation.check_stored_json(payload, "payload")
    title = (title or "").strip()
    if not title or len(title) > 500:
        raise InvalidArgument("title is required (at most 500 characters)", field="title")
    if len(kind or "") > 100:
        raise InvalidArgument("kind is at most 100 characters", field="kind")
    if idempotency_key is not None and not 1 <= len(idempotency_key) <= 200:
        raise InvalidArgument("idempotency_key must be 1-200 characters", field="idempotency_key")
    max_attempts = settings.DEFAULT_MAX_ATTEMPTS if max_attempts is None else max_attempts
    if not 1 <= max_attempts <= 100:
        raise InvalidArgument("max_attempts must be between 1 and 100", field="max_attempts")
    if payload is None:
        payload = {}
    names = declared.check(pool=pool, tags=tags, rate_limit=rate_limit)
    try:
        with transaction.atomic():
            availability.check_deadline()  # a client that has given up gets no todo
            if _lock_endpoints([endpoint.id]) != {endpoint.id: EndpointState.ACTIVE}:
                raise Conflict("the endpoint is revoked")
            # Declared, and kept so until this commits (a racing delete counts this todo).
            declared.hold(names)
            todo = Todo.objects.create(
                endpoint=endpoint,
                queue=queue,
                title=title,
                kind=kind or "",
                payload=payload,
                idempotency_key=idempotency_key,
                max_attempts=max_attempts,
                source=source,
                pool=names.pool,
                tags=list(names.tags),
                rate_limit=names.rate_limit,
            )
            metrics.created(queue, source)
            wakes.todo_ready(endpoint.id, queue, todo_id=todo.id)
    except IntegrityError:
        if idempotency_key is None:
            raise
        existing = Todo.objects.filter(
            LIVE_TODO, endpoint=endpoint, idempotency_key=idempotency_key
        ).first()
        if existing is None:  # the live one finished between our insert and this read
            return todo_create(
                actor=actor,
                endpoint=endpoint,
                queue=queue,
                title=title,
                kind=kind,
                payload=payload,
                idempotency_key=idempotency_key,
                max_attempts=max_attempts,
                source=source,
                pool=pool,
                tags=tags,
                rate_limit=rate_limit,
            )
        differs = _differs(
            existing,
            queue=queue,
            title=title,
            kind=kind or "",
            payload=payload,
            max_attempts=max_attempts,
            pool=names.pool,
            tags=sorted(names.tags),
            rate_limit=names.rate_limit,
        )
        # The key names one piece of work while it lives: the live todo is the answer, and
        # where it is not what this request asked for (not a retry of the request that made it)
        # the answer says in which fields, so the caller is not handed other work unawares.
        return TodoCreated(todo=existing, created=False, differs=differs)
    return TodoCreated(todo=todo, created=True)


def _differs(todo: Todo, **asked: Any) -> list[str]:
    """The fields in which a live todo is not what a create asked for (tags as a set;
    ``max_attempts`` as the round it was pushed with, which an operator's retry moves on by the
    attempts spent: the same request repeated after a retry is still the same)."""
    held = {name: getattr(todo, name) for name in asked}
    held["tags"] = sorted(held["tags"] or [])
    held["max_attempts"] = todo.max_attempts - todo.retried_after
    return [name for name, value in asked.items() if held[name] != value]


# --- transitions of a claimed todo ------------------------------------------------------------


def _transition(
    actor: Actor,
    todo_id: UUID,
    statement: str,
    params: dict[str, Any],
    lease_token: str | None,
    attempt: int | None = None,
    *,
    ends: bool = False,
    db: Any = None,
    plain: str | None = None,
) -> Todo:
    """Run a transition's one statement. ``ends``: it ends the claim, and writes the end row of
    the claim's grant, if it held one (``queues.sql.grants``), naming ``actor``. ``db``: the
    default database's connection, when the caller holds it already. ``plain``: the ending's
    statement for a claim that holds no grant, run first; when it matches nothing (a grant, or
    no claim to end), ``statement`` decides, as it would alone."""
    access.check_actor(actor)
    endpoint_ids = acting_endpoint_ids(actor)
    access.check_writes(actor, "auditors read; they do not change todos")
    params = sql.transition_params(
        params,
        todo_id=todo_id,
        endpoint_ids=endpoint_ids,
        operator=isinstance(actor, HumanActor),
        fence=hash_token(lease_token) if lease_token else None,
        attempt=attempt,
        ends=ends,
        ledger_actor=access.claim_ledger_actor(actor) if ends else None,
    )
    # One statement, committed on its own unless the caller holds a transaction.
    with sql.hot_cursor(db) as cursor:
        row = None
        if plain is not None:
            cursor.execute(plain, params)
            row = cursor.fetchone()
        if row is None:
            cursor.execute(statement, params)
            row = cursor.fetchone()
        if row is None:
            _raise_unmatched(
                cursor, todo_id, endpoint_ids, lease_token, attempt, agent=not params["operator"]
            )
    assert row is not None
    # Sliced, not star-unpacked (which builds a list item by item): once per ending.
    todo = sql.todo_from_row(row[: sql.NFIELDS])
    todo._reopens = row[sql.NFIELDS] or []  # type: ignore[attr-defined]
    return todo


def _raise_unmatched(
    cursor: Any,
    todo_id: UUID,
    endpoint_ids: list[UUID],
    lease_token: str | None,
    attempt: int | None = None,
    *,
    agent: bool = True,
) -> None:
    """A transition that matched nothing: conflict in scope, not_found outside it. Every verb
    names the same reasons, in the same order: not claimed, superseded (an earlier attempt's
    number or lease token), lapsed, then, to an agent, a claim a person holds, then a fence that
    names no claim of this todo (a wrong or missing token, an attempt not made yet)."""
    presented = hash_token(lease_token) if lease_token else None
    cursor.execute(sql.UNMATCHED_SQL, [presented, todo_id, endpoint_ids])
    found = cursor.fetchone()
    if found is None:
        raise NotFound("no such todo", id=str(todo_id))
    state, current, live, token_hash, owner, earlier_token, quarantined = found
    if state != TodoState.CLAIMED and quarantined and (attempt is None or attempt == current):
        # The caller's claim (this attempt) was expired by a quarantine: say which, so the
        # holder stops the work rather than retry an ending that cannot land.
        kind, _, name = quarantined.partition(":")
        raise Conflict(
            f"this claim was expired by the quarantine of {kind} {name}: the todo is {state}, "
            "not claimed; stop the work",
            state=state,
            reason="limit_quarantined",
            attempt=current,
            kind=kind,
            name=name,
        )
    if state != TodoState.CLAIMED:
        # Ended or released since (by an operator, the reaper): a reason an agent can branch
        # on, as every other refusal of an ending has.
        raise Conflict(
            f"todo is {state}, not claimed", state=state, reason="not_claimed", attempt=current
        )
    if (attempt is not None and attempt < current) or (presented != token_hash and earlier_token):
        raise Conflict(
            "this attempt was superseded: the todo was claimed again since",
            state=state,
            reason="superseded",
            attempt=current,
        )
    if not live:
        raise Conflict("the lease has lapsed", state=state, reason="lease_lapsed", attempt=current)
    if agent and token_hash is not None and owner.startswith(HUMAN_PREFIX):
        # A person's claim (always fenced: claiming.claim): no agent's to end, whatever token
        # or attempt it names (persons11: a made-up token or a later attempt read as a fence
        # mismatch, which tells a holder to keep working).
        raise Conflict(
            f"a person holds this claim ({owner}, taken in the console): it is theirs to end; "
            "leave the todo",
            state=state,
            reason="held_by_person",
            attempt=current,
            owner=owner,
        )
    if attempt is not None and attempt > current:
        message = f"attempt {attempt} has not been made: this claim is attempt {current}"
    elif presented is None and token_hash is not None:
        message = "this claim was made with require_fence: present its lease_token"
        if attempt is None and current > 1:
            # A call naming neither its attempt nor a token cannot be told from one by the
            # holder of an earlier attempt, whose claim was taken over: it is told which.
            message += (
                f" (it is attempt {current}: a holder of an earlier attempt was superseded; "
                "name your attempt to know)"
            )
    elif presented is not None and token_hash is None:
        message = "this claim has no lease token (it was made without require_fence)"
    elif presented != token_hash:
        message = "the lease token is not this claim's"
    else:  # it matched when read: the claim moved between the verb's statement and this one
        raise Conflict(
            "the claim changed while this request ran: read the todo again",
            state=state,
            reason="superseded",
            attempt=current,
        )
    raise Conflict(message, state=state, reason="fence_mismatch", attempt=current)


def heartbeat(
    *,
    actor: Actor,
    todo_id: UUID,
    lease_ttl_seconds: int | None = None,
    lease_token: str | None = None,
    attempt: int | None = None,
) -> Todo:
    """Extend a live lease the caller holds."""
    endpoint = actor.endpoint if isinstance(actor, AgentActor) else None
    ttl = (
        resolve_lease_ttl(lease_ttl_seconds, endpoint)
        if endpoint
        else _human_ttl(lease_ttl_seconds)
    )
    return _transition(actor, todo_id, sql.heartbeat_sql(), {"ttl": ttl}, lease_token, attempt)


def _human_ttl(requested: int | None) -> int:
    if requested is not None and not 1 <= requested <= settings.MAX_LEASE_TTL_SECONDS:
        raise InvalidArgument(
            f"lease_ttl_seconds must be between 1 and {settings.MAX_LEASE_TTL_SECONDS}",
            field="lease_ttl_seconds",
        )
    return requested or settings.DEFAULT_LEASE_TTL_SECONDS


def _json_param(value: Any) -> Any:
    return Jsonb(value) if value is not None else None


def complete(
    *,
    actor: Actor,
    todo_id: UUID,
    result: Any = None,
    summary: str = "",
    lease_token: str | None = None,
    attempt: int | None = None,
) -> Todo:
    validation.check_stored_json(result, "result")
    db = sql.default_connection()  # once for the statement and the counters
    summary = _summary(summary)

    def end() -> Todo:
        return _transition(
            actor,
            todo_id,
            sql.complete_sql(),
            {"result": _json_param(result), "summary": summary},
            lease_token,
            attempt,
            ends=True,
            db=db,
            plain=sql.complete_plain_sql(),
        )

    todo = _end(actor, todo_id, LedgerKind.TODO_COMPLETE, end, summary=summary)
    _after_end(todo, "done", db=db)
    return todo


def fail(
    *,
    actor: Actor,
    todo_id: UUID,
    error: Any = None,
    summary: str = "",
    lease_token: str | None = None,
    attempt: int | None = None,
    rate_limited: bool = False,
) -> Todo:
    """Fail a claimed attempt. ``rate_limited``: the work met a 429, recorded against the todo's
    rate limit in the same transaction (a todo naming none is refused, nothing changed)."""
    validation.check_stored_json(error, "error")
    summary = _summary(summary)

    def end() -> Todo:
        return _transition(
            actor,
            todo_id,
            sql.fail_sql(),
            {
                "result": _json_param({"error": error} if error is not None else None),
                "error": _json_param(error),
                "summary": summary,
                "base": BACKOFF_BASE_SECONDS,
                "cap": BACKOFF_CAP_SECONDS,
            },
            lease_token,
            attempt,
            ends=True,
        )

    # Only a reported 429 needs a transaction around the one statement.
    with transaction.atomic() if rate_limited else nullcontext():
        todo = _end(actor, todo_id, LedgerKind.TODO_FAIL, end, summary=summary)
        if rate_limited:
            declared.observe_rate_limited(rate_limit=todo.rate_limit, actor=actor, todo_id=todo.id)
    _after_end(todo, "dead_lettered" if todo.dead_letter else "failed")
    return todo


def release(
    *, actor: Actor, todo_id: UUID, lease_token: str | None = None, attempt: int | None = None
) -> Todo:
    def end() -> Todo:
        return _transition(
            actor, todo_id, sql.release_sql(), {"summary": ""}, lease_token, attempt, ends=True
        )

    todo = _end(actor, todo_id, LedgerKind.TODO_RELEASE, end)
    if todo.state == TodoState.FAILED:
        _after_end(todo, "dead_lettered")
    else:
        _after_end(todo, None, ring="released")
    return todo


def _end(
    actor: Actor, todo_id: UUID, kind: str, end: Callable[[], Todo], *, summary: str = ""
) -> Todo:
    """Run ``end``, the ending's statement. An agent's ending of its own claim is that alone: not
    a decision, and not ledgered (a limited claim's end row records it).

    A human's ending of a claim (theirs or an agent's: the console's Complete, Fail and
    Release, the operator API's and the admin's release) is a decision: it appends one chain-0
    ledger row naming the claim it ended, in the statement's transaction. The claim is read under the todo's lock
    first (the lock the statement takes anyway), so the row says whose claim it was even when
    the ending clears the owner."""
    if not isinstance(actor, HumanActor):
        return end()
    with transaction.atomic():
        held = (
            Todo.objects.select_for_update()
            .filter(pk=todo_id)
            .values("state", "owner", "attempt", "lease_expires_at")
            .first()
        )
        todo = end()
        assert held is not None  # the statement matched it
        slug = Endpoint.objects.values_list("slug", flat=True).get(pk=todo.endpoint_id)
        after: dict[str, Any] = {"state": todo.state, "count": 1, "todos": [str(todo.id)]}
        if todo.state == TodoState.FAILED:
            after["dead_letter"] = todo.dead_letter
            after["next_retry_at"] = iso(todo.next_retry_at)
        if summary:
            after["summary"] = summary
        ledger.append(
            kind=kind,
            actor=access.ledger_actor(actor),
            scope=f"endpoint:{slug}",
            queue=todo.queue,
            before={
                "state": held["state"],
                "owner": held["owner"],
                "attempt": held["attempt"],
                "lease_expires_at": iso(held["lease_expires_at"]),
            },
            after=after,
        )
    return todo


def _summary(summary: str | None) -> str:
    summary = validation.check_text(summary or "", "summary")
    if len(summary) > MAX_ATTEMPT_SUMMARY:
        raise InvalidArgument(
            f"summary is at most {MAX_ATTEMPT_SUMMARY} characters", field="summary"
        )
    return summary


def _after_end(todo: Todo, outcome: str | None, *, ring: str | None = None, db: Any = None) -> None:
    """Count the outcome; after commit, ring the todo's own identity with ``ring`` (a release
    made it claimable) and ``reopened`` for every other identity the ended claim freed a limit
    for (``gates.reopens``): one ring per identity. ``db``: as for ``_transition``."""
    if outcome is not None:
        metrics.completed(todo.queue, outcome, connection=db)
    keys: list[str] = getattr(todo, "_reopens", [])
    if keys or ring:
        wakes.after_commit(
            lambda: wakes.reopen(
                keys, own=(todo.endpoint_id, todo.queue), reason=ring, todo_id=todo.id
            )
        )


# --- operator actions -------------------------------------------------------------------------


def todo_retry(*, actor: HumanActor, todo_id: UUID) -> Todo:
    """Operator retry: a failed todo (waiting or dead-lettered) back to pending with a fresh
    round of attempts; its attempt number goes on (``_apply``)."""
    return _todo_act(actor, todo_id, "retry", seen_state=None)


def todo_discard(*, actor: HumanActor, todo_id: UUID, seen_state: str | None = None) -> Todo:
    """Operator discard: a pending or failed todo becomes ``discarded``, a terminal state no claim
    and no sweep takes it out of. ``seen_state`` is the state the operator saw when deciding
    (the todo page sends it): a todo that has moved since is refused, not discarded."""
    return _todo_act(actor, todo_id, "discard", seen_state=seen_state)


ACTION_WORDS = {"retry": "retried", "discard": "discarded"}
ACTION_FROM = {"retry": "a failed todo", "discard": "a pending or failed todo"}


def _lock_endpoints(endpoint_ids: Sequence[UUID]) -> dict[UUID, str]:
    """Lock these endpoints' rows in share mode (in id order) and answer their states as
    committed now. A revoke locks its endpoint's row for update and dead-letters the live todos
    it sees: a create or retry that checked the state before the revoke committed, and wrote
    after, left a pending todo no claim could take. In share mode it waits for that revoke (and
    reads its outcome), or the revoke waits for it (and dead-letters what it wrote)."""
    if not endpoint_ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, state FROM queues_endpoint WHERE id = ANY(%s) ORDER BY id FOR SHARE",
            [sorted(set(endpoint_ids))],
        )
        return {row[0]: row[1] for row in cursor.fetchall()}


def _todo_act(actor: HumanActor, todo_id: UUID, action: str, *, seen_state: str | None) -> Todo:
    todo = access.todo_to_change(actor, todo_id)
    with transaction.atomic():
        if action == "retry":
            _lock_endpoints([todo.endpoint_id])  # before the todo's lock, as a revoke takes them
        # Locked, so a concurrent retry, discard or claim waits and then sees the new state.
        state = (
            Todo.objects.select_for_update()
            .filter(pk=todo.pk)
            .values_list("state", flat=True)
            .first()
        )
        if state not in BULK_ACTIONS[action]:
            raise Conflict(
                f"todo is {state}; only {ACTION_FROM[action]} can be {ACTION_WORDS[action]}",
                state=state,
            )
        if seen_state is not None and state != seen_state:
            raise Conflict(
                f"todo is {state} now, not {seen_state} as you saw it: nothing was changed",
                state=state,
                reason="stale_selection",
            )
        if action == "retry":
            refusal = selectors.retry_refusal(todo)
            if refusal is not None:
                raise refusal
        _apply(actor, action, [(todo.pk, state, todo.endpoint_id, todo.queue)])
    todo.refresh_from_db()
    return todo


@dataclass(frozen=True)
class BulkDone:
    action: str
    count: int
    todo_ids: list[UUID]
    # Set when this very selection had been applied already by the same human (a double
    # submit, or a retry whose answer was lost): when it was. Nothing was changed now.
    applied_at: datetime | None = None


# How far back a repeated bulk request is recognised as one already applied (``_applied``).
BULK_REPLAY_WINDOW = timedelta(hours=1)


def todos_bulk(*, actor: HumanActor, action: str, selection: Selection, token: str) -> BulkDone:
    """Retry or discard every todo of a selection, exactly as its confirmation showed it.

    1. Lock the selection's todos in id order (two bulk actions never deadlock; a concurrent
       claim skips them, a concurrent retry or discard waits).
    2. Fingerprint what is locked (ids, states, versions) and compare with ``token``, the
       fingerprint the confirmation showed: anything that moved since (a todo retried, claimed,
       discarded, a new failure) refuses the whole action with ``stale_selection`` and the fresh
       count and token, and nothing changes.
    3. Change them all in one statement, with one ledger row per queue identity.

    The same human sending the same confirmation again (a double submit, a retry whose answer
    was lost) finds it already applied: the ledger rows carry the token. That answers the first
    request's result, marked ``applied_at``, and changes nothing (RFC 9110 13.1.1), where it
    would otherwise read as a stale selection and say that nothing was changed.
    """
    access.check_actor(actor)
    access.check_writes(actor, "auditors read; they do not change todos")
    if not token:
        raise InvalidArgument(
            "selection is required: the token of the confirmation you are confirming",
            field="selection",
        )
    with transaction.atomic():
        if action == "retry":
            # The endpoints first, as a revoke and a single retry take them (see _lock_endpoints).
            _lock_endpoints(
                list(
                    selectors.bulk_rows(actor, action, selection, retryable_only=False)
                    .order_by()
                    .values_list("endpoint_id", flat=True)
                    .distinct()
                )
            )
        locked = list(
            selectors.bulk_rows(actor, action, selection)
            .select_for_update(of=("self",))
            .values_list("id", "state", "updated_at", "endpoint_id", "queue")
        )
        current = selectors.selection_token((i, st, at) for i, st, at, _, _ in locked)
        if current != token:
            done = _applied(actor, action, token)
            if done is not None:
                return done
            raise Conflict(
                f"the selection changed since it was confirmed: {len(locked)} todos match now; "
                "nothing was changed",
                reason="stale_selection",
                count=len(locked),
                selection=current,
            )
        if action == "retry":
            _hold_declared([row[0] for row in locked])
        _apply(actor, action, [(i, st, e, q) for i, st, _, e, q in locked], selection=token)
    return BulkDone(action, len(locked), [row[0] for row in locked])


def _hold_declared(todo_ids: list[UUID]) -> None:
    """The limits the todos being retried name, held declared until the retry commits (a
    limit's delete counts the live todos naming it after that); one deleted since the selection
    was read refuses the whole retry, nothing changed."""
    named = (
        Todo.objects.filter(pk__in=todo_ids)
        .filter(~Q(pool=None) | ~Q(tags=[]) | ~Q(rate_limit=None))
        .values_list("pool", "tags", "rate_limit")
        .distinct()
    )
    for pool, tags, rate_limit in named:
        missing = declared.undeclared(declared.Names(pool, tuple(sorted(tags)), rate_limit))
        if missing:
            kind, name = declared.KINDS[missing[0][0]], missing[0][1]
            raise Conflict(
                f"{kind} limit {name!r} was deleted since the selection was read: nothing was "
                "changed",
                reason=declared.UNDECLARED,
                kind=kind,
                name=name,
            )


def _applied(actor: HumanActor, action: str, token: str) -> BulkDone | None:
    """The result of this human's earlier application of the selection ``token`` names, from
    its ledger rows (committed with the change, so a double submit waiting on the first one's
    row locks finds them), or None. Only the same human's: another's says nothing of theirs."""
    rows = list(
        LedgerEntry.objects.filter(
            kind=_BULK_KINDS[action],
            at__gte=timezone.now() - BULK_REPLAY_WINDOW,
            actor_human_id=actor.user.pk,
            after__selection=token,
        ).values_list("after", "at")
    )
    if not rows:
        return None
    todo_ids = [UUID(t) for after, _ in rows for t in (after or {}).get("todos", [])]
    return BulkDone(action, len(todo_ids), todo_ids, applied_at=min(at for _, at in rows))


_BULK_KINDS = {"retry": LedgerKind.TODO_RETRY, "discard": LedgerKind.TODO_DISCARD}


def _apply(
    actor: HumanActor,
    action: str,
    rows: list[tuple[UUID, str, UUID, str]],
    *,
    selection: str | None = None,
) -> None:
    """Retry or discard locked todos (id, state, endpoint, queue), in the caller's transaction,
    with one ledger row per queue identity naming every todo and the states they left (and, for
    a bulk action, its ``selection`` token: ``_applied``)."""
    if not rows:
        return
    now = timezone.now()
    ids = [row[0] for row in rows]
    if action == "retry":
        try:
            with transaction.atomic():
                # A fresh round of the attempts the todo was pushed with; the attempt number
                # goes on, so no claim after the retry has the number of one before it.
                changed = Todo.objects.filter(pk__in=ids, state=TodoState.FAILED).update(
                    state=TodoState.PENDING,
                    max_attempts=F("attempt") + F("max_attempts") - F("retried_after"),
                    retried_after=F("attempt"),
                    next_retry_at=None,
                    finished_at=None,
                    owner="",
                    updated_at=now,
                )
        except IntegrityError as exc:
            # An agent pushed a todo with one of these keys after the check (selectors.retryable):
            # the live-key index refuses the second live holder.
            if "todo_live_idempotency_key" not in str(exc):
                raise
            raise Conflict(
                "another todo took the idempotency key of a todo being retried meanwhile: "
                "nothing was changed",
                reason="idempotency_key_taken",
            ) from None
        new_state = TodoState.PENDING
    else:
        changed = Todo.objects.filter(pk__in=ids, state__in=BULK_ACTIONS["discard"]).update(
            state=TodoState.DISCARDED,
            next_retry_at=None,
            lease_expires_at=None,
            owner="",
            finished_at=now,
            updated_at=now,
        )
        new_state = TodoState.DISCARDED
    # The rows are locked by this transaction: none can have moved between the read and here.
    assert changed == len(ids), f"{changed} of {len(ids)} locked todos changed"
    groups: dict[tuple[UUID, str], list[tuple[UUID, str]]] = defaultdict(list)
    for todo_id, state, endpoint_id, queue in rows:
        groups[(endpoint_id, queue)].append((todo_id, state))
    slugs = dict(Endpoint.objects.filter(pk__in={e for e, _ in groups}).values_list("id", "slug"))
    kind = _BULK_KINDS[action]
    requeued: list[tuple[UUID, str, UUID | None]] = []
    for (endpoint_id, queue), todos in sorted(
        groups.items(), key=lambda g: (str(g[0][0]), g[0][1])
    ):
        ledger.append(
            kind=kind,
            actor=access.ledger_actor(actor),
            scope=f"endpoint:{slugs[endpoint_id]}",
            queue=queue,
            before={"states": dict(Counter(state for _, state in todos))},
            after={
                "state": new_state,
                "count": len(todos),
                "todos": [str(todo_id) for todo_id, _ in todos],
                **({"selection": selection} if selection is not None else {}),
            },
        )
        # A discard is counted by the todos gauge (state "discarded") and the ledger, not by
        # the completed counter, which counts todos leaving a claim.
        if action == "retry":
            requeued.append((endpoint_id, queue, todos[0][0] if len(todos) == 1 else None))
    if requeued:
        # Rung after the commit, never in this transaction. Lock order: the pause table, then
        # ledger chain 0 (a pause: ACCESS EXCLUSIVE, then its ledger row; a resume and a
        # person's claim alike). This transaction holds chain 0 from its first append to its
        # commit, and a ring's gate reads the pause table: rung here, a retry held chain 0 and
        # waited for a pause's table lock while the pause waited for chain 0, a deadlock
        # (tests/pause/test_pause_ledger_deadlock.py). As a release's ring (``_after_end``).
        wakes.after_commit(lambda: _ring_requeued(requeued))


def _ring_requeued(requeued: list[tuple[UUID, str, UUID | None]]) -> None:
    """After a retry's commit: ring ``requeued`` for each queue identity it gave work back to,
    naming the todo when it was one, in a transaction of its own (each ring passes the gate)."""
    with transaction.atomic():
        for endpoint_id, queue, todo_id in requeued:
            wakes.todo_ready(endpoint_id, queue, todo_id=todo_id, reason="requeued")


def todo_release(*, actor: HumanActor, todo_id: UUID, attempt: int | None = None) -> Todo:
    """Operator release of a claim on an owned endpoint (no lease token needed); ``attempt``:
    only that one (the console sends the attempt its page showed). A todo the operator may see
    that is not claimed is refused saying its state (the release statement, which acts only for
    active endpoints, would call a revoked endpoint's todo "no such todo")."""
    todo = access.todo_to_change(actor, todo_id)
    if todo.state != TodoState.CLAIMED:
        raise Conflict(f"todo is {todo.state}, not claimed", state=todo.state, attempt=todo.attempt)
    return release(actor=actor, todo_id=todo_id, attempt=attempt)
