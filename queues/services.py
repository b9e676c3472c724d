"""Every write to endpoints, todos and attempts: one function per state change.

Called alike by the admin, the pages, the REST API, MCP, the CLI and the sweeps. Keyword-only
arguments; refusals are ``switchboard.errors.DomainError`` subclasses. Counters and notifications
happen only after commit.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from admission import engine, ledger
from admission.models import LedgerKind
from queues import claims, metrics, wakes
from queues.models import (
    BASIC_VERBS,
    GRANTABLE_VERBS,
    LIVE_TODO,
    QUARANTINE_QUEUE,
    QUEUE_NAME_RE,
    SLUG_RE,
    Endpoint,
    EndpointState,
    HumanToken,
    Todo,
    TodoSource,
    TodoState,
)
from queues.principals import Actor, AgentActor, HumanActor
from switchboard import availability, validation
from switchboard.errors import Conflict, Deferred, Forbidden, InvalidArgument, NotFound

ENDPOINT_TOKEN_PREFIX = "sbk_"
HUMAN_TOKEN_PREFIX = "sbh_"
LEASE_TOKEN_PREFIX = "sbl_"
BACKOFF_BASE_SECONDS = 30
BACKOFF_CAP_SECONDS = 900


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def backoff_seconds(attempt: int) -> int:
    """Retry delay after the given failed attempt: min(30 s · 2^(attempt−1), 15 min)."""
    return int(min(BACKOFF_BASE_SECONDS * 2 ** max(attempt - 1, 0), BACKOFF_CAP_SECONDS))


# --- validation shared by every surface -------------------------------------------------------


def check_queue_name(queue: str, *, field_name: str = "queue") -> str:
    if not validation.fullmatch(QUEUE_NAME_RE, queue):
        raise InvalidArgument(
            f"{field_name} must be 1-64 letters, digits, '.', '_', ':' or '-', "
            "starting with a letter or digit",
            field=field_name,
        )
    return queue


def check_slug(slug: str) -> str:
    """An endpoint slug: lowercase letters, digits and '-', and never shaped like a UUID (so
    ``endpoint:<id>`` can never name two endpoints)."""
    if not validation.fullmatch(SLUG_RE, slug):
        raise InvalidArgument("slug must be lowercase letters, digits and '-'", field="slug")
    if looks_like_uuid(slug):
        raise InvalidArgument("slug must not have the shape of an id (a UUID)", field="slug")
    return slug


def looks_like_uuid(value: str) -> bool:
    try:
        UUID(value)
    except (ValueError, TypeError, AttributeError):
        return False
    return True


def resolve_lease_ttl(requested: int | None, endpoint: Endpoint) -> int:
    ttl = requested or endpoint.default_lease_ttl_seconds or settings.DEFAULT_LEASE_TTL_SECONDS
    if requested is not None and not 1 <= requested <= settings.MAX_LEASE_TTL_SECONDS:
        raise InvalidArgument(
            f"lease_ttl_seconds must be between 1 and {settings.MAX_LEASE_TTL_SECONDS}",
            field="lease_ttl_seconds",
        )
    return int(min(ttl, settings.MAX_LEASE_TTL_SECONDS))


# --- endpoints and tokens ---------------------------------------------------------------------


def _slugify(name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:50] or "endpoint"
    if not slug[0].isalnum() or looks_like_uuid(slug):
        slug = "e" + slug if not looks_like_uuid(slug) else "endpoint-" + slug[:40]
    return slug


def endpoint_vend(
    *,
    owner: User,
    name: str,
    queues: list[str],
    verbs: list[str] | None = None,
    lease_ttl_seconds: int | None = None,
    rps: float | None = None,
    burst: int | None = None,
    notify_url: str = "",
    slug: str | None = None,
) -> tuple[Endpoint, str]:
    """Create an endpoint and its token. The token is returned once and stored only as a hash."""
    name = validation.check_text(name or "", "name").strip()
    if not name or len(name) > 200:
        raise InvalidArgument("name is required (at most 200 characters)", field="name")
    if not queues:
        raise InvalidArgument("queues must name at least one queue", field="queues")
    for q in queues:
        check_queue_name(q, field_name="queues")
    verbs = list(BASIC_VERBS) if verbs is None else verbs
    unknown = sorted(set(verbs) - set(GRANTABLE_VERBS))
    if unknown or not verbs:
        raise InvalidArgument(
            f"verbs must be drawn from {', '.join(GRANTABLE_VERBS)}"
            + (f"; unknown: {', '.join(unknown)}" if unknown else ""),
            field="verbs",
        )
    if lease_ttl_seconds is not None and not 1 <= lease_ttl_seconds <= 86400:
        raise InvalidArgument("lease_ttl_seconds must be between 1 and 86400", field="lease_ttl")
    if rps is not None and not 0 <= rps <= 100000:
        raise InvalidArgument("rps must be between 0 (unlimited) and 100000", field="rps")
    if burst is not None and burst < 1:
        raise InvalidArgument("burst must be at least 1", field="burst")
    if slug is not None:
        check_slug(slug)
    token = ENDPOINT_TOKEN_PREFIX + secrets.token_urlsafe(32)
    base = slug or _slugify(name)
    for n in range(100):
        candidate = base if n == 0 else f"{base[:56]}-{secrets.token_hex(3)}"
        if looks_like_uuid(candidate):
            continue
        try:
            with transaction.atomic():
                endpoint = Endpoint.objects.create(
                    slug=candidate,
                    name=name,
                    owner=owner,
                    token_hash=hash_token(token),
                    token_prefix=token[:12],
                    scope_queues=list(dict.fromkeys(queues)),
                    scope_verbs=list(dict.fromkeys(verbs)),
                    default_lease_ttl_seconds=lease_ttl_seconds,
                    rate_limit_rps=rps,
                    rate_limit_burst=burst,
                    notify_url=notify_url,
                    notify_secret=("whsec_" + secrets.token_urlsafe(24)) if notify_url else "",
                )
            return endpoint, token
        except IntegrityError:
            if slug is not None or Endpoint.objects.filter(slug=candidate).exists() is False:
                raise InvalidArgument(f"slug {candidate!r} is taken", field="slug") from None
    raise Conflict("could not find a free slug; name the endpoint differently")


def endpoint_revoke(*, endpoint: Endpoint) -> int:
    """Revoke an endpoint; its live todos are dead-lettered with result endpoint_revoked."""
    with transaction.atomic():
        locked = Endpoint.objects.select_for_update().get(pk=endpoint.pk)
        if locked.state == EndpointState.REVOKED:
            return 0
        now = timezone.now()
        locked.state = EndpointState.REVOKED
        locked.revoked_at = now
        locked.save(update_fields=["state", "revoked_at"])
        with connection.cursor() as cursor:
            cursor.execute(
                """
                WITH revoked AS (
                    UPDATE queues_todo t
                    SET state = 'failed', next_retry_at = NULL, lease_expires_at = NULL,
                        result = '{"error": "endpoint_revoked"}'::jsonb, finished_at = now(),
                        updated_at = now()
                    WHERE t.endpoint_id = %s
                      AND (t.state IN ('pending', 'claimed')
                           OR (t.state = 'failed' AND t.next_retry_at IS NOT NULL))
                    RETURNING t.id, t.attempt, t.queue
                ), closed AS (
                    UPDATE queues_attempt a
                    SET ended_at = now(), outcome = 'revoked', disposition = 'dead_lettered'
                    FROM revoked r
                    WHERE a.todo_id = r.id AND a.number = r.attempt AND a.ended_at IS NULL
                )
                SELECT queue, count(*) FROM revoked GROUP BY queue
                """,
                [locked.id],
            )
            rows = cursor.fetchall()
        total = 0
        for queue, count in rows:
            metrics.completed(queue, "dead_lettered", count)
            total += count
        endpoint.state = locked.state
        endpoint.revoked_at = locked.revoked_at
        return total


def human_token_create(*, user: User, name: str = "api") -> tuple[HumanToken, str]:
    name = (name or "api").strip()[:100]
    token = HUMAN_TOKEN_PREFIX + secrets.token_urlsafe(32)
    obj = HumanToken.objects.create(
        user=user, name=name, token_hash=hash_token(token), token_prefix=token[:12]
    )
    return obj, token


def human_token_revoke(*, token: HumanToken) -> bool:
    updated = HumanToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    return updated == 1


# --- intake -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TodoCreated:
    todo: Todo
    created: bool


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
) -> TodoCreated:
    """Put a todo on a queue. A duplicate idempotency key returns the live todo, created=False."""
    _check_can_write(actor, endpoint)
    check_queue_name(queue)
    if queue not in endpoint.scope_queues:
        if isinstance(actor, AgentActor):
            raise Forbidden(f"queue {queue!r} is not in this endpoint's scope", queue=queue)
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
    try:
        with transaction.atomic():
            availability.check_deadline()
            todo = Todo.objects.create(
                endpoint=endpoint,
                queue=queue,
                title=title,
                kind=kind or "",
                payload=payload,
                idempotency_key=idempotency_key,
                max_attempts=max_attempts,
                source=source,
            )
            metrics.created(queue, source)
            wakes.todo_ready(endpoint.id, queue)
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
            )
        return TodoCreated(todo=existing, created=False)
    return TodoCreated(todo=todo, created=True)


# --- claims -----------------------------------------------------------------------------------


@dataclass
class Claimed:
    todo: Todo
    attempt: int
    lease_token: str | None = None
    admission: dict[str, Any] | None = None


@dataclass
class NothingClaimable:
    """claim_next found nothing: empty, or only deferred work (listed)."""

    deferred: list[dict[str, Any]] = field(default_factory=list)


def _fence(require_fence: bool) -> tuple[str | None, str | None]:
    if not require_fence:
        return None, None
    token = LEASE_TOKEN_PREFIX + secrets.token_urlsafe(24)
    return token, hash_token(token)


def claim_next(
    *,
    actor: AgentActor,
    queue: str | None = None,
    lease_ttl_seconds: int | None = None,
    require_fence: bool = False,
    claimant: str | None = None,
) -> Claimed | NothingClaimable:
    """Claim the oldest claimable todo of the caller's granted queues (or of one of them).

    Seed 000's loop: (1) candidate with SKIP LOCKED, claimed at once when its queue identity has
    no policy; (2) otherwise lock the policy, count, decide; (3) a refusal rolls back to the
    savepoint, excludes that queue and tries the other granted queues; (4) counters after commit.
    """
    endpoint = actor.endpoint
    granted = [q for q in endpoint.scope_queues if q != QUARANTINE_QUEUE]
    if queue is not None:
        check_queue_name(queue)
        if queue not in endpoint.scope_queues:
            raise Forbidden(f"queue {queue!r} is not in this endpoint's scope", queue=queue)
        granted = [queue] if queue != QUARANTINE_QUEUE else []
    ttl = resolve_lease_ttl(lease_ttl_seconds, endpoint)
    lease_token, fence_hash = _fence(require_fence)
    who = _claimant(actor, claimant)
    if not granted:
        return NothingClaimable()
    if not claims.recently_budgeted(endpoint.id):
        # (1) The common path: one statement that commits on its own. It claims at once unless
        # the candidate's queue identity has a policy.
        with claims.hot_cursor() as cursor:
            availability.check_deadline()  # the connection is in hand: late means no claim
            cand = claims.claim_next_candidate(
                cursor,
                endpoint_id=endpoint.id,
                queues=granted,
                excluded=[],
                claimant=who,
                via=actor.via,
                ttl=ttl,
                fence_hash=fence_hash,
            )
        if cand is None:
            return NothingClaimable()
        if cand.todo is not None:
            metrics.claimed(cand.todo.queue, cand.todo.attempt, charged=False)
            return Claimed(todo=cand.todo, attempt=cand.todo.attempt, lease_token=lease_token)
        claims.mark_budgeted(endpoint.id)
    # (2)-(4) The admission path: the seed's loop, in one transaction. First the unlocked
    # pre-read: queues deferred now are excluded without taking their policy lock.
    from admission import selectors as admission_selectors

    refusals = admission_selectors.deferred_among(endpoint.id, granted)
    excluded = [ev.policy.queue for ev in refusals]
    granted_open = [q for q in granted if q not in excluded]
    result: Claimed | None = None
    with transaction.atomic(), claims.hot_cursor() as cursor:
        availability.check_deadline()
        while granted_open:
            cand = claims.claim_next_candidate(
                cursor,
                endpoint_id=endpoint.id,
                queues=granted,
                excluded=excluded,
                claimant=who,
                via=actor.via,
                ttl=ttl,
                fence_hash=fence_hash,
            )
            if cand is None:
                break
            if cand.todo is not None:
                result = Claimed(todo=cand.todo, attempt=cand.todo.attempt, lease_token=lease_token)
                break
            assert cand.policy_id is not None
            admitted = _admit_and_claim(
                cursor, cand.policy_id, cand.todo_id, who, actor, ttl, fence_hash, lease_token
            )
            if isinstance(admitted, Claimed):
                result = admitted
                break
            excluded.append(cand.queue)
            refusals.append(admitted)
        if result is not None:
            metrics.claimed(result.todo.queue, result.attempt, charged=result.admission is not None)
    # A queue the pre-read excluded counts as refused only if it holds pending work: a deferred
    # queue with nothing waiting refuses nobody, and `{"empty": true}` alone means no work.
    entries = [(ev, admission_selectors.deferred_entry(ev, endpoint.id)) for ev in refusals]
    entries = [(ev, entry) for ev, entry in entries if entry["pending"] > 0]
    _record_refusals([ev for ev, _ in entries])
    if result is not None:
        return result
    return NothingClaimable(deferred=[entry for _, entry in entries])


def _admit_and_claim(
    cursor: Any,
    policy_id: UUID,
    todo_id: UUID,
    who: str,
    actor: Actor,
    ttl: int,
    fence_hash: str | None,
    lease_token: str | None,
) -> Claimed | engine.Evaluation:
    """Steps 2-3 of the claim with admission, for a candidate this transaction holds locked.

    Returns the claim, or the refusing evaluation after rolling back to the savepoint (which
    releases the policy lock: a claimer never holds more than one).
    """
    sid = transaction.savepoint()
    policy = engine.lock_policy(cursor, policy_id)
    decision: engine.Decision | None = None
    if policy is not None:  # the policy may have been cleared since the probe
        decision = engine.decide(cursor, policy=policy, todo_id=todo_id, now=timezone.now())
        if not decision.admitted:
            transaction.savepoint_rollback(sid)
            return decision.evaluation
    cand = claims.claim_locked(
        cursor, todo_id=todo_id, claimant=who, via=actor.via, ttl=ttl, fence_hash=fence_hash
    )
    assert cand.todo is not None
    admission: dict[str, Any] | None = None
    if decision is not None:
        engine.charge(cursor, decision)
        ev = decision.evaluation
        if decision.waiver:
            _append_waiver(decision, actor, cand.todo)
        headroom = ev.headroom()
        headroom["in_flight"] = ev.in_flight + 1
        if ev.used is not None:
            headroom["used"] = ev.used + 1
            limit = ev.policy.max_claims_per_window
            headroom["remaining"] = None if limit is None else max(0, limit - ev.used - 1)
        admission = headroom
    # No RELEASE: the transaction's COMMIT releases the savepoint, one round trip fewer while the
    # policy lock is held.
    return Claimed(
        todo=cand.todo, attempt=cand.todo.attempt, lease_token=lease_token, admission=admission
    )


def _append_waiver(decision: engine.Decision, actor: Actor, todo: Todo) -> None:
    ev = decision.evaluation
    owner = todo.endpoint.owner if isinstance(actor, AgentActor) else None
    human = actor.user if isinstance(actor, HumanActor) else owner
    ledger.append(
        kind=LedgerKind.ADMISSION_WAIVER,
        actor=ledger.Actor(
            human_id=getattr(human, "pk", None),
            human_name=human.get_username() if human is not None else "",
            endpoint_id=actor.endpoint.id if isinstance(actor, AgentActor) else None,
            endpoint_slug=actor.endpoint.slug if isinstance(actor, AgentActor) else "",
        ),
        scope=f"endpoint:{todo.endpoint.slug}",
        queue=todo.queue,
        after={
            "todo": str(todo.id),
            "attempt": todo.attempt,
            "posture": ev.policy.posture,
            "reason": ev.reason,
            "exceeded": ev.exceeded,
            "in_flight": ev.in_flight,
            "max_in_flight": ev.policy.max_in_flight,
            "used": ev.used,
            "max_claims_per_window": ev.policy.max_claims_per_window,
            "window_start": ev.window_start.isoformat() if ev.window_start else None,
        },
    )


def _record_refusals(refusals: list[engine.Evaluation]) -> None:
    """Count refusals after the claim transaction, holding no policy lock (no lock-order cycle)."""
    for ev in refusals:
        metrics.refused(ev.policy.queue, ev.reason or "")
        with transaction.atomic(), connection.cursor() as cursor:
            engine.record_refusal(cursor, ev)


def _claimant(actor: Actor, claimant: str | None) -> str:
    if claimant is not None:
        claimant = validation.check_text(claimant, "claimant").strip()
        if not claimant or len(claimant) > 200:
            raise InvalidArgument("claimant must be 1-200 characters", field="claimant")
        return claimant
    return actor.label


def _scoped_endpoint_ids(actor: Actor) -> list[UUID]:
    if isinstance(actor, AgentActor):
        return [actor.endpoint.id]
    qs = Endpoint.objects.filter(state=EndpointState.ACTIVE)
    if not actor.is_superuser:
        qs = qs.filter(owner_id=actor.user.pk)
    return list(qs.values_list("id", flat=True))


def claim(
    *,
    actor: Actor,
    todo_id: UUID,
    lease_ttl_seconds: int | None = None,
    require_fence: bool = False,
    claimant: str | None = None,
) -> Claimed:
    """Claim one todo (the agent's claim, or the operator's board claim on an owned endpoint).

    Locks the row with FOR UPDATE (waiting for another holder), then the same admission step as
    claim_next. A deferred queue refuses with ``deferred`` and changes nothing.
    """
    if isinstance(actor, HumanActor) and actor.is_auditor and not actor.is_superuser:
        raise Forbidden("auditors read; they do not claim")
    lease_token, fence_hash = _fence(require_fence)
    who = _claimant(actor, claimant)
    refusal: engine.Evaluation | None = None
    result: Claimed | None = None
    with transaction.atomic(), claims.hot_cursor() as cursor:
        availability.check_deadline()
        locked = claims.lock_one(cursor, todo_id=todo_id, endpoint_ids=_scoped_endpoint_ids(actor))
        if locked is None:
            raise NotFound("no such todo", id=str(todo_id))
        endpoint = Endpoint.objects.get(pk=locked.endpoint_id)
        if isinstance(actor, AgentActor) and locked.queue not in endpoint.scope_queues:
            raise Forbidden(f"queue {locked.queue!r} is not in this endpoint's scope")
        ttl = resolve_lease_ttl(lease_ttl_seconds, endpoint)
        if locked.paused:
            raise Conflict(
                f"queue {locked.queue!r} is paused", reason="queue_paused", queue=locked.queue
            )
        if not locked.claimable:
            raise Conflict(
                f"todo is {locked.state} and cannot be claimed"
                + (" (quarantine is never delivered)" if locked.queue == QUARANTINE_QUEUE else ""),
                state=locked.state,
            )
        if locked.policy_id is None:
            cand = claims.claim_locked(
                cursor, todo_id=todo_id, claimant=who, via=actor.via, ttl=ttl, fence_hash=fence_hash
            )
            assert cand.todo is not None
            result = Claimed(todo=cand.todo, attempt=cand.todo.attempt, lease_token=lease_token)
        else:
            outcome = _admit_and_claim(
                cursor, locked.policy_id, todo_id, who, actor, ttl, fence_hash, lease_token
            )
            if isinstance(outcome, Claimed):
                result = outcome
            else:
                refusal = outcome
        if result is not None:
            metrics.claimed(result.todo.queue, result.attempt, charged=result.admission is not None)
    if refusal is not None:
        _record_refusals([refusal])
        raise _deferred_error(refusal)
    assert result is not None
    return result


def _deferred_error(ev: engine.Evaluation) -> Deferred:
    from admission.models import DeferralReason

    details: dict[str, Any] = {
        "queue": ev.policy.queue,
        "reason": ev.reason,
        "next_eligible_at": ev.next_eligible_at.isoformat() if ev.next_eligible_at else None,
        "exact": ev.exact,
    }
    if ev.reason == DeferralReason.ADMISSION_UNAVAILABLE:
        text = "its admission policy cannot be evaluated"
    elif ev.next_eligible_at:
        text = f"{ev.reason}; eligible at {ev.next_eligible_at.isoformat()}"
    else:
        text = str(ev.reason)
    return Deferred(f"queue {ev.policy.queue!r} is deferred: {text}", **details)


# --- transitions of a claimed todo ------------------------------------------------------------

# The caller holds the claim: the current attempt is open, its lease has not lapsed, and the
# caller names it. A fenced attempt needs its token; a token or an attempt number naming another
# attempt is a superseded holder. Operators (release from the console) need neither.
_HOLDS_CLAIM = """
    t.id = %(id)s AND t.endpoint_id = ANY(%(endpoints)s) AND t.state = 'claimed'
    AND a.todo_id = t.id AND a.number = t.attempt AND a.ended_at IS NULL
    AND (%(operator)s OR (
        t.lease_expires_at > clock_timestamp()
        AND (%(attempt)s::int IS NULL OR t.attempt = %(attempt)s::int)
        AND (a.lease_token_hash IS NOT DISTINCT FROM %(fence)s::text)))
