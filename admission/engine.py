"""The admission decision, taken under the policy row lock inside the claim transaction: locking
and arithmetic only (the claim itself is ``queues.services.claiming``; admission's side of it is
``admission.gate``).

With the candidate todo locked, lock the policy row (``FOR NO KEY UPDATE``) and then all of its
shard locks (``lock_policy``; a claim on the fast path holds one shard, or all of them, and never
the row: admission migration 0007), count in-flight under
the locks (excluding a takeover of this very todo), read the window counters (each window's shard
rows summed), then refuse or charge. Charging upserts shard 0's counter row by one. The same
arithmetic, read without locks, answers "why is this queue waiting" for every read surface
(``admission/selectors.py``), so the claim and the board cannot disagree.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.backends.utils import CursorWrapper

from admission import windows
from admission.models import PRIMARY_WINDOW_KEY, DeferralReason, Posture
from admission.policy import PolicySpec, WindowLimit
from queues.sql import gated


@dataclass(frozen=True)
class PolicyRow:
    id: UUID
    endpoint_id: UUID
    queue: str
    max_in_flight: int | None
    max_claims_per_window: int | None
    window_period: str | None
    window_tz: str | None
    window_start: str | None
    window_weekday: str | None
    posture: str
    extra_windows: Any = ()  # the stacked windows after the first, as stored

    def window_limits(self) -> list[WindowLimit]:
        """Every window limit of the policy, the first one first (admission/policy.py)."""
        return PolicySpec.of(self).windows


POLICY_COLUMNS = (
    "id, endpoint_id, queue, max_in_flight, max_claims_per_window, window_period, window_tz, "
    "window_start, window_weekday, posture, extra_windows"
)


@dataclass(frozen=True)
class WindowUse:
    """One window of a policy at an instant: its limit, definition, counter and bounds."""

    limit: int
    key: str
    period: str
    tz: str | None
    start: str | None
    weekday: str | None
    used: int
    window_start: datetime
    window_resets_at: datetime

    @property
    def exhausted(self) -> bool:
        return self.used >= self.limit

    def out(self) -> dict[str, Any]:
        """As the surfaces show it (usage, the deferral's binding window)."""
        spec = windows.Window(self.period, self.tz, self.start, self.weekday)
        try:
            description: str | None = windows.describe(spec)
        except windows.WindowUnavailable:
            description = None
        return {
            "limit": self.limit,
            "period": self.period,
            "tz": self.tz,
            "start": self.start,
            "weekday": self.weekday,
            "description": description,
            "used": self.used,
            "remaining": max(0, self.limit - self.used),
            "window_start": self.window_start,
            "window_resets_at": self.window_resets_at,
        }


Bounds = dict[str, tuple[datetime, datetime]]


def all_bounds(policy: PolicyRow, now: datetime) -> Bounds | None:
    """The current window (start, next boundary) of every window limit, by counter key; None
    when one cannot be evaluated (``evaluate`` then says why)."""
    out: Bounds = {}
    for item in policy.window_limits():
        w = item.window
        try:
            out[item.key] = windows.current_window(
                windows.Window(w.period, w.tz, w.start, w.weekday), now
            )
        except windows.WindowUnavailable:
            return None
    return out


@dataclass
class Evaluation:
    """A policy evaluated at an instant: usage, and the limit it would exceed, if any."""

    policy: PolicyRow
    in_flight: int
    used: int | None  # None: the policy has no window limit
    window_start: datetime | None
    window_resets_at: datetime | None
    reason: str | None = None  # the limit a further claim would exceed
    next_eligible_at: datetime | None = None
    exact: bool = False
    exceeded: list[str] = field(default_factory=list)
    # Every window limit (the first one first) and, when windows are exhausted, the one that
    # holds the claim until next_eligible_at: the exhausted window that resets last.
    windows: list[WindowUse] = field(default_factory=list)
    binding: WindowUse | None = None

    @property
    def queue(self) -> str:
        return self.policy.queue

    @property
    def over_limit(self) -> bool:
        return self.reason is not None

    @property
    def admits(self) -> bool:
        """Whether a claim is admitted now, posture applied. Unavailable fails closed."""
        if self.reason is None:
            return True
        if self.policy.posture == Posture.OFF:
            return True
        if self.reason == DeferralReason.ADMISSION_UNAVAILABLE:
            return False
        return self.policy.posture == Posture.ADVISE

    def headroom(self) -> dict[str, Any]:
        limit = self.policy.max_claims_per_window
        remaining = None if limit is None or self.used is None else max(0, limit - self.used)
        return {
            "max_in_flight": self.policy.max_in_flight,
            "in_flight": self.in_flight,
            "max_claims_per_window": limit,
            "used": self.used,
            "remaining": remaining,
            "window_resets_at": self.window_resets_at,
            "posture": self.policy.posture,
        }


def evaluate(
    policy: PolicyRow,
    *,
    in_flight: int,
    used_in: dict[datetime, int] | None,
    now: datetime,
    earliest_lease_expiry: datetime | None,
    window: tuple[datetime, datetime] | None = None,
    more_used: dict[str, int] | None = None,
    current: Bounds | None = None,
) -> Evaluation:
    """Evaluate a policy at ``now`` given its in-flight count and window counters.

    ``earliest_lease_expiry``: the lease expiry at which in-flight drops below the cap (the
    earliest one, unless more claims are held than the cap allows: ``frees_at``).
    ``used_in`` maps the first window's starts to its counters; only the current window's is
    read. ``more_used`` maps a stacked window's key to its current counter. ``window`` and
    ``current`` (``all_bounds``), when the caller already computed them, save computing them
    again.
    """
    used: int | None = None
    ws = resets = None
    uses: list[WindowUse] = []
    limits = policy.window_limits()
    if limits:
        bounds_now = current if current is not None else all_bounds(policy, now)
        if bounds_now is None:
            return Evaluation(
                policy=policy,
                in_flight=in_flight,
                used=None,
                window_start=None,
                window_resets_at=None,
                reason=DeferralReason.ADMISSION_UNAVAILABLE,
                exceeded=["window"],
            )
        for item in limits:
            start, end = bounds_now[item.key]
            if item.key == PRIMARY_WINDOW_KEY:
                if window is not None:
                    start, end = window
                n = (used_in or {}).get(start, 0)
                used, ws, resets = n, start, end
            else:
                n = (more_used or {}).get(item.key, 0)
            w = item.window
            uses.append(
                WindowUse(item.limit, item.key, w.period, w.tz, w.start, w.weekday, n, start, end)
            )
    ev = Evaluation(
        policy=policy,
        in_flight=in_flight,
        used=used,
        window_start=ws,
        window_resets_at=resets,
        windows=uses,
    )
    if policy.max_in_flight == 0 or any(u.limit == 0 for u in uses):
        ev.reason = DeferralReason.PAUSED
        ev.exceeded = ["max_in_flight"] if policy.max_in_flight == 0 else []
        if any(u.limit == 0 for u in uses):
            ev.exceeded.append("max_claims_per_window")
        return ev
    exhausted = [u for u in uses if u.exhausted]
    if exhausted:
        ev.exceeded.append("max_claims_per_window")
        # The claim waits until every exhausted window has reset: the last reset binds.
        ev.binding = max(exhausted, key=lambda u: u.window_resets_at)
    if policy.max_in_flight is not None and in_flight >= policy.max_in_flight:
        ev.exceeded.append("max_in_flight")
    in_flight_hint = None
    if "max_in_flight" in ev.exceeded and earliest_lease_expiry is not None:
        # A slot frees at the latest when the lease that brings in-flight below the cap lapses
        # (``frees_at``: the earliest, or later when the cap was lowered below what is held)
        # and the reaper runs.
        in_flight_hint = max(now, earliest_lease_expiry) + timedelta(
            seconds=settings.SWEEP_INTERVAL_SECONDS
        )
    if ev.binding is not None:
        ev.reason = DeferralReason.WINDOW_EXHAUSTED
        ev.next_eligible_at = ev.binding.window_resets_at
        # Exact only when the reset alone admits: a full in-flight cap may outlast it.
        ev.exact = "max_in_flight" not in ev.exceeded
        if not ev.exact and in_flight_hint is not None:
            ev.next_eligible_at = max(ev.binding.window_resets_at, in_flight_hint)
    elif "max_in_flight" in ev.exceeded:
        ev.reason = DeferralReason.IN_FLIGHT_FULL
        ev.next_eligible_at = in_flight_hint
        ev.exact = False
    return ev


@dataclass(frozen=True)
class Decision:
    evaluation: Evaluation
    admitted: bool

    @property
    def waiver(self) -> bool:
        """An over-limit claim admitted under the advise posture."""
        ev = self.evaluation
        return self.admitted and ev.over_limit and ev.policy.posture == Posture.ADVISE


def policy_rows(cursor: CursorWrapper, where: str, params: list[Any]) -> list[PolicyRow]:
    """The policies ``where`` selects, read without a lock as the rows the engine evaluates
    (SQL of their own: the hot reads, a refused claim's pre-read and the fast path's windows,
    cost less than compiling an ORM query)."""
    cursor.execute(f"SELECT {POLICY_COLUMNS} FROM admission_admissionpolicy WHERE {where}", params)
    return [PolicyRow(*row) for row in cursor.fetchall()]


def lock_policy(cursor: CursorWrapper, policy_id: UUID) -> PolicyRow | None:
    """The locked path's lock: the policy row, then all of its shard locks (``lock_shards``).

    Claims on the fast path hold one shard (or all of them) and never the row, so the row alone
    no longer excludes them. Lock order: policy row, shards, pool/tags, rate, ledger.

    ``FOR NO KEY UPDATE``, not ``FOR UPDATE``: a fast claim that inserts a window counter row
    takes ``FOR KEY SHARE`` on the policy row in its foreign key check, at commit (Django's
    foreign keys are deferred), while it holds its shard; a ``FOR UPDATE`` here would wait for
    that commit while the claim waits for the row: a deadlock.
    """
    cursor.execute(
        f"SELECT {POLICY_COLUMNS} FROM admission_admissionpolicy WHERE id = %s FOR NO KEY UPDATE",
        [policy_id],
    )
    row = cursor.fetchone()
    if not row:
        return None
    lock_shards(cursor, policy_id)
    return PolicyRow(*row)


def lock_shards(cursor: CursorWrapper, policy_id: UUID) -> None:
    """Take all of a policy's shard locks in ascending order (``admission_shards_lock``,
    migration 0007), after its row lock: anything that must serialise with every claim of the
    budget (the locked path, a policy write) holds them until its transaction ends."""
    cursor.execute("SELECT admission_shards_lock(%s)", [policy_id])


def bounds(policy: PolicyRow, now: datetime) -> tuple[datetime, datetime] | None:
    """The current window (start, next boundary) of a policy's first window limit; None without a
    window limit or when the window cannot be evaluated (``evaluate`` then says why)."""
    if policy.max_claims_per_window is None:
        return None
    try:
        return windows.current_window(policy, now)
    except windows.WindowUnavailable:
        return None


# The counters of stacked windows (after the first), in one statement: admission_windows_used
# (migration 0006), which admission_check reads too.
_MORE_USED_SQL = "SELECT admission_windows_used(%s::uuid, %s::text[], %s::timestamptz[])"


def more_used(cursor: CursorWrapper, policy: PolicyRow, current: Bounds | None) -> dict[str, int]:
    """The current counter of each stacked window (after the first) of ``policy``, by key."""
    keys = [k for k in (current or {}) if k != PRIMARY_WINDOW_KEY]
    if not keys:
        return {}
    assert current is not None
    cursor.execute(_MORE_USED_SQL, [policy.id, keys, [current[k][0] for k in keys]])
    return dict(zip(keys, cursor.fetchone()[0], strict=True))


# In-flight (excluding a takeover of this very todo), the earliest lease and the current window's
# counter: admission_usage (migration 0005), the one usage query every surface reads. Run after
# the lock is granted, so its snapshot sees every claim committed by the transactions the lock
# waited for (READ COMMITTED).
_DECIDE_SQL = (
    "SELECT in_flight, earliest_lease, used "
    "FROM admission_usage(%s::uuid, %s::text, %s::uuid, %s::timestamptz, %s::uuid)"
)


def frees_at(
    cursor: CursorWrapper,
    policy: PolicyRow,
    *,
    in_flight: int,
    earliest: datetime | None,
    exclude: UUID | None = None,
) -> datetime | None:
    """The lease expiry at which enough of the claims counted have lapsed for in-flight to drop
    below the cap: the (in_flight - cap + 1)-th earliest. That is the earliest (``earliest``,
    already read with the usage: no statement) unless the cap was lowered below what is held,
    when in_flight - cap + 1 holders must go, not one (as ``admission.limits.gates.Held``)."""
    cap = policy.max_in_flight
    if cap is None or cap <= 0 or in_flight <= cap:
        return earliest
    at: datetime | None = gated.lease_at(
        cursor, policy.endpoint_id, policy.queue, in_flight - cap, exclude
    )
    return at


def decide(cursor: CursorWrapper, *, policy: PolicyRow, todo_id: UUID, now: datetime) -> Decision:
    """Count in-flight and the window under the policy lock the caller holds, and decide.

    Must run in a statement after ``lock_policy`` (never folded into it: a locking statement's
    snapshot predates the lock wait and would miss the claims it waited for).
    """
    current = all_bounds(policy, now)
    first = (current or {}).get(PRIMARY_WINDOW_KEY)
    ws = first[0] if first else None
    cursor.execute(_DECIDE_SQL, [policy.endpoint_id, policy.queue, policy.id, ws, todo_id])
    in_flight, earliest, used = cursor.fetchone()
    used_in = {ws: used} if ws is not None else {}
    ev = evaluate(
        policy,
        in_flight=in_flight,
        used_in=used_in,
        now=now,
        earliest_lease_expiry=frees_at(
            cursor, policy, in_flight=in_flight, earliest=earliest, exclude=todo_id
        ),
        more_used=more_used(cursor, policy, current),
        current=current,
    )
    return Decision(evaluation=ev, admitted=ev.admits)


# One unit of every current window, on shard 0's counter row, in one statement.
_CHARGE_SQL = """
    INSERT INTO admission_admissionwindow
        (policy_id, window_key, window_start, shard, used, refused, claims_limit, updated_at)
    SELECT %s, k.key, k.ws, 0, 1, 0, k.lim, now()
    FROM unnest(%s::text[], %s::timestamptz[], %s::integer[]) AS k(key, ws, lim)
    ON CONFLICT (policy_id, window_key, window_start, shard)
    DO UPDATE SET used = admission_admissionwindow.used + 1,
                  claims_limit = EXCLUDED.claims_limit, updated_at = now()
"""


def charge(cursor: CursorWrapper, decision: Decision) -> None:
    """Spend one unit of every current window; the claimed row's own update already happened.
    All windows in one statement: the charge holds every shard (``lock_policy``), so no policy
    write moves the counters meanwhile."""
    uses = decision.evaluation.windows
    if not uses:
        return
    cursor.execute(
        _CHARGE_SQL,
        [
            decision.evaluation.policy.id,
            [u.key for u in uses],
            [u.window_start for u in uses],
            [u.limit for u in uses],
        ],
    )


# One window's refusal, on shard 0's counter row, while the budget is there and, for the first
# window (PRIMARY_WINDOW_KEY), once a write of the budget in progress has committed and while
# its first window is still the one the refusal was decided under: a write that changed it
# moved that key's rows to the old window's own key, and a refusal counted there after it sat
# in another window's history (races11, regress11). admission_count_refusal, migration 0012.
_REFUSED_SQL = (
    "SELECT admission_count_refusal(%(policy)s::uuid, %(key)s::text, %(ws)s::timestamptz, "
    "%(lim)s::integer, %(first)s::boolean, %(period)s::text, %(tz)s::text, %(start)s::text, "
    "%(weekday)s::text)"
)


def record_refusal(cursor: CursorWrapper, evaluation: Evaluation) -> None:
    """Count a refusal in every window's history, outside any policy lock, one window per
    statement: called in autocommit (after the claim's transaction), each is its own transaction.

    Never one statement or transaction for all of them: a refusal holding one counter row while
    it waits for another deadlocked with a policy write moving the counters when the first
    window changes (``services._follow_first_window``: the first window's rows from
    ``PRIMARY_WINDOW_KEY`` to its definition's key, then the new first window's back). The
    refusal, evaluated under the list before, had updated the first window's row and waited for
    the stacked window's row the write had just inserted; the write, deleting the first window's
    rows, waited for the refusal's row. One row at a time, a refusal waits holding no counter
    row (the first window's count holds shard 0's lock shared, which only writes and claims
    holding that shard exclude, and none of those waits for a refusal's row).

    A budget cleared since the refusal was decided takes its history with it: nothing is counted
    (the statement finds no policy, or, cleared between its read and its foreign key's check,
    is refused by that key: ``IntegrityError``, caught here)."""
    policy = evaluation.policy
    for use in evaluation.windows:
        params: dict[str, Any] = {
            "policy": policy.id,
            "key": use.key,
            "first": use.key == PRIMARY_WINDOW_KEY,
            "ws": use.window_start,
            "lim": use.limit,
            "period": policy.window_period,
            "tz": policy.window_tz,
            "start": policy.window_start,
            "weekday": policy.window_weekday,
        }
        try:
            # In a caller's transaction (a test's), a savepoint, so a refusal refused leaves it
            # usable; in autocommit, the statement alone.
            with transaction.atomic() if connection.in_atomic_block else nullcontext():
                cursor.execute(_REFUSED_SQL, params)
        except IntegrityError:
            return  # the budget is gone, and every counter row of it
