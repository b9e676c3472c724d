"""Every write to a declared limit: ``limit_set`` (create or change) and ``limit_delete``, each
with its ledger row in the same transaction.

Limits are fleet-wide, so changing one needs the model's change permission (superusers hold it;
auditors never do). Every value is checked here, naming its field, before the database's own
constraints see it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Model, Q
from django.utils import timezone

from admission.limits import gates as limit_gates
from admission.limits import locks
from admission.limits import priority as queue_priority
from admission.limits.models import (
    DEFAULT_DECAY_STEP,
    DEFAULT_DECAY_WINDOW_SECONDS,
    MAX_DECAY_STEP,
    MAX_DECAY_WINDOW_SECONDS,
    MAX_LIMIT,
    LimitPosture,
    Pool,
    QueueSettings,
    RateLimit,
    TagLimit,
)
from admission.limits.verify import LimitsReport, limits_verify
from queues import access, metrics, wakes
from queues.access import Actor, HumanActor, SystemActor, check_actor
from queues.models import Todo, TodoState, check_limit_name, check_queue_name
from queues.sql import gated
from switchboard.core import ratelimit, versions
from switchboard.core.errors import (
    Conflict,
    Forbidden,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
    RateLimited,
)
from switchboard.ledger import chain as ledger
from switchboard.ledger.models import LedgerKind


@dataclass(frozen=True)
class Kind:
    """One kind of declared limit: its model, the column naming it, the todo field naming it
    and its numeric fields (name, lowest, default)."""

    name: str
    model: type[Model]
    key: str
    todo_q: str
    numbers: tuple[tuple[str, int, int | None], ...]


KINDS = {
    "pool": Kind("pool", Pool, "name", "pool", (("slots", 0, None),)),
    "tag": Kind("tag", TagLimit, "tag", "tags__contains", (("limit", 0, None),)),
    "rate": Kind(
        "rate",
        RateLimit,
        "name",
        "rate_limit",
        (
            ("base_limit", 1, None),
            ("floor", 1, 1),
            ("decay_window_seconds", 1, DEFAULT_DECAY_WINDOW_SECONDS),
            ("decay_step", 0, DEFAULT_DECAY_STEP),
        ),
    ),
}


# The gate that holds todos naming each kind of limit.
_GATES = {
    "pool": limit_gates.PoolGate(),
    "tag": limit_gates.TagGate(),
    "rate": limit_gates.RateGate(),
}
# The todos naming a limit, as SQL over a todo row ``t`` (the limit's name is ``%(n)s``).
# ``t.tags <> '{}'`` states todo_live_tags_idx's predicate, so the planner can use it.
_NAMING = {
    "pool": "t.pool = %(n)s",
    "tag": "t.tags <> '{}' AND t.tags @> ARRAY[%(n)s]::varchar[]",
    "rate": "t.rate_limit = %(n)s",
}


def _holds(kind: Kind, name: str) -> bool:
    """Whether the limit, as stored now, holds the todos naming it (read without locks)."""
    with connection.cursor() as cursor:
        return _GATES[kind.name].hold(cursor, name, timezone.now()) is not None


def _ring_reopened(kind: Kind, name: str) -> None:
    """After a change freed a limit that held work: ring ``reopened`` once per queue identity
    with pending todos naming it that a claim could take now (``wakes.reopen``: claimable, no
    per-todo gate passing them over, through the doorbell's gate; it fails open)."""
    with connection.cursor() as cursor:
        identities = gated.pending_identities(cursor, where=_NAMING[kind.name], params={"n": name})
    wakes.reopen(wakes.payload(e, q) for e, q in identities)


def _lock(kind: Kind, name: str) -> Any:
    """Lock the declaration of ``name`` for a change, in this transaction: a pool or a tag by its
    advisory lock taken exclusive (``admission.limits.locks``; every claim naming it holds that
    lock, shared or exclusive, until it commits, so this waits for every claim in flight and no
    claim decides on it until this commits), then its row read (None: not declared). A rate
    limit by its row lock, which its claims take. The pools' and tags' rows are not locked:
    every writer holds the advisory lock (a trigger takes it for a writer outside these
    services), so the row lock would serialise nothing more."""
    manager = kind.model.objects  # type: ignore[attr-defined]
    if kind.name in locks.CLASSES:
        with connection.cursor() as cursor:
            locks.lock(cursor, kind.name, [name])
        return manager.filter(**{kind.key: name}).first()
    return manager.select_for_update().filter(**{kind.key: name}).first()


def kind_of(kind: str) -> Kind:
    if kind not in KINDS:
        raise InvalidArgument(f"kind must be one of {', '.join(KINDS)}", field="kind")
    return KINDS[kind]


def as_dict(kind: Kind, row: Any) -> dict[str, Any]:
    """The one shape of a declared limit, on every surface and in the ledger."""
    out: dict[str, Any] = {"kind": kind.name, "name": getattr(row, kind.key)}
    for field, _, _ in kind.numbers:
        out[field] = getattr(row, field)
    out["posture"] = row.posture
    return out


def _check_may_change(actor: Actor | SystemActor, kind: Kind) -> None:
    _check_perm(actor, kind.model._meta.model_name or "")


def _check_perm(actor: Actor | SystemActor, model_name: str) -> None:
    check_actor(actor)
    if isinstance(actor, SystemActor):
        return  # the machine operator's shell owns the database
    has_perm = getattr(actor.user, "has_perm", None) if isinstance(actor, HumanActor) else None
    if has_perm is None or not has_perm(f"limits.change_{model_name}"):
        raise Forbidden("changing a fleet-wide limit needs the limits change permission")


_HIGHEST = {
    "decay_window_seconds": MAX_DECAY_WINDOW_SECONDS,
    "decay_step": MAX_DECAY_STEP,
}


def _values(kind: Kind, given: dict[str, Any], row: Any | None) -> dict[str, Any]:
    """The fields after the change, each checked by name (a missing one keeps its value)."""
    values: dict[str, Any] = {}
    for field, lowest, default in kind.numbers:
        value = given.get(field)
        if value is None:
            value = getattr(row, field) if row is not None else default
        if value is None:
            raise InvalidArgument(f"{field} is required", field=field)
        highest = _HIGHEST.get(field, MAX_LIMIT)
        if isinstance(value, bool) or not isinstance(value, int) or not lowest <= value <= highest:
            raise InvalidArgument(
                f"{field} must be a whole number from {lowest} to {highest}", field=field
            )
        values[field] = value
    if kind.name == "rate" and values["floor"] > values["base_limit"]:
        # Named by what the request sent: a base_limit lowered under the floor in force is the
        # base_limit's fault (round 8: it named floor, which the request had not sent).
        blamed = "base_limit" if "base_limit" in given and given.get("floor") is None else "floor"
        raise InvalidArgument(
            f"floor must not exceed base_limit ({values['floor']} > {values['base_limit']})",
            field=blamed,
        )
    posture = given.get("posture") or (row.posture if row is not None else LimitPosture.ENFORCE)
    if posture not in LimitPosture.values:
        raise InvalidArgument(
            f"posture must be one of {', '.join(LimitPosture.values)}", field="posture"
        )
    values["posture"] = posture
    return values


def _append(kind: str, actor: Actor | SystemActor, before: Any, after: Any) -> None:
    ledger.append(
        kind=kind, actor=access.ledger_actor(actor), scope="limits", before=before, after=after
    )


# Every numeric field of any kind, in one order (a limit's shape holds its kind's).
_NUMBERS = tuple(dict.fromkeys(f for k in KINDS.values() for f, _, _ in k.numbers))


def limit_version(limit: dict[str, Any]) -> str:
    """A declared limit's version (``switchboard.core.versions``): a digest of its one shape
    (``as_dict``), the API's entity tag."""
    shape = {f: limit[f] for f in ("kind", "name", "posture", *_NUMBERS) if f in limit}
    return versions.digest(shape)


def _refuse_unless_held(
    expected: Collection[str] | None,
    version: str | None,
    said: tuple[str, str, str],
    **details: Any,
) -> None:
    """Refuse a conditional write over a version it did not read (under its lock). ``said``:
    the refusal when there is none now, when there is one where none was asked for, and when
    it changed."""
    if versions.holds(expected, version):
        return
    missing, present, changed = said
    if version is None:
        message = missing
    elif expected is not None and versions.ABSENT in expected:
        message = present
    else:
        message = changed
    raise PreconditionFailed(message, version=version, **details)


def _check_expected(
    k: Kind, name: str, before: dict[str, Any] | None, expected: Collection[str] | None
) -> None:
    """Refuse a conditional write whose limit is not as its writer read it (under ``_lock``)."""
    limit = f"the {k.name} limit {name!r}"
    said = (
        f"{limit} is not declared now: nothing was written",
        f"{limit} is declared now: nothing was written",
        f"{limit} changed since it was read: nothing was written; read it again",
    )
    version = limit_version(before) if before is not None else None
    _refuse_unless_held(expected, version, said, kind=k.name, name=name)


def limit_set(
    *,
    actor: Actor | SystemActor,
    kind: str,
    name: str,
    expected: Collection[str] | None = None,
    **given: Any,
) -> dict[str, Any]:
    """Declare a limit or change it (only the fields given); one ``limits.set`` ledger row when
    something changed. ``expected``: only over one of these versions (``limit_version``;
    ``versions.ABSENT``: only where it is not declared), checked under the limit's lock; a
    change already made succeeds whatever was read (RFC 9110 13.1.1)."""
    k = kind_of(kind)
    _check_may_change(actor, k)
    check_limit_name(name, field_name="name")
    unknown = set(given) - {f for f, _, _ in k.numbers} - {"posture"}
    if unknown:
        field = sorted(unknown)[0]
        raise InvalidArgument(f"{field} is not a field of a {k.name} limit", field=field)
    with transaction.atomic():
        row = _lock(k, name)
        values = _values(k, given, row)
        before = as_dict(k, row) if row is not None else None
        if {"kind": k.name, "name": name, **values} != before:
            _check_expected(k, name, before, expected)
        held_before = row is not None and _holds(k, name)
        if row is None:
            row = k.model.objects.create(**{k.key: name}, **values)  # type: ignore[attr-defined]
        else:
            for field, value in values.items():
                setattr(row, field, value)
            row.save()
        after = as_dict(k, row)
        if after != before:
            _append(LedgerKind.LIMITS_SET, actor, before, after)
        # A raise (or a posture off enforce) that frees work the limit held: the doorbell rings
        # after commit; a lowering or a no-op change frees nothing and rings nothing. Exact
        # under races: both reads run under the limit's lock taken exclusive (``_lock``), which
        # every claim naming the limit holds to admit and every ending claim holds (shared) to
        # decide its own reopen ring.
        if held_before and not _holds(k, name):
            wakes.after_commit(lambda: _ring_reopened(k, name))
    return after


def limit_delete(
    *, actor: Actor | SystemActor, kind: str, name: str, expected: Collection[str] | None = None
) -> dict[str, Any]:
    """Remove a declaration that no live todo names (one ``limits.delete`` row). A limit live
    work still names is refused: without its row the claim would no longer hold that work.
    ``expected``: only one of these versions, as ``limit_set``."""
    k = kind_of(kind)
    _check_may_change(actor, k)
    check_limit_name(name, field_name="name")
    with transaction.atomic():
        row = _lock(k, name)
        if row is None:
            raise NotFound(f"no {k.name} limit named {name!r}", field="name")
        _check_expected(k, name, as_dict(k, row), expected)
        if kind in locks.CLASSES:
            # The row for update (a rate limit's ``_lock`` took it): an intake or retry holding
            # the declaration (``admission.limits.intake``: FOR KEY SHARE) commits its todo
            # first, and the count below, a later statement, sees it.
            k.model.objects.select_for_update().filter(pk=row.pk).first()  # type: ignore[attr-defined]
        live = Todo.objects.filter(**{k.todo_q: [name] if k.name == "tag" else name}).filter(
            Q(state__in=[TodoState.PENDING, TodoState.CLAIMED])
            | Q(state=TodoState.FAILED, next_retry_at__isnull=False)
        )
        count = live.count()
        if count:
            # A rate limit has no 0 (its base limit is at least 1): its todos are ended first.
            instead = (
                "end or discard them first"
                if kind == "rate"
                else "set it to 0 to hold them instead"
            )
            raise Conflict(
                f"{count} live todo(s) name {k.name} {name!r}; {instead}",
                field="name",
                live_todos=count,
            )
        before = as_dict(k, row)
        row.delete()
        _append(LedgerKind.LIMITS_DELETE, actor, before, None)
    return before


def limits_list() -> list[dict[str, Any]]:
    """Every declared limit, by kind then name."""
    return [
        as_dict(k, row)
        for k in KINDS.values()
        for row in k.model.objects.order_by(k.key)  # type: ignore[attr-defined]
    ]


def limit_quarantine(*, actor: Actor | SystemActor, kind: str, name: str) -> dict[str, Any]:
    """Quarantine a pool or a tag in one transaction: its limit set to 0 under enforce, every
    claim naming it expired at once, and one ``limits.quarantine`` ledger row whose payload is
    the whole manifest (the expired todos with their holders, the queued todos).

    A claim racing it either commits first (it holds the limit's lock, shared or exclusive,
    until then; this takes it exclusive) and is expired here, or reads the limit after this
    commits and is refused: none holds a unit after.
    """
    if kind not in gated.NAMING:
        raise InvalidArgument("kind must be pool or tag", field="kind")
    k = kind_of(kind)
    _check_may_change(actor, k)
    check_limit_name(name, field_name="name")
    with transaction.atomic():
        for _ in range(_QUARANTINE_TRIES):
            try:
                with transaction.atomic():
                    return _quarantine_once(actor, k, kind, name)
            except _ClaimedMeanwhile:
                continue  # the savepoint's rollback let go of every lock taken; take them again
    raise Conflict(
        f"claims kept landing on {k.name} {name!r} while it was being quarantined; try again",
        field="name",
    )


class _ClaimedMeanwhile(Exception):
    """A claim naming the limit committed between locking its claims and taking the limit's
    lock, and its todo is locked by another transaction (its ending, waiting on that lock)."""


_QUARANTINE_TRIES = 20


def _quarantine_once(actor: Actor | SystemActor, k: Kind, kind: str, name: str) -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute(gated.quarantine_lock_sql(kind), {"n": name})
        locked = {todo_id for (todo_id,) in cursor.fetchall()}
        row = _lock(k, name)
        if row is None:
            raise NotFound(f"no {k.name} limit named {name!r}", field="name")
        # Claims that landed between the two locks (every claim in flight when the lock was
        # asked for commits before it is granted; none lands after): each is locked now without
        # waiting. One whose todo another transaction holds (its ending, which waits for the
        # limit's lock this holds) would deadlock a wait: start again, letting go of everything.
        cursor.execute(gated.quarantine_lock_sql(kind, lock=False), {"n": name})
        landed = sorted({todo_id for (todo_id,) in cursor.fetchall()} - locked)
        if landed:
            cursor.execute(gated.QUARANTINE_LOCK_LANDED_SQL, {"ids": landed})
            if len(cursor.fetchall()) < len(landed):
                raise _ClaimedMeanwhile
        before = as_dict(k, row)
        cursor.execute(gated.quarantine_queued_sql(kind), {"n": name})
        queued = [todo_id for (todo_id,) in cursor.fetchall()]
        cursor.execute(gated.quarantine_expire_sql(kind), {"n": name})
        expired = [
            {
                "todo": todo_id,
                "holder": owner,
                "endpoint": endpoint_id,
                "queue": queue,
                "attempt": attempt,
                "state": state,
                # The grant the expiry ends (None: the claim passed no named limit).
                "grant": grant,
            }
            for todo_id, owner, endpoint_id, queue, attempt, state, grant in cursor.fetchall()
        ]
        setattr(row, k.numbers[0][0], 0)
        row.posture = LimitPosture.ENFORCE
        row.save()
        manifest = {"expired": expired, "queued": queued}
        entry = ledger.append(
            kind=LedgerKind.LIMITS_QUARANTINE,
            actor=access.ledger_actor(actor),
            scope="limits",
            before=before,
            after={"limit": as_dict(k, row), "manifest": manifest},
        )
        for queue, count in Counter(e["queue"] for e in expired).items():
            metrics.leases_expired(queue, count)
    return {"limit": as_dict(k, row), "manifest": manifest, "entry_hash": entry.entry_hash}


def _queue_dict(row: QueueSettings) -> dict[str, Any]:
    return {"queue": row.queue, "priority": row.priority, "aging_seconds": row.aging_seconds}


def queue_settings_out(settings: dict[str, Any]) -> dict[str, Any]:
    """A queue's settings as the API and the CLI show them: with their ``version``
    (``switchboard.core.versions``, a digest of the three; not in the ledger's rows)."""
    return {**settings, "version": versions.digest(settings)}


def queue_settings_set(
    *,
    actor: Actor | SystemActor,
    queue: str,
    priority: int | None = None,
    aging_seconds: int | None = None,
    clear_aging: bool = False,
    expected: Collection[str] | None = None,
) -> dict[str, Any]:
    """Create or change a queue name's priority (higher first in claim_next) and aging (a
    waiting queue gains one priority step per ``aging_seconds`` of its oldest todo's wait);
    one ``limits.queue`` ledger row when something changed. ``expected``: only over one of
    these versions (``queue_settings_out``; ``versions.ABSENT``: only where it has none yet),
    checked under the row's lock; a change already made succeeds (RFC 9110 13.1.1)."""
    _check_perm(actor, "queuesettings")
    check_queue_name(queue)
    if priority is not None and (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not -MAX_LIMIT <= priority <= MAX_LIMIT
    ):
        raise InvalidArgument(
            f"priority must be a whole number from {-MAX_LIMIT} to {MAX_LIMIT}", field="priority"
        )
    if aging_seconds is not None and (
        isinstance(aging_seconds, bool)
        or not isinstance(aging_seconds, int)
        or not 1 <= aging_seconds <= MAX_DECAY_WINDOW_SECONDS
    ):
        raise InvalidArgument(
            f"aging_seconds must be a whole number from 1 to {MAX_DECAY_WINDOW_SECONDS}",
            field="aging_seconds",
        )
    if aging_seconds is not None and clear_aging:
        raise InvalidArgument(
            "aging_seconds and clear_aging: set the aging or clear it, not both",
            field="clear_aging",
            fields=["aging_seconds", "clear_aging"],
        )
    with transaction.atomic():
        # The row made first if missing, so that first writers at once queue on its row lock
        # (the later ones then read the first's row: "only where it has none yet" lets one
        # through, and none fails on the unique name); a refused write rolls it back.
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {QueueSettings._meta.db_table} (queue, priority, created_at, "
                "updated_at) VALUES (%s, 0, now(), now()) ON CONFLICT (queue) DO NOTHING "
                "RETURNING id",
                [queue],
            )
            made = cursor.fetchone() is not None
        row = QueueSettings.objects.select_for_update().get(queue=queue)
        before = None if made else _queue_dict(row)
        if priority is not None:
            row.priority = priority
        if aging_seconds is not None:
            row.aging_seconds = aging_seconds
        elif clear_aging:
            row.aging_seconds = None
        if _queue_dict(row) != before:
            _check_queue_expected(queue, before, expected)
        row.save()
        after = _queue_dict(row)
        queue_priority.learn(queue)  # this process orders by it from its next claim
        if after != before:
            ledger.append(
                kind=LedgerKind.LIMITS_QUEUE,
                actor=access.ledger_actor(actor),
                scope="queue",
                queue=queue,
                before=before,
                after=after,
            )
    return queue_settings_out(after)


def _check_queue_expected(
    queue: str, before: dict[str, Any] | None, expected: Collection[str] | None
) -> None:
    """Refuse a conditional write whose queue settings are not as read (under the row's lock)."""
    said = (
        f"queue {queue!r} has no priority settings now: nothing was written",
        f"queue {queue!r} has priority settings now: nothing was written",
        f"the priority settings of queue {queue!r} changed since they were read: nothing was "
        "written; read them again",
    )
    version = queue_settings_out(before)["version"] if before is not None else None
    _refuse_unless_held(expected, version, said, queue=queue)


def limits_verify_now(*, actor: HumanActor) -> LimitsReport:
    """``limits verify`` for a person (the operator API): it reads every ledger row, so each
    person may ask as often as ``LEDGER_VERIFY_RATE_LIMIT`` lets them, as the console's "Verify
    now" (an allowance of its own). Over it: ``rate_limited`` saying when to ask again. The
    report is the fleet's (every chain's rows and head, every grant): only for who reads every
    ledger row, as the console's badge counts rows only for them (round 8: an owner without
    staff read the fleet's figures here)."""
    check_actor(actor)
    if not actor.sees_all:
        raise Forbidden(
            "the limits verify report is the whole fleet's ledger: auditors and superusers "
            "read it (the ledger page's badge says whether the chain holds)"
        )
    rate, burst = settings.LEDGER_VERIFY_RATE_LIMIT
    allowed, wait = ratelimit.take(f"limits-verify:{actor.user.pk}", rate=rate, burst=burst)
    if not allowed:
        raise RateLimited(
            f"the limits were verified a moment ago; verify again in {wait} s", retry_after=wait
        )
    return limits_verify()


def queue_settings_list() -> list[dict[str, Any]]:
    return [queue_settings_out(_queue_dict(row)) for row in QueueSettings.objects.order_by("queue")]