"""


def _transition(
    actor: Actor,
    todo_id: UUID,
    sql: str,
    params: dict[str, Any],
    lease_token: str | None,
    attempt: int | None = None,
) -> Todo:
    endpoint_ids = _scoped_endpoint_ids(actor)
    if isinstance(actor, HumanActor) and actor.is_auditor and not actor.is_superuser:
        raise Forbidden("auditors read; they do not change todos")
    params = {
        **params,
        "id": todo_id,
        "endpoints": endpoint_ids,
        "operator": isinstance(actor, HumanActor),
        "fence": hash_token(lease_token) if lease_token else None,
        "attempt": attempt,
    }
    # One statement, committed on its own unless the caller holds a transaction.
    with claims.hot_cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
        if row is None:
            _raise_unmatched(cursor, todo_id, endpoint_ids, lease_token, attempt)
    assert row is not None
    *columns, budgeted = row
    todo = claims.todo_from_row(columns)
    todo._budgeted = budgeted  # type: ignore[attr-defined]
    return todo


def _raise_unmatched(
    cursor: Any,
    todo_id: UUID,
    endpoint_ids: list[UUID],
    lease_token: str | None,
    attempt: int | None = None,
) -> None:
    """A transition that matched nothing: conflict in scope, not_found outside it. Every verb
    names the same reasons, in the same order: not claimed, superseded, lapsed, wrong token."""
    cursor.execute(
        """
        SELECT t.state, t.attempt, t.lease_expires_at > clock_timestamp(), a.lease_token_hash
        FROM queues_todo t
        LEFT JOIN queues_attempt a ON a.todo_id = t.id AND a.number = t.attempt
        WHERE t.id = %s AND t.endpoint_id = ANY(%s)
        """,
        [todo_id, endpoint_ids],
    )
    found = cursor.fetchone()
    if found is None:
        raise NotFound("no such todo", id=str(todo_id))
    state, current, live, token_hash = found
    if state != TodoState.CLAIMED:
        raise Conflict(f"todo is {state}, not claimed", state=state, attempt=current)
    presented = hash_token(lease_token) if lease_token else None
    if (attempt is not None and attempt != current) or (presented and presented != token_hash):
        raise Conflict(
            "this attempt was superseded: the todo was claimed again since",
            state=state,
            reason="superseded",
            attempt=current,
        )
    if not live:
        raise Conflict("the lease has lapsed", state=state, reason="lease_lapsed", attempt=current)
    raise Conflict(
        "the lease token is missing or wrong for this claim",
        state=state,
        reason="fence_mismatch",
        attempt=current,
    )


# Whether the todo's queue identity has an in-flight cap: a claim that ends may free a slot.
_BUDGETED = """EXISTS (SELECT 1 FROM admission_admissionpolicy p
                       WHERE p.endpoint_id = t.endpoint_id AND p.queue = t.queue
                         AND p.max_in_flight IS NOT NULL)"""

HEARTBEAT_SQL = f"""
WITH held AS (
    SELECT t.id, a.id AS attempt_id FROM queues_todo t, queues_attempt a
    WHERE {_HOLDS_CLAIM} AND t.lease_expires_at > clock_timestamp()
    FOR UPDATE OF t
), lease AS (
    UPDATE queues_attempt a SET lease_expires_at = clock_timestamp() + make_interval(secs => %(ttl)s)
    FROM held h WHERE a.id = h.attempt_id
)
UPDATE queues_todo t
SET lease_expires_at = clock_timestamp() + make_interval(secs => %(ttl)s),
    updated_at = clock_timestamp()
