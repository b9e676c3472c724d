"""Admission's claim gate: a queue identity's budget (in-flight cap, claims per window).

Registered from ``AdmissionConfig.ready()``; the claim (``queues.services.claiming``) calls it
through the gate protocol of ``queues.gates``. Under the policy row lock it counts in-flight
(excluding a takeover of this very todo) and the window, then refuses or charges one unit; a
claim admitted only because of the ``advise`` posture leaves a waiver in the ledger.

Two paths, one arithmetic. The fast path (``fast_check``: ``admission_check`` and
``admission_charge``, migrations 0004 and 0007) decides a claim under every limit inside the
claiming statement; anything else (a limit reached, paused, advise, off, unavailable, stale
bounds) goes to the locked path (``admit``), which refuses, waives or admits with
``engine.decide``. A fast claim far from every limit holds one of the budget's K shard locks and
admits only with K of room under each limit; near a limit it holds all K and admits with room for
one. The locked path and every policy write take the policy row lock and then all K shards, so
they serialise with every claim exactly (lock order: policy row, shards, pool/tags, rate, ledger;
the proof is in migration 0007's header).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import connection
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

from admission import engine, selectors
from admission.models import PRIMARY_WINDOW_KEY, AdmissionPolicy, DeferralReason, Posture
from queues import gates, metrics
from queues.access import append_claim_waiver
from queues.sql import gated
from switchboard.core.errors import Deferred
from switchboard.core.times import iso
from switchboard.ledger.models import LedgerKind

# One lookup on the policy table's unique (endpoint_id, queue) index.
_PROBE = (
    "(SELECT p.id FROM admission_admissionpolicy p "
    "WHERE p.endpoint_id = {t}.endpoint_id AND p.queue = {t}.queue)"
)


# Whether ending the claim of the todo frees a slot its queue identity's enforced in-flight cap
# was holding: in flight was at the cap counting this claim (its other claims, on
# todo_claimed_idx, are one fewer), so a claim may have been refused for it. Below the cap
# nothing waited for the slot; over it (the cap lowered below what is held) one ending frees
# none. The claims are counted only for a queue identity with such a cap: one indexed lookup on
# the policy's unique (endpoint_id, queue) otherwise. Read on the ending statement's snapshot:
# another claim ending meanwhile can make a ring spare (both count each other); a claim that
# fills the cap and commits meanwhile is not counted, so that ending rings nothing (the reopen
# sweep and the doorbell's reminders remain).
def _frees_slot(t: str) -> str:
    return (
        "(SELECT p.max_in_flight = 1 + "
        + gated.claimed_in_identity("p.endpoint_id", "p.queue", excluding=f"{t}.id")
        + " FROM admission_admissionpolicy p"
        + f" WHERE p.endpoint_id = {t}.endpoint_id AND p.queue = {t}.queue"
        + " AND p.max_in_flight IS NOT NULL AND p.posture = 'enforce')"
    )


@dataclass
class _Charge(gates.Admission):
    decision: engine.Decision

    def charge(self, cursor: CursorWrapper, *, todo: Any, actor: Any) -> dict[str, Any] | None:
        engine.charge(cursor, self.decision)
        ev = self.decision.evaluation
        if self.decision.waiver:
            _append_waiver(self.decision, actor, todo)
        headroom = ev.headroom()
        headroom["in_flight"] = ev.in_flight + 1
        if ev.used is not None:
            headroom["used"] = ev.used + 1
            limit = ev.policy.max_claims_per_window
            headroom["remaining"] = None if limit is None else max(0, limit - ev.used - 1)
        headroom["windows"] = [
            {
                "limit": u.limit,
                "used": u.used + 1,
                "remaining": max(0, u.limit - u.used - 1),
                "window_start": u.window_start,
                "window_resets_at": u.window_resets_at,
            }
            for u in ev.windows
        ]
        return headroom


class BudgetGate:
    name = "admission"
    lock_order = 10
    per_todo = False  # a budget holds a queue identity, whatever todo is picked

    def probe(self, alias: str) -> str:
        return _PROBE.format(t=alias)

    def reopens(self, alias: str) -> str:
        # An in-flight cap limits the claim's own queue identity only; it reopens only when
        # the ending frees a slot of a full cap (``wakes.reopen`` then rings it only if work
        # waits and a claim would pass now).
        return (
            f"CASE WHEN {_frees_slot(alias)} "
            f"THEN ARRAY[{alias}.endpoint_id::text || ':' || {alias}.queue] END"
        )

    def pre_read(self, endpoint_id: UUID, queues: list[str]) -> list[gates.Refusal]:
        return list(selectors.deferred_among(endpoint_id, queues))

    def skip(self, alias: str) -> str | None:
        return None  # the pre-read excludes whole queues

    def holding(self, endpoint_id: UUID, queues: list[str]) -> list[gates.Refusal]:
        return []

    def admit(
        self, cursor: CursorWrapper, *, key: Any, todo_id: UUID
    ) -> gates.Admission | gates.Refusal:
        policy = engine.lock_policy(cursor, key)
        if policy is None:  # cleared since the probe: nothing to charge
            return gates.Admission()
        decision = engine.decide(cursor, policy=policy, todo_id=todo_id, now=timezone.now())
        if not decision.admitted:
            return decision.evaluation
        return _Charge(decision)

    def refused(self, refusals: list[gates.Refusal]) -> None:
        for ev in refusals:
            assert isinstance(ev, engine.Evaluation)
            metrics.refused(ev.policy.queue, ev.reason or "")
            with connection.cursor() as cursor:  # no atomic block: see engine.record_refusal
                engine.record_refusal(cursor, ev)

    def deferred_entry(self, refusal: gates.Refusal, endpoint_id: UUID) -> dict[str, Any]:
        assert isinstance(refusal, engine.Evaluation)
        return selectors.deferred_entry(refusal, endpoint_id)

    def deferred_error(self, refusal: gates.Refusal) -> Deferred:
        ev = refusal
        assert isinstance(ev, engine.Evaluation)
        binding = selectors.binding_window(ev)
        details: dict[str, Any] = {
            "queue": ev.policy.queue,
            "reason": ev.reason,
            "next_eligible_at": iso(ev.next_eligible_at),
            "exact": ev.exact,
            "window": _jsonable(binding),
        }
        if ev.reason == DeferralReason.ADMISSION_UNAVAILABLE:
            text = "its admission policy cannot be evaluated"
        elif ev.next_eligible_at:
            text = f"{ev.reason}; eligible at {iso(ev.next_eligible_at)}"
            if binding is not None:
                text = (
                    f"{ev.reason} ({binding['used']} of {binding['limit']} "
                    f"{binding['description'] or binding['period']}); "
                    f"eligible at {iso(ev.next_eligible_at)}"
                )
        else:
            text = str(ev.reason)
        return Deferred(f"queue {ev.policy.queue!r} is deferred: {text}", **details)

    def statuses(
        self, identities: Iterable[tuple[UUID, str]]
    ) -> dict[tuple[UUID, str], dict[str, Any]]:
        return selectors.statuses_for(identities)

    def explain(self, todo: Any) -> gates.GateState | None:
        ev = selectors.identity_status(todo.endpoint_id, todo.queue)
        if ev is None:
            return None
        usage = []
        if ev.policy.max_in_flight is not None:
            usage.append(f"{ev.in_flight} of {ev.policy.max_in_flight} in flight")
        for use in ev.windows:
            phrase = use.out()["description"] or f"per {use.period}"
            usage.append(f"{use.used} of {use.limit} claims {phrase}")
        detail = f"budget ({ev.policy.posture}): " + ("; ".join(usage) or "no limit set")
        if not ev.admits:
            state = "holds"
        elif ev.over_limit and ev.policy.posture == Posture.ADVISE:
            state = "waives"
        else:
            state = "admits"
        if state != "admits" and ev.binding is not None:
            detail += f"; held by the window {ev.binding.out()['description'] or ev.binding.period}"
        return gates.GateState(
            gate="budget",
            state=state,
            reason=ev.reason if state != "admits" else None,
            next_eligible_at=ev.next_eligible_at if state == "holds" else None,
            detail=detail,
            exact=ev.exact,
        )

    def admits_now(self, key: Any) -> bool:
        return selectors.identity_admitted(key)

    def queue_names(self, endpoint_ids: list[UUID] | None) -> set[str]:
        policies = AdmissionPolicy.objects.all()
        if endpoint_ids is not None:
            policies = policies.filter(endpoint_id__in=endpoint_ids)
        return set(policies.values_list("queue", flat=True))

    def fast_check(self, key: str, todo: str, params: str) -> str | None:
        return f"admission_check({key}, {todo}, {params}::jsonb)"

    def fast_charge(self, verdict: str) -> str:
        return f"admission_charge({verdict})"

    def fast_admit(self, key: str, todo: str, params: str) -> str | None:
        return f"admission_admit({key}, {todo}, {params}::jsonb)"  # migration 0010

    def fast_params(self, endpoint_id: UUID) -> Any:
        return _windows_for(endpoint_id)

    def fast_report(self, verdict: dict[str, Any]) -> dict[str, Any] | None:
        if "policy" not in verdict:  # the policy was cleared since the probe
            return None
        limit = verdict["max_claims_per_window"]
        used = verdict["used"]
        resets = verdict["window_resets_at"]
        stacked = []
        if limit is not None:
            stacked.append((limit, used, verdict["window_start"], resets))
        stacked += [
            (m["limit"], m["used"], m["window_start"], m["window_resets_at"])
            for m in verdict.get("more") or ()
        ]
        return {
            "max_in_flight": verdict["max_in_flight"],
            "in_flight": verdict["in_flight"] + 1,
            "max_claims_per_window": limit,
            "used": None if used is None else used + 1,
            "remaining": None if limit is None else max(0, limit - used - 1),
            "window_resets_at": datetime.fromisoformat(resets) if resets else None,
            "posture": verdict["posture"],
            "windows": [
                {
                    "limit": n,
                    "used": spent + 1,
                    "remaining": max(0, n - spent - 1),
                    "window_start": datetime.fromisoformat(start),
                    "window_resets_at": datetime.fromisoformat(end),
                }
                for n, spent, start, end in stacked
            ],
        }


# The fast path's window bounds per endpoint, computed in Python (zoneinfo over tzdata, as every
# other window here) and bound to admission_check (migration 0004): the current bounds of each
# window definition the endpoint's budgets use (first and stacked windows alike), keyed by the
# definition as admission_verdict formats it (migration 0009), so ten budgets with one window
# definition share one entry. Only a hint: the function looks up its policy's own definitions
# and compares the clock with their bounds, answering "stale" (the locked path) when one is
# missing or no longer holds, so a cache a second old is never wrong, only slower.
_FAST_TTL_SECONDS = 1.0
_fast_windows: dict[UUID, tuple[float, datetime | None, str]] = {}


def _window_cfg(policy: engine.PolicyRow) -> str:
    """The window definition as admission_check formats it (NULL as empty)."""
    parts = (policy.window_period, policy.window_tz, policy.window_start, policy.window_weekday)
    return "|".join("" if part is None else str(part) for part in parts)


def _windows_for(endpoint_id: UUID) -> str:
    now = timezone.now()
    cached = _fast_windows.get(endpoint_id)
    if cached is not None:
        expires, resets, text = cached
        if time.monotonic() < expires and (resets is None or now < resets):
            return text
    with connection.cursor() as cursor:
        policies = engine.policy_rows(
            cursor, "endpoint_id = %s AND max_claims_per_window IS NOT NULL", [endpoint_id]
        )
    found: dict[str, dict[str, str]] = {}
    earliest: datetime | None = None
    for policy in policies:
        current = engine.bounds(policy, now)
        if current is None:  # unavailable: the locked path fails closed and says why
            continue
        stacked: engine.Bounds = {}
        if policy.extra_windows:
            stacked = engine.all_bounds(policy, now) or {}
        windows = {_window_cfg(policy): current}
        windows.update(
            (item.window.key, stacked[item.key])
            for item in policy.window_limits()
            if item.key != PRIMARY_WINDOW_KEY and item.key in stacked
        )
        for cfg, (start, end) in windows.items():
            found[cfg] = {"ws": start.isoformat(), "resets": end.isoformat()}
            earliest = end if earliest is None else min(earliest, end)
    text = json.dumps(found)
    _fast_windows[endpoint_id] = (time.monotonic() + _FAST_TTL_SECONDS, earliest, text)
    return text


def _jsonable(value: Any) -> Any:
    """A deferral's details travel as JSON (REST, MCP): datetimes as ISO text."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return iso(value) if isinstance(value, datetime) else value


def _append_waiver(decision: engine.Decision, actor: Any, todo: Any) -> None:
    """A claim admitted over a limit by the advise posture: the ledger keeps who and why."""
    ev = decision.evaluation
    append_claim_waiver(
        kind=LedgerKind.ADMISSION_WAIVER,
        actor=actor,
        todo=todo,
        posture=ev.policy.posture,
        reason=ev.reason,
        exceeded=ev.exceeded,
        in_flight=ev.in_flight,
        max_in_flight=ev.policy.max_in_flight,
        used=ev.used,
        max_claims_per_window=ev.policy.max_claims_per_window,
        window_start=ev.window_start.isoformat() if ev.window_start else None,
        # Every stacked window the claim went over, not only the first: its definition, limit,
        # counter before this claim and the start of the window it was charged in.
        windows_exceeded=[
            {
                "key": u.key,
                "period": u.period,
                "tz": u.tz,
                "start": u.start,
                "weekday": u.weekday,
                "limit": u.limit,
                "used": u.used,
                "window_start": u.window_start.isoformat(),
                "binding": u is ev.binding,
            }
            for u in ev.windows
            if u.exhausted
        ],
    )


def register() -> None:
    gates.register(BudgetGate())
