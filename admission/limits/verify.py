"""``limits verify``: the ledger chain from genesis (failing closed at the exact row), then every
grant replayed, in ledger order, against the limits in force at its row and the grants open
before it: the ledger alone is the record.

The limit in force at a row is the last ``limits.set`` / ``limits.quarantine`` /
``limits.delete`` row before it (a limit with no such row, declared outside the services, counts
as declared as it is now). A grant (``limits.grant``) is open from its row until a
``limits.end`` row names it, a quarantine's manifest names it among the claims it expired, or a
later grant of the same todo supersedes it (a takeover). A grant of a pool or a tag that, under
``enforce``, found as many grants of that limit open as the limit allowed is drift at its row
(the gate would have refused it); under ``advise`` it is drift unless a waiver names the grant.
A rate limit's grant is checked against what its row recorded (claims this minute below the
effective limit under ``enforce``): its effective limit depends on 429 observations, which are
not ledger rows.

Row order (``seq``, across the ledger's chains: ``switchboard.ledger.chain``) is the order of
the facts: a claim writes its grant holding its limits' locks
(``admission.limits.locks``) and an ending statement writes its end row holding them shared, each
before the chain's lock, and a limit change writes its row holding them exclusive, so a grant's
row follows every limit change its gate saw and precedes those it did not. Grants decided under
a shared lock (far from the cap) may be appended in another order than they counted; the
argument of ``admission.limits.gates`` holds in ledger order all the same (the grant whose count
came last among those open at a row saw all the others committed, or in flight, at most B - 1 of
them), so none of them finds its limit's grants all open in the replay.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from admission.limits.models import Pool, TagLimit
from switchboard.core.times import iso
from switchboard.ledger import chain
from switchboard.ledger.models import LedgerEntry, LedgerKind

_NUMBER = {"pool": "slots", "tag": "limit"}


@dataclass(frozen=True)
class GrantDrift:
    seq: int
    grant: str
    todo: str
    attempt: int
    at: datetime
    kind: str
    name: str
    limit: int
    held: int  # grants of the limit open at the row, replayed
    recorded: int  # the occupancy the grant's row says its gate counted
    posture: str
    problem: str  # over_enforced_limit | unwaived_excess

    def as_dict(self) -> dict[str, Any]:
        return {
            "problem": self.problem,
            "seq": self.seq,
            "grant": self.grant,
            "todo": self.todo,
            "attempt": self.attempt,
            "at": iso(self.at),
            "kind": self.kind,
            "name": self.name,
            "limit": self.limit,
            "held": self.held,
            "recorded": self.recorded,
            "posture": self.posture,
        }


@dataclass
class LimitsReport:
    ledger: chain.VerifyReport
    grants: int
    drift: list[GrantDrift]
    # The grants open at the end of the replay: grant (entry_hash) -> todo id.
    open: dict[str, str] = field(default_factory=dict)

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


_REPLAYED = [
    LedgerKind.LIMITS_SET,
    LedgerKind.LIMITS_DELETE,
    LedgerKind.LIMITS_QUARANTINE,
    LedgerKind.LIMITS_GRANT,
    LedgerKind.LIMITS_END,
]


@dataclass
class GrantReplay:
    """The grants replayed from the ledger: how many, the drift, and what is open at the end
    (per grant: its todo and the pool/tag limits it holds)."""

    grants: int = 0
    drift: list[GrantDrift] = field(default_factory=list)
    open: dict[str, tuple[str, list[tuple[str, str]]]] = field(default_factory=dict)

    def held(self, kind: str, name: str) -> int:
        """Grants of the limit open at the end of the replay."""
        return sum((kind, name) in limits for _, limits in self.open.values())


class _Replay:
    def __init__(self, now: dict[tuple[str, str], dict[str, Any]], waived: set[tuple[str, str]]):
        self.limits: dict[tuple[str, str], dict[str, Any] | None] = dict(now)
        self.waived = waived
        self.out = GrantReplay()
        self.by_todo: dict[str, str] = {}
        self.counts: dict[tuple[str, str], int] = {}

    def see(self, row: LedgerEntry) -> None:
        after = row.after or {}
        if row.kind == LedgerKind.LIMITS_GRANT:
            self._grant(row, after)
        elif row.kind == LedgerKind.LIMITS_END:
            ended = [after] if "grant" in after else after.get("grants", [])
            for item in ended:
                self._end(item.get("grant"))
        elif row.kind == LedgerKind.LIMITS_QUARANTINE:
            for item in (after.get("manifest") or {}).get("expired", []):
                self._end(item.get("grant") or self.by_todo.get(item.get("todo", "")))
            self._declare(after.get("limit"), row.before)
        else:
            self._declare(row.after, row.before)

    def _declare(self, after: dict[str, Any] | None, before: dict[str, Any] | None) -> None:
        named = after or before
        if named and named.get("kind") in _NUMBER:
            self.limits[(named["kind"], named["name"])] = after

    def _end(self, grant: str | None) -> None:
        found = self.out.open.pop(grant, None) if grant else None
        if found is None:
            return
        todo, held = found
        self.by_todo.pop(todo, None)
        for key in held:
            self.counts[key] -= 1

    def _grant(self, row: LedgerEntry, after: dict[str, Any]) -> None:
        self.out.grants += 1
        todo = str(after.get("todo", ""))
        # A takeover: the lapsed claim's grant ends with this one.
        self._end(after.get("supersedes") or self.by_todo.get(todo))
        held: list[tuple[str, str]] = []
        for item in after.get("limits", []):
            kind, name = item.get("kind"), item.get("name")
            if kind == "rate":
                # Its effective limit is not in the ledger: what the row recorded is checked.
                if item.get("posture") == "enforce" and item.get("held", 0) >= item.get("limit"):
                    self._drift(
                        row, after, kind, name, item["limit"], item["held"], item, "enforce"
                    )
                continue
            if kind not in _NUMBER:
                continue
            key = (kind, name)
            held.append(key)
            limit = self.limits.get(key)
            open_now = self.counts.get(key, 0)
            if limit is None or limit["posture"] == "off" or open_now < limit[_NUMBER[kind]]:
                continue
            posture = limit["posture"]
            if posture == "advise" and (row.entry_hash, name) in self.waived:
                continue
            self._drift(row, after, kind, name, limit[_NUMBER[kind]], open_now, item, posture)
        for key in held:
            self.counts[key] = self.counts.get(key, 0) + 1
        self.out.open[row.entry_hash] = (todo, held)
        self.by_todo[todo] = row.entry_hash

    def _drift(
        self,
        row: LedgerEntry,
        after: dict[str, Any],
        kind: str,
        name: str,
        limit: int,
        held: int,
        item: dict[str, Any],
        posture: str,
    ) -> None:
        self.out.drift.append(
            GrantDrift(
                seq=row.seq,
                grant=row.entry_hash,
                todo=str(after.get("todo", "")),
                attempt=int(after.get("attempt", 0)),
                at=row.at,
                kind=kind,
                name=name,
                limit=limit,
                held=held,
                recorded=int(item.get("held", 0)),
                posture=posture,
                problem="unwaived_excess" if posture == "advise" else "over_enforced_limit",
            )
        )


def _declared_now() -> dict[tuple[str, str], dict[str, Any]]:
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for p in Pool.objects.all():
        found[("pool", p.name)] = {"slots": p.slots, "posture": p.posture}
    for t in TagLimit.objects.all():
        found[("tag", t.tag)] = {"limit": t.limit, "posture": t.posture}
    return found


def replay_grants() -> GrantReplay:
    """Every grant replayed from the ledger (see the module's doc), in the caller's snapshot.
    The hypothesis state machine calls it too: the drift must be empty, and ``held`` per limit
    must equal the claims naming it now when every claim passed it as a grant."""
    waived: set[tuple[str, str]] = set()
    for stored in LedgerEntry.objects.filter(kind=LedgerKind.LIMITS_WAIVER).values_list(
        "after", flat=True
    ):
        after: dict[str, Any] = stored or {}
        for over in after.get("exceeded", []) if after.get("grant") else []:
            waived.add((after["grant"], over.get("name")))
    replay = _Replay(_declared_now(), waived)
    # A limit with no row before a grant counts as declared as it is now; one with rows, as its
    # last row before the grant says (or as its first row's ``before`` until then).
    first_before: dict[tuple[str, str], dict[str, Any] | None] = {}
    rows = LedgerEntry.objects.filter(kind__in=_REPLAYED).order_by("seq")
    for row in rows.filter(kind__in=_REPLAYED[:3]).iterator():
        declared = (
            (row.after or {}).get("limit")
            if row.kind == LedgerKind.LIMITS_QUARANTINE
            else row.after
        )
        named = declared or row.before
        if named and named.get("kind") in _NUMBER:
            first_before.setdefault((named["kind"], named["name"]), row.before)
    replay.limits.update(first_before)
    for row in rows.iterator(chunk_size=chain.VERIFY_BATCH):
        replay.see(row)
    return replay.out


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
    replay = replay_grants()
    return LimitsReport(
        ledger=report,
        grants=replay.grants,
        drift=replay.drift,
        open={grant: todo for grant, (todo, _) in replay.open.items()},
    )