FROM held h WHERE t.id = h.id
RETURNING {claims.TODO_COLUMNS}, {_BUDGETED}
"""


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
    return _transition(actor, todo_id, HEARTBEAT_SQL, {"ttl": ttl}, lease_token, attempt)


def _human_ttl(requested: int | None) -> int:
    if requested is not None and not 1 <= requested <= settings.MAX_LEASE_TTL_SECONDS:
        raise InvalidArgument(
            f"lease_ttl_seconds must be between 1 and {settings.MAX_LEASE_TTL_SECONDS}",
            field="lease_ttl_seconds",
        )
    return requested or settings.DEFAULT_LEASE_TTL_SECONDS


def _ending_sql(todo_set: str, attempt_outcome: str, disposition: str) -> str:
    """A claimed todo leaves the claim: close the attempt and set the todo's new state."""
    return f"""
WITH held AS (
    SELECT t.id, t.attempt, t.max_attempts, t.queue, a.id AS attempt_id
    FROM queues_todo t, queues_attempt a
    WHERE {_HOLDS_CLAIM}
    FOR UPDATE OF t
), ended AS (
    UPDATE queues_attempt a
    SET ended_at = clock_timestamp(), outcome = {attempt_outcome},
        disposition = {disposition}, summary = %(summary)s
    FROM held h WHERE a.id = h.attempt_id
)
UPDATE queues_todo t SET {todo_set}, updated_at = clock_timestamp()
FROM held h WHERE t.id = h.id
RETURNING {claims.TODO_COLUMNS}, {_BUDGETED}
"""


