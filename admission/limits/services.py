"""Every write to a declared limit: ``limit_set`` (create or change) and ``limit_delete``, each
with its ledger row in the same transaction.

Limits are fleet-wide, so changing one needs the model's change permission (superusers hold it;
auditors never do). Every value is checked here, naming its field, before the database's own
constraints see it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.db.models import Model, Q
from django.utils import timezone

from admission.limits import gates as limit_gates
from admission.limits.models import (
    DEFAULT_DECAY_STEP,
    DEFAULT_DECAY_WINDOW_SECONDS,
    MAX_DECAY_STEP,
    MAX_DECAY_WINDOW_SECONDS,
    MAX_LIMIT,
    LimitPosture,
    Pool,
    RateLimit,
    TagLimit,
)
from queues import access, gates, wakes
from queues.access import Actor, HumanActor, SystemActor, check_actor
from queues.claimable import CLAIMABLE
from queues.models import Todo, TodoState, check_limit_name
from switchboard.core.errors import Conflict, Forbidden, InvalidArgument, NotFound
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
_NAMING = {
    "pool": "t.pool = %(n)s",
    "tag": "t.tags @> ARRAY[%(n)s]::varchar[]",
    "rate": "t.rate_limit = %(n)s",
}


def _holds(kind: Kind, name: str) -> bool:
    """Whether the limit, as stored now, holds the todos naming it (read without locks)."""
    with connection.cursor() as cursor:
        return _GATES[kind.name].hold(cursor, name, timezone.now()) is not None


def _ring_reopened(kind: Kind, name: str) -> None:
    """After a change freed a limit that held work: ring ``reopened`` once per queue identity
    with claimable todos naming it that no per-todo gate still passes over, through the doorbell's
    gate (pause, admission; it fails open)."""
    skips = " OR ".join(gates.skips("t")) or "false"
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT DISTINCT t.endpoint_id, t.queue FROM queues_todo t
            WHERE t.state = 'pending' AND {_NAMING[kind.name]} AND {CLAIMABLE} AND NOT ({skips})
            ORDER BY 1, 2
            """,
            {"n": name},
        )
        identities = cursor.fetchall()
    for endpoint_id, queue in identities:
        wakes.todo_ready_now(endpoint_id, queue, reason="reopened")


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


def _check_may_change(actor: Actor, kind: Kind) -> None:
    check_actor(actor)
    if isinstance(actor, SystemActor):
        return  # the machine operator's shell owns the database
    has_perm = getattr(actor.user, "has_perm", None) if isinstance(actor, HumanActor) else None
    if has_perm is None or not has_perm(f"limits.change_{kind.model._meta.model_name}"):
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
        raise InvalidArgument("floor must not exceed base_limit", field="floor")
    posture = given.get("posture") or (row.posture if row is not None else LimitPosture.ENFORCE)
    if posture not in LimitPosture.values:
        raise InvalidArgument(
            f"posture must be one of {', '.join(LimitPosture.values)}", field="posture"
        )
    values["posture"] = posture
    return values


def _append(kind: str, actor: Actor, before: Any, after: Any) -> None:
    ledger.append(
        kind=kind, actor=access.ledger_actor(actor), scope="limits", before=before, after=after
    )


def limit_set(*, actor: Actor, kind: str, name: str, **given: Any) -> dict[str, Any]:
    """Declare a limit or change it (only the fields given); one ``limits.set`` ledger row when
    something changed."""
    k = kind_of(kind)
    _check_may_change(actor, k)
    check_limit_name(name, field_name="name")
    unknown = set(given) - {f for f, _, _ in k.numbers} - {"posture"}
    if unknown:
        field = sorted(unknown)[0]
        raise InvalidArgument(f"{field} is not a field of a {k.name} limit", field=field)
    with transaction.atomic():
        row = k.model.objects.select_for_update().filter(**{k.key: name}).first()  # type: ignore[attr-defined]
        values = _values(k, given, row)
        before = as_dict(k, row) if row is not None else None
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
        # after commit; a lowering or a no-op change frees nothing and rings nothing.
        if held_before and not _holds(k, name):
            transaction.on_commit(lambda: _ring_reopened(k, name))
    return after


def limit_delete(*, actor: Actor, kind: str, name: str) -> dict[str, Any]:
    """Remove a declaration that no live todo names (one ``limits.delete`` row). A limit live
    work still names is refused: without its row the claim would no longer hold that work."""
    k = kind_of(kind)
    _check_may_change(actor, k)
    check_limit_name(name, field_name="name")
    with transaction.atomic():
        row = k.model.objects.select_for_update().filter(**{k.key: name}).first()  # type: ignore[attr-defined]
        if row is None:
            raise NotFound(f"no {k.name} limit named {name!r}", field="name")
        live = Todo.objects.filter(**{k.todo_q: [name] if k.name == "tag" else name}).filter(
            Q(state__in=[TodoState.PENDING, TodoState.CLAIMED])
            | Q(state=TodoState.FAILED, next_retry_at__isnull=False)
        )
        count = live.count()
        if count:
            raise Conflict(
                f"{count} live todo(s) name {k.name} {name!r}; set it to 0 to hold them instead",
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
