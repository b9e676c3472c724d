"""Every write to admission policies, and the admission sweeps (reopen, retention).

Called alike by the API, MCP (the agent's own-budget verbs), the CLI, the admin and Celery beat.
Keyword-only arguments; refusals are ``switchboard.core.errors`` domain errors naming the field.

A policy write (1) finds the endpoint the actor may change (foreign and unknown: not_found),
(2) validates every field, mirroring every database constraint, (3) takes a token from the
writer's bucket, (4) in one transaction locks the policy row and its shard locks (so it waits for
every claim of the budget in progress, and none starts until it commits: ``engine.lock_shards``),
changes it and appends the ledger row (lock order: policy row, shards, ledger), and (5) after commit rings the queue identity if the change
admitted it.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID

import redis
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from admission import engine, selectors
from admission.models import PRIMARY_WINDOW_KEY, AdmissionPolicy, AdmissionWindow, Posture
from admission.policy import FIELD_OF_CONSTRAINT, PolicySpec, Window
from queues import access, wakes
from queues.access import Actor, AgentActor, HumanActor
from queues.models import Endpoint, EndpointState, Verb, check_queue_name
from queues.sql import gated
from switchboard.core import counters, ratelimit, versions
from switchboard.core.errors import (
    Conflict,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
    RateLimited,
)
from switchboard.core.times import iso
from switchboard.ledger import chain as ledger
from switchboard.ledger.models import LedgerKind

log = logging.getLogger(__name__)

# --- who writes -----------------------------------------------------------------------------------


def _accountable(actor: Actor, endpoint: Endpoint) -> Any:
    """The human answerable for a write (a user): the operator, or the acting agent's owner."""
    if isinstance(actor, AgentActor):
        return endpoint.owner
    user = actor.user
    assert isinstance(user, AbstractBaseUser), "an anonymous user never reaches a write"
    return user


def _ledger_actor(actor: Actor, endpoint: Endpoint) -> ledger.Actor:
    return access.ledger_actor(actor, owner=_accountable(actor, endpoint))


def _take_write_token(actor: Actor) -> None:
    rate, burst = settings.POLICY_WRITE_RATE_LIMIT
    if isinstance(actor, AgentActor):
        key = f"policy-writes:endpoint:{actor.endpoint.id}"
    else:
        key = f"policy-writes:{actor.user.pk}"
    allowed, retry_after = ratelimit.take(key, rate=rate, burst=burst)
    if not allowed:
        raise RateLimited(
            f"too many budget changes: at most {rate:g}/s with a burst of {burst}",
            retry_after=retry_after,
        )


# --- writes ---------------------------------------------------------------------------------------


def policy_set(
    *,
    actor: Actor,
    endpoint: Endpoint | str,
    queue: str,
    max_in_flight: int | None,
    max_claims_per_window: int | None,
    window: Mapping[str, Any] | None,
    posture: str | None = Posture.ENFORCE,
    windows: Sequence[Mapping[str, Any]] | None = None,
    expected: Collection[str] | None = None,
) -> AdmissionPolicy:
    """Create or fully replace the budget of one queue identity (the numbered steps above).

    A write that changes nothing stores nothing and appends no ledger row. ``expected``: write
    only over one of these versions (``_check_expected``), checked under the row lock.
    """
    access.check_actor(actor)
    target = selectors.endpoint_for(actor, endpoint, write=True)  # 1
    access.check_policy_write(actor, target, queue, Verb.SET_ADMISSION_POLICY)
    if target.state != EndpointState.ACTIVE:
        raise Conflict("the endpoint is revoked; its budgets can only be cleared")
    spec = PolicySpec.clean(  # 2
        queue=queue,
        max_in_flight=max_in_flight,
        max_claims_per_window=max_claims_per_window,
        window=window,
        posture=posture,
        windows=windows,
    )
    if spec.queue not in target.scope_queues:
        # A budget where the endpoint never claims would govern nothing (an agent hears 403 from
        # check_policy_write first, as todo_create answers alike).
        raise InvalidArgument(
            f"queue {spec.queue!r} is not in endpoint {target.slug}'s scope "
            f"({', '.join(target.scope_queues)}): a budget there would govern nothing",
            field="queue",
        )
    _take_write_token(actor)  # 3
    human = _accountable(actor, target)
    try:
        with transaction.atomic():  # 4
            policy, was_admitted = _write(actor, target, spec, human, expected)
    except IntegrityError as exc:
        raise _constraint_refusal(exc) from None
    transaction.on_commit(  # 5
        lambda: reopen_identity(target.id, spec.queue, was_admitted=was_admitted)
    )
    return policy