COMPLETE_SQL = _ending_sql(
    "state = 'done', result = %(result)s, lease_expires_at = NULL, finished_at = clock_timestamp()",
    "'completed'",
    "'done'",
)

# At max_attempts a failure is final: a dead letter (failed with no next_retry_at).
FAIL_SQL = _ending_sql(
    """state = 'failed', result = %(result)s, lease_expires_at = NULL,
       next_retry_at = CASE WHEN h.attempt < h.max_attempts
           THEN clock_timestamp() + make_interval(
               secs => LEAST(%(base)s * power(2, h.attempt - 1), %(cap)s))
           ELSE NULL END,
       finished_at = CASE WHEN h.attempt < h.max_attempts THEN NULL ELSE clock_timestamp() END""",
    "'failed'",
    "CASE WHEN h.attempt < h.max_attempts THEN 'retry_scheduled' ELSE 'dead_lettered' END",
)

# Back to pending with the attempt unchanged and no backoff. A release of the last attempt has
# no attempt left to return to, so it dead-letters, as the reaper does at the cap.
RELEASE_SQL = _ending_sql(
    """state = CASE WHEN h.attempt < h.max_attempts THEN 'pending' ELSE 'failed' END,
       owner = '', lease_expires_at = NULL,
       result = CASE WHEN h.attempt < h.max_attempts THEN t.result
                     ELSE '{"error": "attempts_exhausted"}'::jsonb END,
       finished_at = CASE WHEN h.attempt < h.max_attempts THEN NULL ELSE clock_timestamp() END""",
    "'released'",
    "CASE WHEN h.attempt < h.max_attempts THEN 'requeued' ELSE 'dead_lettered' END",
)


