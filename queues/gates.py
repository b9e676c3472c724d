"""The claim gate protocol: how another app gets a say in a claim without queues knowing it.

A gate (admission's budgets; admission.limits' pools and tags) registers itself from its
app's ``AppConfig.ready()`` with ``register``. The claim (``queues.services.claiming``) then, for
every gate in lock order:

1. folds the gate's **probe** into the claiming statement: a scalar SQL expression over the
   candidate row that is NULL when the gate has nothing to say about it. A candidate no gate
   claims is claimed by that same statement, so ungated work costs exactly the statements it
   would cost without gates, plus one indexed probe per gate;
2. before taking any lock, asks for the gate's **pre-read**: the queues it refuses now whatever
   todo is picked, so they are excluded without taking the gate's lock. A **per-todo** gate (a
   pool, tags, a rate limit: limits a todo names, not its queue) instead gives a **skip**: SQL
   folded into the candidate statement that passes over the rows it would refuse now, so
   claim_next takes the next eligible todo of the same queue in that one statement;
3. with the candidate todo locked, asks the gate to **admit** it under the gate's own lock (in
   ``lock_order``, so two claimers never wait on each other's gate locks in opposite orders). A
   refusal rolls back to the savepoint, releasing every gate lock taken for this candidate, and
   claim_next passes over that queue (a per-todo gate: that todo) and tries again;
4. after the claim is written, lets each admitting gate **charge** for it, in the same
   transaction;
5. after the transaction, **records** the refusals (holding no lock, so no lock-order cycle).

The fast path. A gate that can decide in SQL also offers ``fast_check``: an
expression the claim_next statement evaluates for a candidate the gate's probe claims, in lock
order, taking the gate's lock and deciding inside that one autocommitted statement; the claim is
written only if every verdict says ``ok``, and each gate's ``fast_charge`` then spends it in the
same statement. So an admitted claim is one statement and no gate lock is held across a client
round trip. A verdict is a jsonb object: ``{"ok": true, ...}`` (admitted; the rest is what
``fast_report`` turns into the claim's report), ``{"ok": false}`` (take the locked path above,
which refuses, waives or admits exactly as before) or ``{"ok": false, "stale": true}`` (the
parameters ``fast_params`` bound were out of date: take the locked path this once). A gate whose
``fast_check`` answers None always takes the locked path.

The read surfaces ask the same gates why a queue identity waits (``statuses``), whether it would
admit now (``admits_now``, for the doorbell) and which queue names they know (``queue_names``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

from django.db.backends.utils import CursorWrapper

from switchboard.core.errors import Deferred


class Refusal(Protocol):
    """A gate's no for one queue identity: why, and until when."""

    @property
    def queue(self) -> str: ...

    @property
    def reason(self) -> str | None: ...

    @property
    def next_eligible_at(self) -> datetime | None: ...

    @property
    def exact(self) -> bool: ...


@dataclass(frozen=True)
class GateState:
    """What one gate says of one pending todo now (read without locks), for explain.

    ``state``: ``admits`` (a claim passes this gate), ``waives`` (passes over an ``advise``
    limit, with a waiver) or ``holds`` (refused until ``next_eligible_at``; None: until an
    operator acts, e.g. a pause or a quarantine)."""

    gate: str
    state: str
    reason: str | None
    next_eligible_at: datetime | None
    detail: str
    limits: tuple[str, ...] = ()
    # Whether ``next_eligible_at`` is certain (a window's reset, a rate limit's minute) or an
    # estimate (a lease that may end sooner): pages write an estimate with "≈".
    exact: bool = False

    @property
    def holds(self) -> bool:
        return self.state == "holds"

    def as_dict(self) -> dict[str, Any]:
        return {
            "gate": self.gate,
            "state": self.state,
            "reason": self.reason,
            "next_eligible_at": self.next_eligible_at,
            "limits": list(self.limits),
            "detail": self.detail,
            "exact": self.exact,
        }


class Admission:
    """A gate's yes for one locked candidate, held until the claim is written. A gate that
    spends something per claim subclasses it and overrides ``charge``."""

    def charge(self, cursor: CursorWrapper, *, todo: Any, actor: Any) -> dict[str, Any] | None:
        """Spend the claim (in the claim's transaction); returns what the claim reports of it."""
        return None

    def granted(self) -> list[dict[str, Any]]:
        """The named limits this admission passed (not ``off``), each a JSON object with its
        limit and occupancy at admission: the claim writes them into its grant ledger row
        (``queues.sql.grants``) before ``charge`` runs, so a charge's own rows (a waiver) can
        name the grant (``todo.grant_hash``). On the fast path a verdict's ``grant`` member
        carries the same items as canonical JSON text."""
        return []