def _write(
    actor: Actor,
    target: Endpoint,
    spec: PolicySpec,
    human: Any,
    expected: Collection[str] | None,
) -> tuple[AdmissionPolicy, bool]:
    """Step 4 of policy_set: lock (or create) the row, change it, append the ledger row."""
    existing = _lock(target, spec.queue)
    creates = 0
    while existing is None:
        _check_expected(None, expected, target, spec.queue)
        if creates == _CREATE_TRIES:
            raise Conflict(
                f"the budget on endpoint:{target.slug}/{spec.queue} was set and removed again "
                "by others while this write ran: nothing was written; try again",
                scope=f"endpoint:{target.slug}",
                queue=spec.queue,
            )
        creates += 1
        try:
            with transaction.atomic():
                policy = AdmissionPolicy.objects.create(
                    endpoint=target,
                    queue=spec.queue,
                    created_by=human,
                    updated_by=human,
                    **spec.columns(),
                )
        except IntegrityError as exc:
            if _constraint_name(exc) != "admission_policy_identity":
                raise
            # Another writer created it first; its row is committed now, so lock and update it,
            # unless a third removed it again meanwhile: then create it once more.
            existing = _lock(target, spec.queue)
        else:
            ledger.append(
                kind=LedgerKind.POLICY_CREATE,
                actor=_ledger_actor(actor, target),
                scope=f"endpoint:{target.slug}",
                queue=spec.queue,
                before=None,
                after=selectors.policy_dict(policy),
            )
            return policy, True
    was_admitted = selectors.evaluate_policy(existing).admits
    before = selectors.policy_dict(existing)
    version = selectors.policy_version(existing)
    first_before = _first_window(PolicySpec.of(existing))
    for name, value in spec.columns().items():
        setattr(existing, name, value)
    after = selectors.policy_dict(existing)
    if after == before:
        # Already as asked: nothing to write, whatever version the writer read (RFC 9110
        # 13.1.1: a change already applied may succeed), so a double submit, or a retry whose
        # answer was lost, is not refused for the change it made itself.
        return existing, was_admitted
    _check_expected(existing, expected, target, spec.queue, version=version)
    existing.updated_by = human
    existing.save()
    _follow_first_window(existing.id, first_before, _first_window(spec))
    ledger.append(
        kind=LedgerKind.POLICY_UPDATE,
        actor=_ledger_actor(actor, target),
        scope=f"endpoint:{target.slug}",
        queue=spec.queue,
        before=before,
        after=after,
    )
    return existing, was_admitted


def _first_window(spec: PolicySpec) -> Window | None:
    windows = spec.windows
    return windows[0].window if windows else None


def _same_window(a: Window | None, b: Window | None) -> bool:
    """Whether two first windows are one: equal, or starting and ending at the same instants
    (an hour window's start counts by its minutes alone)."""
    return a == b or (a is not None and b is not None and a.boundaries == b.boundaries)


def counters_after_save(before: PolicySpec | None, after: PolicySpec) -> dict[str, list[str]]:
    """The stored counter keys each of ``after``'s windows reads (summed) once a save over
    ``before`` has moved the counters (``_follow_first_window``); {} when nothing moves. The
    budget preview evaluates the change with it, so it shows the count the save gives."""
    if before is None:
        return {}  # a new budget: a policy of its own, no counters
    first_before, first_after = _first_window(before), _first_window(after)
    if _same_window(first_before, first_after) or first_after is None:
        return {}
    read: dict[str, list[str]] = {}
    for item in after.windows:
        if item.key == PRIMARY_WINDOW_KEY:
            read[item.key] = [first_after.key]  # its own definition's rows come to the front
        elif first_before is not None and item.key == first_before.key:
            read[item.key] = [PRIMARY_WINDOW_KEY, item.key]  # the old first's, merged in
    return read


# Rows of one counter key moved to another (merged into a row already there: each counted
# claims charged under the same window definition).
_MOVE_COUNTERS_SQL = """
    WITH moved AS (
        DELETE FROM admission_admissionwindow
        WHERE policy_id = %(policy)s AND window_key = %(source)s
        RETURNING window_start, shard, used, refused, claims_limit, updated_at
    )
    INSERT INTO admission_admissionwindow
        (policy_id, window_key, window_start, shard, used, refused, claims_limit, updated_at)
    SELECT %(policy)s, %(target)s, window_start, shard, used, refused, claims_limit, updated_at
    FROM moved
    ON CONFLICT (policy_id, window_key, window_start, shard) DO UPDATE SET
        used = admission_admissionwindow.used + EXCLUDED.used,
        refused = admission_admissionwindow.refused + EXCLUDED.refused,
        updated_at = GREATEST(admission_admissionwindow.updated_at, EXCLUDED.updated_at)
"""