def _json_param(value: Any) -> Any:
    from psycopg.types.json import Jsonb

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
    todo = _transition(
        actor,
        todo_id,
        COMPLETE_SQL,
        {"result": _json_param(result), "summary": _summary(summary)},
        lease_token,
        attempt,
    )
    _after_end(todo, "done")
    return todo


def fail(
    *,
    actor: Actor,
    todo_id: UUID,
    error: Any = None,
    summary: str = "",
    lease_token: str | None = None,
    attempt: int | None = None,
) -> Todo:
    validation.check_stored_json(error, "error")
    todo = _transition(
        actor,
        todo_id,
        FAIL_SQL,
        {
            "result": _json_param({"error": error} if error is not None else None),
            "summary": _summary(summary),
            "base": BACKOFF_BASE_SECONDS,
            "cap": BACKOFF_CAP_SECONDS,
        },
        lease_token,
        attempt,
    )
    _after_end(todo, "dead_lettered" if todo.dead_letter else "failed")
    return todo


def release(
    *, actor: Actor, todo_id: UUID, lease_token: str | None = None, attempt: int | None = None
) -> Todo:
    todo = _transition(actor, todo_id, RELEASE_SQL, {"summary": ""}, lease_token, attempt)
    if todo.state == TodoState.FAILED:
        _after_end(todo, "dead_lettered")
    else:
        _after_end(todo, None)
        transaction.on_commit(lambda: wakes.todo_ready_now(todo.endpoint_id, todo.queue))
    return todo