class ClaimGate(Protocol):
    name: str
    # Gates lock in ascending lock_order; a gate never takes another gate's lock.
    lock_order: int
    # Whether a refusal holds for the candidate todo alone (the limits it names) rather than for
    # its whole queue identity: claim_next then passes over that todo, not its queue.
    per_todo: bool

    def probe(self, alias: str) -> str:
        """A scalar SQL expression over the todo row ``alias`` (its ``endpoint_id``, ``queue``
        and named limits ``pool``, ``tags``, ``rate_limit``): the key ``admit`` needs, or NULL
        when this gate lets the row through. The wakes probe a queue identity as a todo-shaped
        row whose other columns are NULL."""
        ...

    def reopens(self, alias: str) -> str:
        """A ``text[]`` SQL expression over the todo row ``alias`` (NULL or empty: none): the
        queue identities (``<endpoint_id>:<queue>``) with pending work that ending its claim may
        make claimable, because it frees a unit of a limit that was at its cap counting this
        claim (the doorbell rings ``reopened`` for each, once). Evaluated inside the ending
        statement; a gate whose limit a concurrent change may raise reads that limit under a
        share lock (admission.limits: an advisory lock per limit, which the change takes
        exclusive), so the change and the ending claim ring once between them."""
        ...

    def pre_read(self, endpoint_id: UUID, queues: list[str]) -> list[Refusal]:
        """The queues this gate refuses now, whatever todo is picked (read without locks)."""
        ...

    def skip(self, alias: str) -> str | None:
        """A per-todo gate's pre-read, as a boolean SQL expression over the todo row ``alias``:
        true when this gate would refuse the row now (read without locks). The candidate
        statement passes such rows over; ``admit`` under the lock stays the authority. None for
        a gate whose refusals hold per queue."""
        ...

    def holding(self, endpoint_id: UUID, queues: list[str]) -> list[Refusal]:
        """A per-todo gate's part of an empty claim_next: per queue among ``queues``, the
        claimable todos its ``skip`` passes over now (how many, why, and the earliest
        ``next_eligible_at`` among them). Empty for a gate whose refusals hold per queue."""
        ...

    def admit(self, cursor: CursorWrapper, *, key: Any, todo_id: UUID) -> Admission | Refusal:
        """Under this gate's lock (taken here, released at commit or savepoint rollback)."""
        ...

    def refused(self, refusals: list[Refusal]) -> None:
        """Count refusals, after the claim's transaction."""
        ...

    def deferred_entry(self, refusal: Refusal, endpoint_id: UUID) -> dict[str, Any]:
        """One item of claim_next's ``deferred`` list (with the pending count)."""
        ...

    def deferred_error(self, refusal: Refusal) -> Deferred:
        """The error a claim of one todo answers with."""
        ...

    def statuses(
        self, identities: Iterable[tuple[UUID, str]]
    ) -> dict[tuple[UUID, str], dict[str, Any]]:
        """The derived status of each gated identity among ``identities`` (others absent)."""
        ...

    def explain(self, todo: Any) -> GateState | None:
        """What this gate says of the pending todo now (read without locks), or None when the
        todo is not subject to it (no budget on its queue identity, no pool named, ...)."""
        ...

    def admits_now(self, key: Any) -> bool:
        """Whether a claim on the identity its probe gave ``key`` for would pass now (for the
        doorbell)."""
        ...

    def queue_names(self, endpoint_ids: list[UUID] | None) -> set[str]:
        """Queue names this gate has configuration for (narrowed to the endpoints if given)."""
        ...

    def fast_check(self, key: str, todo: str, params: str) -> str | None:
        """A jsonb SQL expression deciding the candidate (``key``: its probe's value, ``todo``:
        its id, ``params``: the placeholder bound to ``fast_params``), or None (locked path only).
        It must take the gate's lock itself and read under it with fresh snapshots (a VOLATILE
        function's own statements do)."""
        ...

    def fast_charge(self, verdict: str) -> str:
        """An SQL expression spending an ``ok`` verdict, evaluated once after the claim row is
        written, in the same statement."""
        ...

    def fast_admit(self, key: str, todo: str, params: str) -> str | None:
        """``fast_check`` and, when its verdict admits, ``fast_charge`` in one expression (the
        same verdict; NULL for a NULL ``key``), or None. For a statement in which the claim is
        certain once this verdict admits (the lean claim statement: the candidate locked, no
        other gate deciding it), so the charge need not wait for the claim row."""
        ...

    def fast_params(self, endpoint_id: UUID) -> Any:
        """The value bound to ``fast_check``'s ``params`` for a claim by this endpoint."""
        ...

    def fast_report(self, verdict: dict[str, Any]) -> dict[str, Any] | None:
        """What the claim reports of an ``ok`` verdict (as ``Admission.charge`` returns)."""
        ...