def _follow_first_window(policy_id: UUID, before: Window | None, after: Window | None) -> None:
    """Keep each window's counter with its definition when the first window changes.

    The first window counts under ``PRIMARY_WINDOW_KEY``, every other under its definition
    (``Window.key``), so a window's count followed its place in the list: a week window moved
    behind a new hourly one started again from 0, and moved back found the count it had as the
    first, admitting 7 claims in a week under a limit of 5 in force throughout; a new first
    window whose start fell on the old one's took over its count. Here, under the policy row
    and every shard lock (so no claim charges meanwhile), the old first window's rows go to its
    definition's key and the new first window's come from theirs. A window's count is then the
    claims charged while its definition was in force, wherever it stood in the list.

    A first window written again with the same boundaries (an hour window's start at another
    hour, same minute: ``Window.boundaries``) is the same window, and keeps its count."""
    if _same_window(before, after):
        return
    with connection.cursor() as cursor:
        if before is not None:
            cursor.execute(
                _MOVE_COUNTERS_SQL,
                {"policy": policy_id, "source": PRIMARY_WINDOW_KEY, "target": before.key},
            )
        if after is not None:
            cursor.execute(
                _MOVE_COUNTERS_SQL,
                {"policy": policy_id, "source": after.key, "target": PRIMARY_WINDOW_KEY},
            )


def _check_expected(
    existing: AdmissionPolicy | None,
    expected: Collection[str] | None,
    target: Endpoint,
    queue: str,
    *,
    version: str | None = None,
) -> None:
    """Refuse a conditional write whose budget is not as its writer read it.

    ``expected`` holds the versions the writer will write over (``selectors.policy_version``):
    ``versions.ABSENT`` for none, ``versions.ANY`` for any budget. None: write whatever is
    there. Called with the row locked (or known absent under the identity's unique key), so no
    write lands between the check and the change. ``version``: ``existing``'s, read before the
    caller changed its fields.
    """
    if version is None:
        version = selectors.policy_version(existing)
    if versions.holds(expected, version if existing is not None else None):
        return
    assert expected is not None
    identity = f"endpoint:{target.slug}/{queue}"
    if existing is None:
        # Cleared since it was read, or never set: the version named is not one of a budget here.
        message = (
            f"{identity} has no budget now (cleared since it was read, or none was ever set): "
            "nothing was written"
        )
    else:
        who = existing.updated_by.get_username() if existing.updated_by_id else "someone"
        when = iso(existing.updated_at)
        if versions.ABSENT in expected:
            message = f"{identity} has a budget now (set by {who} at {when}): nothing was written"
        else:
            message = (
                f"the budget of {identity} changed since it was read (last changed by {who} at "
                f"{when}): nothing was written; read it again"
            )
    raise PreconditionFailed(
        message,
        scope=f"endpoint:{target.slug}",
        queue=queue,
        version=version if existing is not None else None,  # the budget's now: none is null
    )


# Creations of a budget another writer's create beat and a third's clear removed again, before
# this write gives up (each such round is two other writes of the same budget: a rare race).
_CREATE_TRIES = 5


def _lock(endpoint: Endpoint, queue: str) -> AdmissionPolicy | None:
    """The policy row, locked, then all of its shard locks: a claim on the fast path holds a
    shard (never the row) from its usage read to its commit. ``no_key``: a claim's window row
    insert checks its foreign key (``FOR KEY SHARE`` of this row) at commit, holding its shard
    (``engine.lock_policy`` says why that must not wait for this lock).

    The row is read alone, with no join: a locked row another write changed meanwhile is
    checked again against the joined rows as first read, and with ``updated_by`` joined, a
    budget last written by another person dropped out (races11: a clear answered 404 "no
    budget" for a budget that was there, and a set took the create path and failed)."""
    policy = (
        AdmissionPolicy.objects.select_for_update(no_key=True)
        .filter(endpoint=endpoint, queue=queue)
        .first()
    )
    if policy is not None:
        policy.endpoint = endpoint  # the caller's, as the join gave it; the editor is read lazily
        with connection.cursor() as cursor:
            engine.lock_shards(cursor, policy.id)
    return policy


def _constraint_name(exc: IntegrityError) -> str | None:
    diag = getattr(exc.__cause__, "diag", None)
    return getattr(diag, "constraint_name", None)


def _constraint_refusal(exc: IntegrityError) -> InvalidArgument:
    name = _constraint_name(exc)
    field = FIELD_OF_CONSTRAINT.get(name or "")
    if field is None:
        raise exc
    return InvalidArgument(f"the database refused the policy ({name})", field=field)