def _summary(summary: str | None) -> str:
    summary = validation.check_text(summary or "", "summary")
    if len(summary) > 10000:
        raise InvalidArgument("summary is at most 10000 characters", field="summary")
    return summary


def _after_end(todo: Todo, outcome: str | None) -> None:
    """A slot may have freed: count the outcome and ring the reopen for this queue identity."""
    if outcome is not None:
        metrics.completed(todo.queue, outcome)
    if getattr(todo, "_budgeted", True):
        transaction.on_commit(lambda: wakes.slot_freed(todo.endpoint_id, todo.queue))


# --- operator actions -------------------------------------------------------------------------


def _check_can_write(actor: Actor, endpoint: Endpoint) -> None:
    if isinstance(actor, AgentActor):
        if actor.endpoint.id != endpoint.id:
            raise NotFound("no such endpoint")
        return
    if actor.is_superuser:
        return
    if actor.is_auditor or endpoint.owner_id != getattr(actor.user, "pk", None):
        raise Forbidden("only the endpoint's owner may change its todos")
    if endpoint.state != EndpointState.ACTIVE:
        raise Conflict("the endpoint is revoked")


def todo_retry(*, actor: HumanActor, todo_id: UUID) -> Todo:
    """Operator retry: a failed todo (waiting or dead-lettered) back to pending, attempt reset."""
    todo = _operator_todo(actor, todo_id)
    with transaction.atomic():
        updated = Todo.objects.filter(pk=todo.pk, state=TodoState.FAILED).update(
            state=TodoState.PENDING,
            attempt=0,
            next_retry_at=None,
            finished_at=None,
            owner="",
            updated_at=timezone.now(),
        )
        if updated != 1:
            raise Conflict(
                f"todo is {todo.state}; only a failed todo can be retried", state=todo.state
            )
        wakes.todo_ready(todo.endpoint_id, todo.queue)
    todo.refresh_from_db()
    return todo


