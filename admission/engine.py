"""The admission decision, taken under the policy row lock inside the claim transaction: locking
and arithmetic only (the claim itself is ``queues.services.claiming``; admission's side of it is
``admission.gate``).

With the candidate todo locked, lock the policy row
(``FOR UPDATE``), count in-flight under the lock (excluding a takeover of this very todo), read the
window counter, then refuse or charge. Charging upserts the window counter by one. The same
arithmetic, read without locks, answers "why is this queue waiting" for every read surface
(``admission/selectors.py``), so the claim and the board cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db.backends.utils import CursorWrapper

from admission import windows
from admission.models import DeferralReason, Posture


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


POLICY_COLUMNS = (
    "id, endpoint_id, queue, max_in_flight, max_claims_per_window, window_period, window_tz, "
    "window_start, window_weekday, posture"
)


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
) -> Evaluation:
    """Evaluate a policy at ``now`` given its in-flight count and window counters.

    ``used_in`` maps window starts to counters; only the current window's is read. ``window``,
    when the caller already computed it (``bounds``), saves computing it again.
    """
    used: int | None = None
    ws = resets = None
    if policy.max_claims_per_window is not None:
        try:
            ws, resets = window or windows.current_window(policy, now)
        except windows.WindowUnavailable:
            return Evaluation(
                policy=policy,
                in_flight=in_flight,
                used=None,
                window_start=None,
                window_resets_at=None,
                reason=DeferralReason.ADMISSION_UNAVAILABLE,
                exceeded=["window"],
            )
        used = (used_in or {}).get(ws, 0)
    ev = Evaluation(
        policy=policy, in_flight=in_flight, used=used, window_start=ws, window_resets_at=resets
    )
    if policy.max_in_flight == 0 or policy.max_claims_per_window == 0:
        ev.reason = DeferralReason.PAUSED
        ev.exceeded = [
            name
            for name, limit in (
                ("max_in_flight", policy.max_in_flight),
                ("max_claims_per_window", policy.max_claims_per_window),
            )
            if limit == 0
        ]
        return ev
    if (
        policy.max_claims_per_window is not None
        and used is not None
        and used >= policy.max_claims_per_window
    ):
        ev.exceeded.append("max_claims_per_window")
    if policy.max_in_flight is not None and in_flight >= policy.max_in_flight:
        ev.exceeded.append("max_in_flight")
    in_flight_hint = None
    if "max_in_flight" in ev.exceeded and earliest_lease_expiry is not None:
        # A slot frees at the latest when the earliest lease lapses and the reaper runs.
        in_flight_hint = max(now, earliest_lease_expiry) + timedelta(
            seconds=settings.SWEEP_INTERVAL_SECONDS
        )
    if "max_claims_per_window" in ev.exceeded:
        ev.reason = DeferralReason.WINDOW_EXHAUSTED
        ev.next_eligible_at = resets
        # Exact only when the reset alone admits: a full in-flight cap may outlast it.
        ev.exact = "max_in_flight" not in ev.exceeded
        if not ev.exact and in_flight_hint is not None and resets is not None:
            ev.next_eligible_at = max(resets, in_flight_hint)
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


def lock_policy(cursor: CursorWrapper, policy_id: UUID) -> PolicyRow | None:
    cursor.execute(
        f"SELECT {POLICY_COLUMNS} FROM admission_admissionpolicy WHERE id = %s FOR UPDATE",
        [policy_id],
    )
    row = cursor.fetchone()
    return PolicyRow(*row) if row else None


def bounds(policy: PolicyRow, now: datetime) -> tuple[datetime, datetime] | None:
    """The current window (start, next boundary) of a policy with a window limit; None without a
    window limit or when the window cannot be evaluated (``evaluate`` then says why)."""
    if policy.max_claims_per_window is None:
        return None
    try:
        return windows.current_window(policy, now)
    except windows.WindowUnavailable:
        return None


# In-flight (excluding a takeover of this very todo), the earliest lease and the current window's
# counter: admission_usage (migration 0005), the one usage query every surface reads. Run after
# the lock is granted, so its snapshot sees every claim committed by the transactions the lock
# waited for (READ COMMITTED).
_DECIDE_SQL = (
    "SELECT in_flight, earliest_lease, used "
    "FROM admission_usage(%s::uuid, %s::text, %s::uuid, %s::timestamptz, %s::uuid)"
)


def decide(cursor: CursorWrapper, *, policy: PolicyRow, todo_id: UUID, now: datetime) -> Decision:
    """Count in-flight and the window under the policy lock the caller holds, and decide.

    Must run in a statement after ``lock_policy`` (never folded into it: a locking statement's
    snapshot predates the lock wait and would miss the claims it waited for).
    """
    current = bounds(policy, now)
    ws = current[0] if current else None
    cursor.execute(_DECIDE_SQL, [policy.endpoint_id, policy.queue, policy.id, ws, todo_id])
    in_flight, earliest, used = cursor.fetchone()
    used_in = {ws: used} if ws is not None else {}
    ev = evaluate(
        policy,
        in_flight=in_flight,
        used_in=used_in,
        now=now,
        earliest_lease_expiry=earliest,
        window=current,
    )
    return Decision(evaluation=ev, admitted=ev.admits)


def charge(cursor: CursorWrapper, decision: Decision) -> None:
    """Spend one unit of the current window; the claimed row's own update already happened."""
    ev = decision.evaluation
    if ev.window_start is None:
        return
    cursor.execute(
        """
        INSERT INTO admission_admissionwindow
            (policy_id, window_start, used, refused, claims_limit, updated_at)
        VALUES (%s, %s, 1, 0, %s, now())
        ON CONFLICT (policy_id, window_start)
        DO UPDATE SET used = admission_admissionwindow.used + 1,
                      claims_limit = EXCLUDED.claims_limit, updated_at = now()
        """,
        [ev.policy.id, ev.window_start, ev.policy.max_claims_per_window],
    )


def record_refusal(cursor: CursorWrapper, evaluation: Evaluation) -> None:
    """Count a refusal in the window's history (outside any policy lock; see services)."""
    if evaluation.window_start is None:
        return
    cursor.execute(
        """
        INSERT INTO admission_admissionwindow
            (policy_id, window_start, used, refused, claims_limit, updated_at)
        VALUES (%s, %s, 0, 1, %s, now())
        ON CONFLICT (policy_id, window_start)
        DO UPDATE SET refused = admission_admissionwindow.refused + 1,
                      claims_limit = EXCLUDED.claims_limit, updated_at = now()
        """,
        [evaluation.policy.id, evaluation.window_start, evaluation.policy.max_claims_per_window],
    )
