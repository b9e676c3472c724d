"""``limits verify``: the ledger chain from genesis (failing closed at the exact row), then every
grant of a pool or a tag replayed against the limit in force when it was claimed.

A grant is an attempt of a todo naming the limit. The limit in force at an instant is the last
``limits.set`` / ``limits.quarantine`` / ``limits.delete`` row written before it (a limit with
no such row, declared outside the services, counts as declared as it is now). A grant claimed
while as many others were open as the limit allowed is drift under ``enforce`` (the gate would
have refused it) and, under ``advise``, drift unless a waiver row names it.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from admission.limits.models import Pool, TagLimit
from queues.sql import gated
from switchboard.ledger import chain
from switchboard.ledger.models import LedgerEntry, LedgerKind

_NUMBER = {"pool": "slots", "tag": "limit"}


@dataclass(frozen=True)
class GrantDrift:
    todo: str
    attempt: int
    claimed_at: datetime
    kind: str
    name: str
    limit: int
    held: int
    posture: str
    problem: str  # over_enforced_limit | unwaived_excess

    def as_dict(self) -> dict[str, Any]:
        return {
            "problem": self.problem,
            "todo": self.todo,
            "attempt": self.attempt,
            "claimed_at": self.claimed_at.isoformat(),
            "kind": self.kind,
            "name": self.name,
            "limit": self.limit,
            "held": self.held,
            "posture": self.posture,
        }


@dataclass
class LimitsReport:
    ledger: chain.VerifyReport
    grants: int
    drift: list[GrantDrift]

    @property
    def ok(self) -> bool:
        return self.ledger.ok and not self.drift

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "ledger": self.ledger.as_dict(),
            "grants": self.grants,
            "grant_drift": [d.as_dict() for d in self.drift],
        }


class _History:
    """Each limit's declarations over time, from the ledger rows."""

    def __init__(self) -> None:
        self.times: dict[tuple[str, str], list[datetime]] = {}
        self.states: dict[tuple[str, str], list[dict[str, Any] | None]] = {}
        self.first_before: dict[tuple[str, str], dict[str, Any] | None] = {}

    def see(self, row: LedgerEntry) -> None:
        if row.kind == LedgerKind.LIMITS_QUARANTINE:
            after = (row.after or {}).get("limit")
        else:
            after = row.after
        named = after or row.before
        if not named or named.get("kind") not in _NUMBER:
            return
        key = (named["kind"], named["name"])
        if key not in self.times:
            self.first_before[key] = row.before
        self.times.setdefault(key, []).append(row.at)
        self.states.setdefault(key, []).append(after)

    def at(self, key: tuple[str, str], when: datetime, now: dict[str, Any] | None) -> Any:
        if key not in self.times:
            return now
        i = bisect_right(self.times[key], when)
        return self.states[key][i - 1] if i else self.first_before[key]


def _declared_now() -> dict[tuple[str, str], dict[str, Any]]:
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for p in Pool.objects.all():
        found[("pool", p.name)] = {"slots": p.slots, "posture": p.posture}
    for t in TagLimit.objects.all():
        found[("tag", t.tag)] = {"limit": t.limit, "posture": t.posture}
    return found


def limits_verify() -> LimitsReport:
    """The whole check, in one REPEATABLE READ snapshot when called outside a transaction."""
    if connection.in_atomic_block:
        return _verify()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        return _verify()


def _verify() -> LimitsReport:
    report = chain.verify()
    history = _History()
    waived: set[tuple[str, int, str]] = set()
    kinds = [LedgerKind.LIMITS_SET, LedgerKind.LIMITS_DELETE, LedgerKind.LIMITS_QUARANTINE]
    for row in LedgerEntry.objects.filter(kind__in=kinds).order_by("seq").iterator():
        history.see(row)
    for row in LedgerEntry.objects.filter(kind=LedgerKind.LIMITS_WAIVER).iterator():
        after = row.after or {}
        for over in after.get("exceeded", []):
            waived.add((after.get("todo", ""), after.get("attempt", 0), over.get("name")))
    now = _declared_now()
    drift: list[GrantDrift] = []
    grants = 0
    with connection.cursor() as cursor:
        cursor.execute(gated.GRANTS_REPLAY_SQL)
        for todo, attempt, claimed_at, kind, name, held in cursor.fetchall():
            grants += 1
            limit = history.at((kind, name), claimed_at, now.get((kind, name)))
            if limit is None or limit["posture"] == "off" or held < limit[_NUMBER[kind]]:
                continue
            problem = "over_enforced_limit"
            if limit["posture"] == "advise":
                if (todo, attempt, name) in waived:
                    continue
                problem = "unwaived_excess"
            drift.append(
                GrantDrift(
                    todo,
                    attempt,
                    claimed_at,
                    kind,
                    name,
                    limit[_NUMBER[kind]],
                    held,
                    limit["posture"],
                    problem,
                )
            )
    return LimitsReport(ledger=report, grants=grants, drift=drift)