def todo_release(*, actor: HumanActor, todo_id: UUID) -> Todo:
    """Operator release of a claim on an owned endpoint (no lease token needed)."""
    return release(actor=actor, todo_id=todo_id)


def _operator_todo(actor: HumanActor, todo_id: UUID) -> Todo:
    todo = Todo.objects.select_related("endpoint").filter(pk=todo_id).first()
    if todo is None or not (actor.is_superuser or todo.endpoint.owner_id == actor.user.pk):
        raise NotFound("no such todo", id=str(todo_id))
    if actor.is_auditor and not actor.is_superuser:
        raise Forbidden("auditors read; they do not change todos")
    return todo


# --- sweeps -----------------------------------------------------------------------------------

REAP_SQL = """
WITH lapsed AS (
    SELECT t.id FROM queues_todo t
    WHERE t.state = 'claimed' AND t.lease_expires_at <= now()
    ORDER BY t.lease_expires_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), reaped AS (
    UPDATE queues_todo t
    SET state = CASE WHEN t.attempt < t.max_attempts THEN 'pending' ELSE 'failed' END,
        owner = '', lease_expires_at = NULL, next_retry_at = NULL,
        result = CASE WHEN t.attempt < t.max_attempts THEN t.result
                      ELSE '{"error": "lease_expired"}'::jsonb END,
        finished_at = CASE WHEN t.attempt < t.max_attempts THEN NULL ELSE now() END,
        updated_at = now()
    FROM lapsed l WHERE t.id = l.id
    RETURNING t.id, t.endpoint_id, t.queue, t.attempt, t.state
), closed AS (
    UPDATE queues_attempt a
    SET ended_at = now(), outcome = 'expired',
        disposition = CASE WHEN r.state = 'pending' THEN 'requeued' ELSE 'dead_lettered' END
    FROM reaped r WHERE a.todo_id = r.id AND a.number = r.attempt AND a.ended_at IS NULL
)
SELECT endpoint_id, queue, state, count(*) FROM reaped GROUP BY endpoint_id, queue, state
"""

