"""The pool, tag and rate claim gates: occupancy (claimed todos naming the limit) below the
limit, and claims this minute below a rate limit's effective limit.

Registered from ``LimitsConfig.ready()`` through ``queues.gates``, after admission's budget gate,
so every claim takes its locks in one fixed order: policy (10), pool (20), tags sorted (30),
rate (40), then the ledger's.

Postures: ``enforce`` refuses (``pool_full`` / ``tag_full`` / ``rate_limited`` with
``next_eligible_at``; ``limit_quarantined`` for a limit of 0, which only an operator frees;
``limit_undeclared`` for a rate limit no longer declared),
``advise`` admits and appends a waiver to the ledger naming exactly the limits exceeded (ledger
rows are HMAC-hashed in a signed chain), ``off`` is inert. A limit of 0 is quarantine.

The locks. A pool or a tag is guarded by a transaction-scoped advisory lock of its own
(``admission.limits.locks``: keyed by kind and name, taken in key order), not by its row: a claim
takes it **shared** while the limit is far from its cap (*headroom*) and **exclusive** near it;
an ending claim takes it shared (its reopen ring, below); every change of the declaration
(``limit_set``, delete, quarantine, and any other writer through a trigger) takes it exclusive.
Each holder keeps it to its commit, and reads the limit and counts occupancy after taking it,
in a statement after it (a fresh snapshot under READ COMMITTED; limits migration 0007 reads both
in one). A rate limit keeps its
row lock: it spends a counter per minute, which is serial anyway.

Why the count never passes the limit. Let ``held`` be the occupancy a claim counts (claimed todos
naming the limit, committed, leaving out a takeover's own todo) and ``B`` the most claims naming
one limit that can be in flight at once: taken their lock and counted, not yet committed.

- ``B``: every in-flight claim is a transaction on a backend or a prepared transaction, and a
  transaction makes at most one headroom claim (the fast checks mark the todo they admitted under
  a shared lock in ``switchboard.headroom_todo``, a transaction-local setting; any other todo the
  same transaction claims is decided exclusive). So ``B = max_connections +
  max_prepared_transactions + max_worker_processes + max_wal_senders`` (``limits_headroom_bound()``;
  the last two are backends that can run SQL outside ``max_connections``: background workers such
  as a scheduler's, walsenders). Every claim path counts: claim_next (one row per statement),
  claim of one todo, takeovers (a claim of a lapsed claimed todo: its count leaves its own todo
  out, so it is counted once), and any of them inside a caller's longer transaction (the mark).
  No other statement sets a todo claimed (the doorbell's push sweeps only remind; the reaper,
  revoke, requeue and quarantine only lower occupancy).
- Headroom: a claim admitted under the shared lock had ``held + B < limit``; one admitted under
  the exclusive lock had ``held < limit``, and while it held that lock no other claim was in
  flight (every in-flight claim holds the lock shared or exclusive, from before its count to its
  commit).
- At any moment, take the claims holding the limit and among them the one, Z, whose count was
  taken last. Each of the others either committed before Z counted (so Z counted it: it was
  still held, being held now) or was in flight when Z counted (its count came earlier and its
  commit later). If Z held the lock exclusive, none was in flight: occupancy <= held_Z + 1 <=
  limit. If shared, at most B - 1 others were: occupancy <= held_Z + B < limit. The same holds
  in ledger order for ``limits verify``'s replay (a grant's row is appended under its lock).
- A change of the limit takes the lock exclusive, so it waits for every in-flight claim to
  commit, and no claim counts under the old value after the change commits: a headroom claim
  never sees a limit that is being changed. A lowered limit then holds every new claim to the
  exact path until occupancy is B below it.
- Under ``advise`` the same bound means a headroom claim never exceeds the limit, so it owes no
  waiver; an exceeded advise limit is always decided exclusive.

Which lock a claim takes is decided by reading the limit and counting without locks: far from
the cap it takes the shared lock, then reads and counts again under it; if the limit turned out
within B of the cap (claims landed meanwhile, or it changed) it answers ``stale`` and the locked
path decides exclusive. Near the cap, or for a second claim in one transaction, it takes the
exclusive lock at once and decides as before. The locked path (``admit``) always takes the
exclusive lock.

The fast path: a pool or tags decide inside the claim_next statement (``limits_pool_check``,
``limits_tags_check``, migrations 0002/0004/0005) under those locks and counts, so an admitted
claim holds them only for that one autocommitted statement; any limit at its cap (or advise
over it) sends the candidate to the locked path below. A rate limit always takes the locked path.

These limits hold per todo, not per queue identity: instead of a queue-wide pre-read each gate
gives a skip (the limits it would refuse now, read without locks, as one array per statement)
that claim_next's statement passes over, and a refusal under the lock passes over that todo
only. ``holding`` says, for an empty claim_next, which queues' todos each gate holds and until
when.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import connection
from django.db.backends.utils import CursorWrapper
from django.db.models import Q
from django.utils import timezone

from admission.limits import locks, rates
from admission.limits.models import LimitPosture
from queues import gates, metrics
from queues.access import append_claim_waiver
from queues.declared import UNDECLARED
from queues.models import Todo, TodoState
from queues.sql import gated
from switchboard.core.errors import Deferred
from switchboard.core.times import iso
from switchboard.ledger.models import LedgerKind


@dataclass(frozen=True)
class Held:
    """One limit read under its lock: its occupancy excluding the candidate. ``frees_at``: the
    lease expiry at which enough of the claims counted have lapsed for occupancy to drop below
    the limit (the (held - limit + 1)-th earliest; the earliest while held is at most the
    limit: a limit lowered below what is held needs more than one holder gone)."""

    name: str
    limit: int
    posture: str
    held: int
    frees_at: datetime | None

    @property
    def exceeded(self) -> bool:
        return self.posture != LimitPosture.OFF and self.held >= self.limit

    @property
    def quarantined(self) -> bool:
        """A limit of 0 under enforce: it admits nothing until an operator raises it."""
        return self.limit == 0 and self.posture == LimitPosture.ENFORCE


@dataclass(frozen=True)
class LimitRefusal:
    queue: str
    reason: str
    next_eligible_at: datetime | None
    limits: tuple[str, ...]
    exact: bool = False
    pending: int = 1  # the todos of the queue this holds


# The reason of a hold by a quarantined limit (0 under enforce): no lease lapsing frees it.
QUARANTINED = "limit_quarantined"


# The limits full now under enforce, each a function (limits migration 0008) called in a
# sub-select: an InitPlan the planner runs once per statement, and only when a row naming such a
# limit is met, priced at the function's COST whatever the limits tables hold (their inline
# queries' estimates moved with the todo table's statistics and flipped the claim statement to a
# custom plan per claim; the migration says how). A takeover's own occupancy would count against
# it here, so the skips leave claimed (lapsed) rows to ``admit``.
# (Cast: ``= ANY((SELECT ...))`` alone would be the row-wise ANY of a sub-select.)
_FULL_POOLS = "(SELECT limits_full_pools())::varchar[]"
_FULL_TAGS = "(SELECT limits_full_tags())::varchar[]"
_FULL_RATES = "(SELECT limits_full_rates())::varchar[]"


def _earliest(times: list[datetime | None]) -> datetime | None:
    """When the first of several held todos may be eligible (None: only by an operator)."""
    known = [t for t in times if t is not None]
    return min(known) if known else None


def grant_item(kind: str, held: Held) -> dict[str, Any]:
    """One limit a grant passed, as its ledger row names it (the fast checks of limits migration
    0004 write the same object)."""
    return {
        "held": held.held,
        "kind": kind,
        "limit": held.limit,
        "name": held.name,
        "posture": held.posture,
    }


@dataclass
class _Waived(gates.Admission):
    """Admitted (over an advise limit: the waiver is appended with the claim, naming the
    claim's grant). ``passed``: every limit read that is not ``off``, for the grant."""

    gate: str
    over: list[Held] = field(default_factory=list)
    passed: list[Held] = field(default_factory=list)
    kind: str = ""

    def charge(self, cursor: CursorWrapper, *, todo: Any, actor: Any) -> dict[str, Any] | None:
        if self.over:
            append_waiver(self.gate, self.over, actor, todo)
        return None

    def granted(self) -> list[dict[str, Any]]:
        return [grant_item(self.kind, h) for h in self.passed]


@dataclass
class _RateCharge(_Waived):
    """A rate limit spends one claim of the current minute, whatever the posture."""

    rate_id: int = 0
    now: datetime | None = None

    def charge(self, cursor: CursorWrapper, *, todo: Any, actor: Any) -> dict[str, Any] | None:
        assert self.now is not None
        rates.charge(cursor, self.rate_id, self.now)
        return super().charge(cursor, todo=todo, actor=actor)


def _refusal(
    cursor: Any, todo_id: UUID, reason: str, at: datetime | None, names: list[str], exact: bool
) -> LimitRefusal:
    return LimitRefusal(
        queue=gated.todo_queue(cursor, todo_id),
        reason=reason,
        next_eligible_at=at,
        limits=tuple(names),
        exact=exact,
    )


def _next_eligible(over: list[Held], now: datetime) -> datetime | None:
    """A unit frees at the latest when enough leases have lapsed for occupancy to drop below
    the limit (``Held.frees_at``) and the reaper has run; a quarantined (0) limit never frees
    one by itself."""
    leases = [h.frees_at for h in over if h.limit > 0 and h.frees_at is not None]
    if len(leases) < len(over):
        return None
    return max(now, *leases) + timedelta(seconds=settings.SWEEP_INTERVAL_SECONDS)


def _reason(gate_reason: str, over: list[Held]) -> str:
    """A hold's reason: ``limit_quarantined`` when a quarantined limit holds the work (only an
    operator frees it), else the gate's own (``pool_full``, ``tag_full``)."""
    return QUARANTINED if any(h.quarantined for h in over) else gate_reason


@dataclass(frozen=True)
class _Hold:
    """What holds the todos naming one key now: why, until when (None: until an operator acts),
    the limits over, and whether that instant is certain (``exact``) or an estimate."""

    reason: str
    at: datetime | None
    limits: list[str]
    exact: bool = False


def _state_of(held: list[Held]) -> str:
    over = [h for h in held if h.exceeded]
    if any(h.posture == LimitPosture.ENFORCE for h in over):
        return "holds"
    return "waives" if over else "admits"


def _explained(
    gate: str, reason: str, noun: str, held: list[Held], now: datetime
) -> gates.GateState:
    """A pool's or tags' word on a pending todo: every limit it names with its occupancy."""
    state = _state_of(held)
    over = [h for h in held if h.exceeded and (state == "waives" or h.posture == "enforce")]
    detail = "; ".join(
        f"{noun} {h.name}: {h.held} of {h.limit} held ({h.posture})"
        + (" (quarantined)" if h.quarantined else "")
        for h in held
    )
    return gates.GateState(
        gate=gate,
        state=state,
        reason=_reason(reason, over) if state != "admits" else None,
        next_eligible_at=_next_eligible(over, now) if state == "holds" else None,
        detail=detail,
        limits=tuple(h.name for h in over),
    )


class _OccupancyGate:
    name: str
    lock_order: int
    per_todo = True
    reason: str
    noun: str
    # How a grant's ledger row names this kind of limit.
    grant_kind: str
    # The names of the limits full now under enforce (SQL), for ``skip``.
    full_now: str
    # The declaration rows of the key (read after their locks when locked).
    lock_sql: str

    def probe(self, alias: str) -> str:
        raise NotImplementedError

    def reopens(self, alias: str) -> str:
        """The queue identities (``text[]``) with pending work naming a limit the row ``alias``
        names that was at its cap under enforce counting this claim (occupancy leaves ``alias``
        itself out): ending the claim frees a unit they wait for. The limit and its occupancy
        are read under its lock taken shared (``limits_pool_reopens``, ``limits_tags_reopens``,
        limits migration 0007: one fresh read after the lock), so a ``limit_set`` racing this
        statement (exclusive) either waits for it (and then sees the unit freed, so it rings
        nothing) or commits first (and this reads its new limit, so this rings nothing), and a
        claim that filled the limit while this waited for the lock is counted. Shared, it never
        waits on a headroom claim."""
        raise NotImplementedError

    def names(self, key: Any) -> list[str]:
        return [key] if isinstance(key, str) else sorted(key)

    def read(self, cursor: Any, names: list[str], todo_id: UUID | None, lock: bool) -> list[Held]:
        """The limits ``names`` and their occupancy; ``lock``: under their locks taken exclusive
        (the exact path), so the reads after it see every claim that held them committed."""
        if lock:
            locks.lock(cursor, self.grant_kind, names)
        cursor.execute(self.lock_sql, [names])
        declared = cursor.fetchall()
        counts = self.counts(cursor, names, todo_id)
        out = []
        for name, limit, posture in declared:
            held, frees_at = counts.get(name, (0, None))
            if posture != LimitPosture.OFF and 0 < limit < held:
                # Lowered below what is held: held - limit + 1 holders must go, not one.
                frees_at = self.lease_expiry(name, held - limit, todo_id)
            out.append(Held(name, limit, posture, held, frees_at))
        return out

    def naming(self, name: str) -> Q:
        """The todos naming the limit ``name``."""
        return Q(**{self.name: name})

    def lease_expiry(self, name: str, offset: int, todo_id: UUID | None) -> datetime | None:
        """The lease expiry of the claims naming ``name`` (leaving out ``todo_id``) with
        ``offset`` earlier ones before it; asked only of a limit held over its cap."""
        claims = Todo.objects.filter(self.naming(name), state=TodoState.CLAIMED)
        if todo_id is not None:
            claims = claims.exclude(pk=todo_id)
        leases = claims.order_by("lease_expires_at").values_list("lease_expires_at", flat=True)
        return next(iter(leases[offset : offset + 1]), None)

    def counts(
        self, cursor: Any, names: list[str], todo_id: UUID | None
    ) -> dict[str, tuple[int, Any]]:
        """Occupancy per name among the key, excluding the candidate."""
        raise NotImplementedError

    def pre_read(self, endpoint_id: UUID, queues: list[str]) -> list[gates.Refusal]:
        return []

    def skip(self, alias: str) -> str | None:
        return (
            f"CASE WHEN ({self.probe(alias)}) IS NULL OR {alias}.state = 'claimed' THEN false "
            f"ELSE {self.matches(alias, self.full_now)} END"
        )

    # The fast path (queues.gates): a pool or tags decide inside the claim statement with
    # limits_pool_check / limits_tags_check (migrations 0002, 0005), which take the limits'
    # locks (shared far from the cap, see the module's doc) and count under them; anything but
    # room under every limit takes the locked path. A rate limit (check None) always takes the
    # locked path.
    fast_function: str | None = None

    def fast_check(self, key: str, todo: str, params: str) -> str | None:
        if self.fast_function is None:
            return None
        return f"{self.fast_function}({key}, {todo})"

    def fast_charge(self, verdict: str) -> str:
        return "NULL::integer"  # occupancy is the claimed rows themselves: nothing to spend

    def fast_admit(self, key: str, todo: str, params: str) -> str | None:
        return None  # a limit a todo names is per todo: never the lean statement's

    def fast_params(self, endpoint_id: UUID) -> Any:
        return None

    def fast_report(self, verdict: dict[str, Any]) -> dict[str, Any] | None:
        return None

    def matches(self, alias: str, names: str) -> str:
        """Whether the row names one of ``names`` (an SQL array)."""
        return f"{alias}.{self.name} = ANY({names})"

    def holding(self, endpoint_id: UUID, queues: list[str]) -> list[gates.Refusal]:
        """Per queue and reason (a quarantine's work apart from a full limit's: only an
        operator frees it), the todos held, the limits holding them and the earliest instant
        one may go (exact only when every group's instant is)."""
        now = timezone.now()
        found: dict[tuple[str, str], list[tuple[int, _Hold]]] = {}
        with connection.cursor() as cursor:
            for queue, key, count in self.held_groups(cursor, endpoint_id, queues):
                hold = self.hold(cursor, key, now)
                if hold is not None:  # None: freed since the statement passed it over
                    found.setdefault((queue, hold.reason), []).append((count, hold))
        return [
            LimitRefusal(
                queue=queue,
                reason=reason,
                next_eligible_at=_earliest([h.at for _, h in groups]),
                limits=tuple(sorted({n for _, h in groups for n in h.limits})),
                exact=all(h.exact for _, h in groups),
                pending=sum(count for count, _ in groups),
            )
            for (queue, reason), groups in found.items()
        ]

    def held_groups(
        self, cursor: Any, endpoint_id: UUID, queues: list[str]
    ) -> list[tuple[str, Any, int]]:
        """(queue, key, count) of the claimable todos this gate's skip passes over now."""
        skip = self.skip("t")
        assert skip is not None
        return gated.claimable_groups(cursor, endpoint_id, queues, key=self.probe("t"), where=skip)

    def hold(self, cursor: Any, key: Any, now: datetime) -> _Hold | None:
        """What holds a todo naming ``key`` now, or None if nothing does (read without locks).
        A unit's freeing is an estimate (a holder may end sooner): never exact."""
        over = [
            h
            for h in self.read(cursor, self.names(key), None, False)
            if h.exceeded and h.posture == LimitPosture.ENFORCE
        ]
        if not over:
            return None
        return _Hold(_reason(self.reason, over), _next_eligible(over, now), [h.name for h in over])

    def admit(
        self, cursor: CursorWrapper, *, key: Any, todo_id: UUID
    ) -> gates.Admission | gates.Refusal:
        held = self.read(cursor, self.names(key), todo_id, True)
        over = [h for h in held if h.exceeded]
        enforced = [h for h in over if h.posture == LimitPosture.ENFORCE]
        if enforced:
            at = _next_eligible(enforced, timezone.now())
            reason = _reason(self.reason, enforced)
            return _refusal(cursor, todo_id, reason, at, [h.name for h in enforced], False)
        passed = [h for h in held if h.posture != LimitPosture.OFF]
        return _Waived(self.name, over, passed, self.grant_kind)

    def refused(self, refusals: list[gates.Refusal]) -> None:
        for refusal in refusals:
            metrics.refused(refusal.queue, refusal.reason or "")
            # One per refusal: a todo refused under the lock, or a queue whose todos this
            # limit held when a claim_next came back empty.
            metrics.limit_refused(self.name)

    def deferred_entry(self, refusal: gates.Refusal, endpoint_id: UUID) -> dict[str, Any]:
        assert isinstance(refusal, LimitRefusal)
        return {
            "queue": refusal.queue,
            "reason": refusal.reason,
            "pending": refusal.pending,
            "next_eligible_at": refusal.next_eligible_at,
            "exact": refusal.exact,
            "limits": [{"kind": self.grant_kind, "name": n} for n in refusal.limits],
        }

    def deferred_error(self, refusal: gates.Refusal) -> Deferred:
        assert isinstance(refusal, LimitRefusal)
        at = refusal.next_eligible_at
        names = ", ".join(refusal.limits)
        if refusal.reason == UNDECLARED:
            said = f"{self.noun} {names} is not declared: an operator must declare it"
        elif refusal.reason == QUARANTINED:
            said = f"{self.noun} {names} is quarantined: an operator must raise its limit"
        else:
            said = f"{self.noun} {names} is at its limit" + (
                f"; eligible at {iso(at)}" if at else ""
            )
        return Deferred(
            said,
            queue=refusal.queue,
            reason=refusal.reason,
            next_eligible_at=iso(at),
            exact=refusal.exact,
            **{self.name: list(refusal.limits)},
            # As claim_next's deferred entries name them: one shape for every refusal.
            limits=[{"kind": self.grant_kind, "name": n} for n in refusal.limits],
        )

    def statuses(
        self, identities: Iterable[tuple[UUID, str]]
    ) -> dict[tuple[UUID, str], dict[str, Any]]:
        return {}  # per todo, not per queue identity

    def key_of(self, todo: Any) -> Any:
        """The todo's key for this gate, as ``probe`` gives it in SQL (None: not subject)."""
        return getattr(todo, self.name) or None

    def explain(self, todo: Any) -> gates.GateState | None:
        key = self.key_of(todo)
        if key is None:
            return None
        with connection.cursor() as cursor:
            held = self.read(cursor, self.names(key), None, False)
        return _explained(self.name, self.reason, self.noun, held, timezone.now())

    def admits_now(self, key: Any) -> bool:
        with connection.cursor() as cursor:
            held = self.read(cursor, self.names(key), None, False)
        return not any(h.exceeded and h.posture == LimitPosture.ENFORCE for h in held)

    def queue_names(self, endpoint_ids: list[UUID] | None) -> set[str]:
        return set()


class PoolGate(_OccupancyGate):
    name = "pool"
    lock_order = 20
    reason = "pool_full"
    noun = "pool"
    grant_kind = "pool"
    full_now = _FULL_POOLS
    fast_function = "limits_pool_check"
    lock_sql = "SELECT name, slots, posture FROM limits_pool WHERE name = ANY(%s) ORDER BY name"

    def counts(
        self, cursor: Any, names: list[str], todo_id: UUID | None
    ) -> dict[str, tuple[int, Any]]:
        return gated.claimed_by_pool(cursor, names, todo_id)

    def reopens(self, alias: str) -> str:
        # limits migration 0006: the pool's waiting identities when it was at its cap (the
        # waiting rows are read only then), in a function so that an ending naming no pool
        # does not build the subquery's executor state (issue 12).
        return (
            f"CASE WHEN {alias}.pool IS NOT NULL "
            f"THEN limits_pool_reopens({alias}.pool, {alias}.id) END"
        )

    def probe(self, alias: str) -> str:
        return f"{alias}.pool"


class TagGate(_OccupancyGate):
    name = "tags"
    lock_order = 30
    reason = "tag_full"
    noun = "tag"
    grant_kind = "tag"
    full_now = _FULL_TAGS
    fast_function = "limits_tags_check"
    # The tags' locks are taken in key order (limits_lock), so two claims naming overlapping
    # tags never wait on each other in opposite orders.
    lock_sql = 'SELECT tag, "limit", posture FROM limits_taglimit WHERE tag = ANY(%s) ORDER BY tag'

    def counts(
        self, cursor: Any, names: list[str], todo_id: UUID | None
    ) -> dict[str, tuple[int, Any]]:
        return gated.claimed_by_tag(cursor, names, todo_id)

    def reopens(self, alias: str) -> str:
        # limits migration 0006, as the pool's.
        return (
            f"CASE WHEN cardinality({alias}.tags) > 0 "
            f"THEN limits_tags_reopens({alias}.tags, {alias}.id) END"
        )

    def probe(self, alias: str) -> str:
        return f"CASE WHEN cardinality({alias}.tags) > 0 THEN {alias}.tags END"

    def matches(self, alias: str, names: str) -> str:
        return f"{alias}.tags && {names}"

    def naming(self, name: str) -> Q:
        return Q(tags__contains=[name])


class RateGate(_OccupancyGate):
    """Claims per minute below the effective limit (``admission.limits.rates``)."""

    name = "rate_limit"
    lock_order = 40
    reason = "rate_limited"
    noun = "rate limit"
    grant_kind = "rate"
    full_now = _FULL_RATES

    def probe(self, alias: str) -> str:
        return f"{alias}.rate_limit"

    def reopens(self, alias: str) -> str:
        return "NULL::text[]"  # an ending claim refunds no minute

    def fast_check(self, key: str, todo: str, params: str) -> str | None:
        return None  # the minute's counter is spent under the lock, on the locked path

    def fast_charge(self, verdict: str) -> str:
        raise NotImplementedError("a rate limit has no fast path")

    def fast_admit(self, key: str, todo: str, params: str) -> str | None:
        return None  # no fast path

    def admit(
        self, cursor: CursorWrapper, *, key: Any, todo_id: UUID
    ) -> gates.Admission | gates.Refusal:
        rates.lock(cursor, key)
        found = rates.read(cursor, key)
        if found is None:  # not declared (a todo from before intake checked it): fail closed
            return _refusal(cursor, todo_id, UNDECLARED, None, [key], False)
        rate_id, st = found
        held = Held(st.name, st.effective, st.posture, st.used, None)
        over = [held] if st.exceeded else []
        if over and st.posture == LimitPosture.ENFORCE:
            return _refusal(cursor, todo_id, self.reason, st.next_eligible_at, [key], st.exact)
        passed = [held] if st.posture != LimitPosture.OFF else []
        return _RateCharge(self.name, over, passed, self.grant_kind, rate_id=rate_id, now=st.now)

    def hold(self, cursor: Any, key: Any, now: datetime) -> _Hold | None:
        """As the claim's refusal says it: until the next minute boundary (exact: the count
        starts again) or the moment an observation ages out (an estimate)."""
        found = rates.read(cursor, key, now)
        if found is None or not (found[1].exceeded and found[1].posture == LimitPosture.ENFORCE):
            return None
        st = found[1]
        return _Hold(self.reason, st.next_eligible_at, [key], st.exact)

    def explain(self, todo: Any) -> gates.GateState | None:
        if not todo.rate_limit:
            return None
        st = rates.state(todo.rate_limit)
        if st is None:
            # As the claim refuses it (``admit``): nothing admits a todo naming no declaration.
            return gates.GateState(
                gate=self.name,
                state="holds",
                reason=UNDECLARED,
                next_eligible_at=None,
                detail=f"rate limit {todo.rate_limit}: not declared",
                limits=(todo.rate_limit,),
            )
        held = Held(st.name, st.effective, st.posture, st.used, None)
        detail = (
            f"rate limit {st.name}: {st.used} of {st.effective} claims this minute "
            f"(base {st.base_limit}, {st.observations} 429s in the window; {st.posture})"
        )
        state = _state_of([held])
        return gates.GateState(
            gate=self.name,
            state=state,
            reason=self.reason if state != "admits" else None,
            next_eligible_at=st.next_eligible_at if state == "holds" else None,
            detail=detail,
            limits=(st.name,) if state != "admits" else (),
            exact=st.exact,
        )

    def admits_now(self, key: Any) -> bool:
        st = rates.state(key)
        return st is None or not (st.exceeded and st.posture == LimitPosture.ENFORCE)


def append_waiver(gate: str, over: list[Held], actor: Any, todo: Any) -> None:
    """A claim admitted over advise limits: one ledger row naming exactly the limits exceeded."""
    append_claim_waiver(
        kind=LedgerKind.LIMITS_WAIVER,
        actor=actor,
        todo=todo,
        gate=gate,
        exceeded=[{"name": h.name, "limit": h.limit, "held": h.held} for h in over],
        grant=todo.grant_hash,
    )
    metrics.waived(gate)


def register() -> None:
    gates.register(PoolGate())
    gates.register(TagGate())
    gates.register(RateGate())