def policy_clear(
    *,
    actor: Actor,
    endpoint: Endpoint | str,
    queue: str,
    expected: Collection[str] | None = None,
) -> dict[str, Any]:
    """Remove a queue identity's budget; the ledger keeps its history. Returns what was removed.
    ``expected``: clear only one of these versions, as ``policy_set``."""
    access.check_actor(actor)
    check_queue_name(queue)  # before a write token is spent on a budget no name can have
    target = selectors.endpoint_for(actor, endpoint, write=True)
    access.check_policy_write(actor, target, queue, Verb.CLEAR_ADMISSION_POLICY)
    _take_write_token(actor)
    with transaction.atomic():
        existing = _lock(target, queue)
        if existing is None:  # conditional or not: there is nothing to clear
            raise NotFound(
                f"no budget on endpoint:{target.slug}/{queue}",
                scope=f"endpoint:{target.slug}",
                queue=queue,
            )
        _check_expected(existing, expected, target, queue)
        was_admitted = selectors.evaluate_policy(existing).admits
        before = selectors.policy_dict(existing)
        policy_id = existing.id
        with connection.cursor() as cursor:
            # FOR UPDATE, which a counter row's foreign key check (FOR KEY SHARE) waits for: a
            # refusal counted after this transaction's delete of the counter rows, before its
            # delete of the policy, failed this commit on that key (regress11: 500 to the
            # operator). Once held, a refusal's count waits for the commit and is dropped
            # (engine.record_refusal). Every shard is held already: no claim waits for it.
            cursor.execute(
                "SELECT 1 FROM admission_admissionpolicy WHERE id = %s FOR UPDATE", [policy_id]
            )
        existing.delete()
        ledger.append(
            kind=LedgerKind.POLICY_DELETE,
            actor=_ledger_actor(actor, target),
            scope=f"endpoint:{target.slug}",
            queue=queue,
            before=before,
            after=None,
        )
    transaction.on_commit(lambda: _forget(policy_id))
    transaction.on_commit(lambda: reopen_identity(target.id, queue, was_admitted=was_admitted))
    return before


# --- reopen: one todo_ready when a deferred queue identity is admitted again -------------------

# The status each policy had when the reopen last looked, so a queue admitted on consecutive ticks
# rings once, not every tick. Lost state (a Redis flush) rings once more, never less.
STATUS_KEY = "switchboard:admission:last_status"
ADMITTED, DEFERRED = "admitted", "deferred"

# Swap the statuses of many policies at once and answer the previous ones ('' when unknown).
_SWAP = """
local out = {}
for i = 1, #ARGV, 2 do
  local old = redis.call('HGET', KEYS[1], ARGV[i])
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  out[#out + 1] = old or ''
end
return out
"""

# Queue identities with a budget and claimable work on an active endpoint.
_ELIGIBLE_SQL = f"""
SELECT p.id FROM admission_admissionpolicy p
JOIN queues_endpoint e ON e.id = p.endpoint_id AND e.state = 'active'
WHERE {gated.claimable_in("p.endpoint_id", "p.queue")}
"""

_IDENTITY_ELIGIBLE_SQL = f"""
SELECT EXISTS (
    SELECT 1 FROM queues_endpoint e WHERE e.id = %(e)s AND e.state = 'active'
) AND {gated.claimable_in("%(e)s", "%(q)s")}
"""


def _swap_statuses(statuses: dict[UUID, str]) -> dict[UUID, str] | None:
    """Record each policy's status; answer the previous ones, or None if Redis is unreachable."""
    if not statuses:
        return {}
    args: list[str] = []
    for policy_id, value in statuses.items():
        args += [str(policy_id), value]
    try:
        old = counters.client().eval(_SWAP, 1, STATUS_KEY, *args)
    except redis.RedisError:
        log.warning("reopen: admission status memory unavailable; ringing every admitted queue")
        return None
    return {
        policy_id: (value.decode() if isinstance(value, bytes) else str(value))
        for policy_id, value in zip(statuses, old, strict=True)
    }


def _forget(policy_id: UUID) -> None:
    try:
        counters.client().hdel(STATUS_KEY, str(policy_id))
    except redis.RedisError:
        log.warning("reopen: could not forget the status of policy %s", policy_id)