REQUEUE_SQL = """
WITH due AS (
    SELECT t.id FROM queues_todo t
    WHERE t.state = 'failed' AND t.next_retry_at <= now()
    ORDER BY t.next_retry_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), requeued AS (
    UPDATE queues_todo t SET state = 'pending', next_retry_at = NULL, updated_at = now()
    FROM due d WHERE t.id = d.id
    RETURNING t.endpoint_id, t.queue
)
SELECT endpoint_id, queue, count(*) FROM requeued GROUP BY endpoint_id, queue
"""

SWEEP_BATCH = 500


def reap_expired() -> int:
    """Lapsed claims back to pending, or dead-lettered at the cap. Safe to run twice at once:
    SKIP LOCKED means two sweeps never process the same row."""
    total = 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(REAP_SQL, {"batch": SWEEP_BATCH})
            rows = cursor.fetchall()
            n = 0
            for endpoint_id, queue, state, count in rows:
                n += count
                metrics.leases_expired(queue, count)
                if state == TodoState.FAILED:
                    metrics.completed(queue, "dead_lettered", count)
                else:
                    wakes.todo_ready(endpoint_id, queue)
                transaction.on_commit(
                    lambda e=endpoint_id, q=queue: wakes.slot_freed(e, q)  # type: ignore[misc]
                )
        total += n
        if n < SWEEP_BATCH:
            return total


def requeue_due_retries() -> int:
    """Failed todos whose backoff elapsed back to pending (a paused queue's wait there)."""
    total = 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(REQUEUE_SQL, {"batch": SWEEP_BATCH})
            rows = cursor.fetchall()
            n = 0
            for endpoint_id, queue, count in rows:
                n += count
                wakes.todo_ready(endpoint_id, queue)
        total += n
        if n < SWEEP_BATCH:
            return total


def touch_endpoint(endpoint: Endpoint, now: datetime | None = None) -> None:
    """Record that an endpoint was seen, at most once a minute (a cheap compare-and-set)."""
    now = now or timezone.now()
    if endpoint.last_seen_at and (now - endpoint.last_seen_at).total_seconds() < 60:
        return
    Endpoint.objects.filter(pk=endpoint.pk).update(last_seen_at=now)
    endpoint.last_seen_at = now
