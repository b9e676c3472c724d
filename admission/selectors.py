"""Reads of admission state, shared by the board, the API, MCP, the CLI, wakes and /metrics.

Deferral is derived on read from the policy, the counters and now; it is never stored on todos.
The arithmetic is ``admission.engine.evaluate``, the same the claim applies under the lock.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import connection
from django.db.models import Count, Min, Q
from django.utils import timezone

from admission import engine
from admission.models import AdmissionPolicy, AdmissionWindow


def policy_row(policy: AdmissionPolicy) -> engine.PolicyRow:
    return engine.PolicyRow(
        id=policy.id,
        endpoint_id=policy.endpoint_id,
        queue=policy.queue,
        max_in_flight=policy.max_in_flight,
        max_claims_per_window=policy.max_claims_per_window,
        window_period=policy.window_period,
        window_tz=policy.window_tz,
        window_start=policy.window_start,
        window_weekday=policy.window_weekday,
        posture=policy.posture,
    )


def evaluate_policies(
    policies: Iterable[AdmissionPolicy], now: datetime | None = None
) -> dict[UUID, engine.Evaluation]:
    """Evaluate many policies at once: one query for in-flight, one for the window counters."""
    from queues.models import Todo, TodoState

    now = now or timezone.now()
    policies = list(policies)
    if not policies:
        return {}
    identity = Q()
    for p in policies:
        identity |= Q(endpoint_id=p.endpoint_id, queue=p.queue)
    flights = {
        (row["endpoint_id"], row["queue"]): (row["n"], row["earliest"])
        for row in Todo.objects.filter(identity, state=TodoState.CLAIMED)
        .values("endpoint_id", "queue")
        .annotate(n=Count("id"), earliest=Min("lease_expires_at"))
    }
    used: dict[tuple[UUID, datetime], int] = {
        (w.policy_id, w.window_start): w.used
        for w in AdmissionWindow.objects.filter(policy__in=policies, window_start__gte=_oldest(now))
    }
    out: dict[UUID, engine.Evaluation] = {}
    for p in policies:
        n, earliest = flights.get((p.endpoint_id, p.queue), (0, None))
        used_in = {ws: u for (pid, ws), u in used.items() if pid == p.id}
        out[p.id] = engine.evaluate(
            policy_row(p), in_flight=n, used_in=used_in, now=now, earliest_lease_expiry=earliest
        )
    return out


def _oldest(now: datetime) -> datetime:
    from datetime import timedelta

    # A week window is the longest; anything older is not the current window.
    return now - timedelta(days=8)


def evaluate_policy(policy: AdmissionPolicy, now: datetime | None = None) -> engine.Evaluation:
    return evaluate_policies([policy], now)[policy.id]


def identity_admitted(policy_id: UUID) -> bool:
    """Whether a claim on this policy's queue identity would be admitted now (for wake gating)."""
    policy = AdmissionPolicy.objects.filter(pk=policy_id).first()
    if policy is None:
        return True
    return evaluate_policy(policy).admits


def status(ev: engine.Evaluation) -> dict[str, Any]:
    """The derived status of a queue identity: {state, reason, next_eligible_at, exact}."""
    if ev.admits:
        return {"state": "admitted", "reason": None, "next_eligible_at": None, "exact": True}
    return {
        "state": "deferred",
        "reason": ev.reason,
        "next_eligible_at": ev.next_eligible_at,
        "exact": ev.exact,
    }


def pending_count(endpoint_id: UUID, queue: str) -> int:
    from queues.models import Todo, TodoState

    return Todo.objects.filter(
        endpoint_id=endpoint_id, queue=queue, state=TodoState.PENDING
    ).count()


def deferred_entry(ev: engine.Evaluation, endpoint_id: UUID) -> dict[str, Any]:
    """One item of claim_next's ``deferred`` list."""
    return {
        "queue": ev.policy.queue,
        "reason": ev.reason,
        "pending": pending_count(endpoint_id, ev.policy.queue),
        "next_eligible_at": ev.next_eligible_at,
        "exact": ev.exact,
    }


def statuses_for(identities: Iterable[tuple[UUID, str]]) -> dict[tuple[UUID, str], dict[str, Any]]:
    """Derived status per budgeted queue identity among ``identities`` (unbudgeted are absent)."""
    identities = set(identities)
    if not identities:
        return {}
    q = Q()
    for endpoint_id, queue in identities:
        q |= Q(endpoint_id=endpoint_id, queue=queue)
    policies = list(AdmissionPolicy.objects.filter(q))
    evaluations = evaluate_policies(policies)
    return {(p.endpoint_id, p.queue): status(evaluations[p.id]) for p in policies}


def policy_exists(endpoint_id: UUID, queue: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM admission_admissionpolicy WHERE endpoint_id = %s AND queue = %s",
            [endpoint_id, queue],
        )
        return cursor.fetchone() is not None