_GATES: list[ClaimGate] = []


def register(gate: ClaimGate) -> None:
    """Add a gate (once per name), from an ``AppConfig.ready()``, before any claim runs."""
    if any(g.name == gate.name for g in _GATES):
        return
    _GATES.append(gate)
    _GATES.sort(key=lambda g: g.lock_order)


def gates() -> tuple[ClaimGate, ...]:
    return tuple(_GATES)


def statuses(identities: Iterable[tuple[UUID, str]]) -> dict[tuple[UUID, str], dict[str, Any]]:
    """The derived status of each gated identity; the first refusing gate answers."""
    identities = set(identities)
    found: dict[tuple[UUID, str], dict[str, Any]] = {}
    for gate in _GATES:
        for key, status in gate.statuses(identities).items():
            if key not in found or found[key]["state"] == "admitted":
                found[key] = status
    return found


def explain(todo: Any) -> list[GateState]:
    """Each gate's word on the pending todo, in lock order (gates it is not subject to: none)."""
    return [s for s in (gate.explain(todo) for gate in _GATES) if s is not None]


def admits_now(keys: tuple[Any, ...]) -> bool:
    """Whether every gate admits now, given the keys their probes gave (None: not gated)."""
    return all(key is None or gate.admits_now(key) for gate, key in zip(_GATES, keys, strict=True))


def probes(alias: str) -> str:
    """Each gate's probe over ``alias``, as select-list items ``g0, g1, ...`` ("" without gates)."""
    return "".join(f", {gate.probe(alias)} AS g{i}" for i, gate in enumerate(_GATES))


def skips(alias: str) -> list[str]:
    """The per-todo gates' skips over ``alias`` (SQL booleans; none without such gates)."""
    return [s for s in (gate.skip(alias) for gate in _GATES) if s is not None]


def reopens(alias: str) -> str:
    """The queue identities ending this row's claim may reopen, every gate's together (SQL
    ``text[]``, never NULL; empty ungated)."""
    return " || ".join(f"coalesce({g.reopens(alias)}, '{{}}'::text[])" for g in _GATES) or (
        "'{}'::text[]"
    )


def queue_names(endpoint_ids: list[UUID] | None) -> set[str]:
    names: set[str] = set()
    for gate in _GATES:
        names |= gate.queue_names(endpoint_ids)
    return names


class Priority(Protocol):
    """Another app's say in which queue claim_next serves first (admission.limits' queue
    priority with aging). Without one, or when it does not apply, claim_next is oldest-first."""

    def applies(self, queues: list[str]) -> bool:
        """Whether any of these queue names has a priority, from what this process knows (no
        query: it may lag another process's change by a moment; an ordering, never a limit)."""
        ...

    def stale(self) -> bool:
        """Whether the next claim_next statement should carry the names back (``names_sql``)."""
        ...

    def names_sql(self) -> str:
        """An SQL text[] of the queue names with a priority."""
        ...

    def refresh(self, names: Iterable[str]) -> None:
        """What ``names_sql`` answered."""
        ...

    def score(self, alias: str) -> str:
        """An SQL expression over the todo row ``alias``: higher is served first; equal scores
        go oldest first."""
        ...


_PRIORITY: list[Priority] = []


def register_priority(priority: Priority) -> None:
    _PRIORITY[:] = [priority]


def prioritised(queues: list[str]) -> bool:
    """Whether claim_next over these queues orders by a registered priority (two queues at
    least: one queue is oldest-first whatever its priority)."""
    return len(queues) > 1 and any(p.applies(queues) for p in _PRIORITY)


def priority_stale() -> bool:
    # The one registered priority, as priority_names_sql reads it: no generator for any() built
    # on every claim.
    return bool(_PRIORITY) and _PRIORITY[0].stale()


def priority_names_sql() -> str:
    return _PRIORITY[0].names_sql() if _PRIORITY else "ARRAY[]::text[]"


def priority_refresh(names: Iterable[str]) -> None:
    for p in _PRIORITY:
        p.refresh(names)


def priority_score(alias: str) -> str:
    return _PRIORITY[0].score(alias) if _PRIORITY else "0"