def _eligible(endpoint_id: UUID, queue: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(_IDENTITY_ELIGIBLE_SQL, {"e": endpoint_id, "q": queue})
        row = cursor.fetchone()
    return bool(row and row[0])


def reopen_identity(endpoint_id: UUID, queue: str, *, was_admitted: bool | None = None) -> bool:
    """Ring once for a queue identity that a policy write or a freed slot may have admitted.

    With ``was_admitted`` known (a policy write), ring only when the identity went from deferred
    to admitted; unknown (a claim ended), ring whenever it is admitted now. Either way only when
    it has claimable work. Records the status for the sweep. Never raises: a wake is a hint.
    """
    try:
        ev = selectors.identity_status(endpoint_id, queue)
        admitted = ev is None or ev.admits
        if ev is not None:
            _swap_statuses({ev.policy.id: ADMITTED if admitted else DEFERRED})
        if not admitted or was_admitted is True or not _eligible(endpoint_id, queue):
            return False
        return wakes.todo_ready_now(endpoint_id, queue, reason="reopened")
    except Exception:
        log.exception("reopen failed for %s:%s", endpoint_id, queue)
        return False


@dataclass(frozen=True)
class ReopenResult:
    policies: int
    rung: list[str]  # "<endpoint_id>:<queue>" of each identity rung

    def as_dict(self) -> dict[str, Any]:
        return {"policies": self.policies, "rung": self.rung}


def reopen_sweep() -> ReopenResult:
    """The reopen sweep (beat, every SWEEP_INTERVAL_SECONDS; ``manage.py admission_reopen``).

    1. Evaluate every policy now.
    2. Swap each policy's status into the memory and read the status the last look recorded.
    3. Ring once for each identity admitted now but not at the last look (its window rolled over,
       its in-flight fell below the cap, or it is new to the memory) that has claimable work on an
       active endpoint and an unpaused queue. A queue still deferred never rings.

    Safe to run twice at once: the swap is atomic, so only one run sees the old status.
    """
    policies = list(AdmissionPolicy.objects.all())
    evaluations = selectors.evaluate_policies(policies)  # 1
    statuses = {p.id: ADMITTED if evaluations[p.id].admits else DEFERRED for p in policies}
    previous = _swap_statuses(statuses)  # 2
    with connection.cursor() as cursor:
        cursor.execute(_ELIGIBLE_SQL)
        eligible = {row[0] for row in cursor.fetchall()}
    rung: list[str] = []
    for p in policies:  # 3
        if statuses[p.id] != ADMITTED or p.id not in eligible:
            continue
        if previous is not None and previous.get(p.id) == ADMITTED:
            continue
        try:
            if wakes.todo_ready_now(p.endpoint_id, p.queue, reason="reopened"):
                rung.append(wakes.payload(p.endpoint_id, p.queue))
        except Exception:
            log.exception("reopen could not ring %s:%s", p.endpoint_id, p.queue)
    _prune_memory({p.id for p in policies})
    return ReopenResult(policies=len(policies), rung=rung)


def _prune_memory(live: set[UUID]) -> None:
    try:
        client = counters.client()
        known: list[bytes] = client.hkeys(STATUS_KEY)  # type: ignore[assignment]
        stale = [k for k in known if k.decode() not in {str(i) for i in live}]
        if stale:
            client.hdel(STATUS_KEY, *stale)
    except redis.RedisError:
        pass


# --- retention -----------------------------------------------------------------------------------

RETENTION_BATCH = 5000
# Never prune a window that may still be current: a week window (plus a DST hour) is the longest.
_LONGEST_WINDOW = timedelta(days=8)


def window_retention() -> int:
    """Delete window counters older than WINDOW_RETENTION_DAYS (hourly on beat), in batches."""
    keep = max(timedelta(days=settings.WINDOW_RETENTION_DAYS), _LONGEST_WINDOW)
    cutoff = timezone.now() - keep
    total = 0
    while True:
        ids = list(
            AdmissionWindow.objects.filter(window_start__lt=cutoff).values_list("id", flat=True)[
                :RETENTION_BATCH
            ]
        )
        if not ids:
            return total
        total += AdmissionWindow.objects.filter(id__in=ids).delete()[0]


def ledger_verify_now(*, actor: HumanActor) -> None:
    """Verify the chain now and store the result (``ledger.check``), at most as often as
    ``LEDGER_VERIFY_RATE_LIMIT`` lets each person: a verify reads every ledger row, so a button
    held down, or a script, would keep the web process at nothing else. Over it: RateLimited."""
    rate, burst = settings.LEDGER_VERIFY_RATE_LIMIT
    allowed, wait = ratelimit.take(f"ledger-verify:{actor.user.pk}", rate=rate, burst=burst)
    if not allowed:
        raise RateLimited(
            f"the chain was verified a moment ago; verify again in {wait} s", retry_after=wait
        )
    ledger.check()
