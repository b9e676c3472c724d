"""Reads of admission state, shared by the board, the API, MCP, the CLI, wakes and /metrics.

Deferral is derived on read from the policy, the counters and now; it is never stored on todos.
The arithmetic is ``admission.engine.evaluate``, the same the claim applies under the lock.

Who may read what: an owner reads the budgets of their own endpoints' queues, a superuser and an
auditor read all; an agent reads its own endpoint's scoped queues. A foreign or unknown endpoint
is ``not_found`` alike.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import date, datetime, time, timedelta, tzinfo
from typing import Any
from uuid import UUID

from django.contrib.postgres.aggregates import ArrayAgg
from django.db import connection
from django.db.models import Q, QuerySet, Sum
from django.utils import timezone

from admission import engine, windows
from admission.models import PRIMARY_WINDOW_KEY, AdmissionPolicy, AdmissionWindow, DeferralReason
from admission.policy import PolicySpec
from queues import access
from queues.access import Actor, AgentActor, HumanActor
from queues.models import QUARANTINE_QUEUE, Endpoint, check_queue_name
from queues.sql import gated
from switchboard.core import versions
from switchboard.core.errors import InvalidArgument, NotFound
from switchboard.ledger import chain as ledger
from switchboard.ledger.models import LedgerEntry

HISTORY_WINDOWS = 30
AUDIT_TAIL = 50


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
        extra_windows=policy.extra_windows,
    )


# --- evaluation ---------------------------------------------------------------------------------


def evaluate_rows(
    rows: Iterable[engine.PolicyRow],
    now: datetime | None = None,
    *,
    counted_under: dict[UUID, dict[str, list[str]]] | None = None,
) -> dict[UUID, engine.Evaluation]:
    """Evaluate policy rows at ``now`` in one statement: each row's usage from admission_usage
    (migration 0005), the query the claim reads under the policy lock.

    The one place every read surface evaluates budgets (status, reopen, the budget preview of a
    definition not yet saved, the board, /metrics), so none of them can disagree with the claim.
    A row's window counter is its policy's (a row whose id is no policy's has used nothing).
    ``counted_under``: by row id, window keys read from other stored keys, summed (the preview
    of a save that moves counters: ``services.counters_after_save``)."""
    now = now or timezone.now()
    rows = list(rows)
    if not rows:
        return {}
    current = [engine.all_bounds(row, now) for row in rows]
    first = [(b or {}).get(PRIMARY_WINDOW_KEY) for b in current]
    # The stacked windows' counters (after the first): (row index, key, window start).
    more = [
        (i, key, start)
        for i, b in enumerate(current)
        for key, (start, _) in (b or {}).items()
        if key != PRIMARY_WINDOW_KEY
    ]
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT u.in_flight, u.earliest_lease, u.used
            FROM unnest(%s::uuid[], %s::text[], %s::uuid[], %s::timestamptz[])
                 WITH ORDINALITY AS k(endpoint_id, queue, policy_id, ws, n)
            CROSS JOIN LATERAL admission_usage(k.endpoint_id, k.queue, k.policy_id, k.ws, NULL) u
            ORDER BY k.n
            """,
            [
                [row.endpoint_id for row in rows],
                [row.queue for row in rows],
                [row.id for row in rows],
                [b[0] if b is not None else None for b in first],
            ],
        )
        usage = cursor.fetchall()
        more_used: list[dict[str, int]] = [{} for _ in rows]
        if more:
            cursor.execute(
                """
                SELECT (admission_windows_used(k.policy_id, ARRAY[k.key], ARRAY[k.ws]))[1]
                FROM unnest(%s::uuid[], %s::text[], %s::timestamptz[])
                     WITH ORDINALITY AS k(policy_id, key, ws, n)
                ORDER BY k.n
                """,
                [
                    [rows[i].id for i, _, _ in more],
                    [k for _, k, _ in more],
                    [w for _, _, w in more],
                ],
            )
            for (i, key, _), (n,) in zip(more, cursor.fetchall(), strict=True):
                more_used[i][key] = n
        first_used: dict[int, int] = {}
        for i, row in enumerate(rows):
            bounds = current[i]
            for key, stored in ((counted_under or {}).get(row.id) or {}).items():
                if bounds is None or key not in bounds:
                    continue
                cursor.execute(
                    "SELECT coalesce(sum(n), 0)::integer"
                    " FROM unnest(admission_windows_used(%s, %s::text[], %s::timestamptz[])) n",
                    [row.id, stored, [bounds[key][0]] * len(stored)],
                )
                (n,) = cursor.fetchone()
                if key == PRIMARY_WINDOW_KEY:
                    first_used[i] = n
                else:
                    more_used[i][key] = n
        # A cap lowered below what is held frees a slot only once enough leases have lapsed
        # (``engine.frees_at``: a statement for such a row only).
        freed = [
            (n, engine.frees_at(cursor, row, in_flight=n, earliest=earliest), used)
            for row, (n, earliest, used) in zip(rows, usage, strict=True)
        ]
    out: dict[UUID, engine.Evaluation] = {}
    for i, (row, b, cur, extra, (n, earliest, used)) in enumerate(
        zip(rows, first, current, more_used, freed, strict=True)
    ):
        used = first_used.get(i, used)
        out[row.id] = engine.evaluate(
            row,
            in_flight=n,
            used_in={b[0]: used} if b is not None else {},
            now=now,
            earliest_lease_expiry=earliest,
            window=b,
            more_used=extra,
            current=cur,
        )
    return out


def evaluate_policies(
    policies: Iterable[AdmissionPolicy], now: datetime | None = None
) -> dict[UUID, engine.Evaluation]:
    return evaluate_rows((policy_row(p) for p in policies), now)


def evaluate_policy(policy: AdmissionPolicy, now: datetime | None = None) -> engine.Evaluation:
    return evaluate_policies([policy], now)[policy.id]


def _evaluate_identity(**lookup: Any) -> engine.Evaluation | None:
    policy = AdmissionPolicy.objects.filter(**lookup).first()
    return evaluate_policy(policy) if policy is not None else None


def deferred_among(endpoint_id: UUID, queues: list[str]) -> list[engine.Evaluation]:
    """The unlocked pre-read for claim_next: the granted queues that are exhausted now,
    whichever todo is picked (window spent, a limit of 0, or a policy that cannot be evaluated).
    A full in-flight cap is left to the claim under the lock, because taking over a lapsed claim
    of the same queue is admitted. Read without locks, so it may be a moment stale; the claim
    under the policy lock remains the decision, and excluded queues are read again on every
    call.

    Read with SQL of its own, not the ORM: an agent polling a spent budget runs this on every
    claim_next, and compiling the ORM's query cost more CPU than PostgreSQL spent answering it."""
    with connection.cursor() as cursor:
        rows = engine.policy_rows(
            cursor, "endpoint_id = %s AND queue = ANY(%s) ORDER BY queue", [endpoint_id, queues]
        )
    evaluations = evaluate_rows(rows)
    return [
        ev
        for ev in evaluations.values()
        if not ev.admits and ev.reason != DeferralReason.IN_FLIGHT_FULL
    ]


def identity_admitted(policy_id: UUID) -> bool:
    """Whether a claim on this policy's queue identity would be admitted now (for wake gating)."""
    ev = _evaluate_identity(pk=policy_id)
    return ev is None or ev.admits


def identity_status(endpoint_id: UUID, queue: str) -> engine.Evaluation | None:
    """The evaluation of one queue identity now, or None when it has no policy."""
    return _evaluate_identity(endpoint_id=endpoint_id, queue=queue)


def status(ev: engine.Evaluation) -> dict[str, Any]:
    """The derived status of a queue identity: {state, reason, next_eligible_at, exact, window}
    (``window``: the binding window of a window_exhausted deferral, else null)."""
    if ev.admits:
        return dict(ADMITTED)
    return {
        "state": "deferred",
        "reason": ev.reason,
        "next_eligible_at": ev.next_eligible_at,
        "exact": ev.exact,
        "window": binding_window(ev),
    }


def binding_window(ev: engine.Evaluation) -> dict[str, Any] | None:
    """The window that holds a window_exhausted claim until next_eligible_at (the exhausted
    window that resets last), as every deferral names it; None for any other reason."""
    if ev.reason != DeferralReason.WINDOW_EXHAUSTED or ev.binding is None:
        return None
    return window_use_out(ev, ev.binding)


def window_use_out(ev: engine.Evaluation, use: engine.WindowUse) -> dict[str, Any]:
    """One window as every surface shows it: its figures, its counter key, and whether it is
    the window that binds the deferral."""
    return {**use.out(), "key": use.key, "binding": use is ev.binding}


ADMITTED: dict[str, Any] = {
    "state": "admitted",
    "reason": None,
    "next_eligible_at": None,
    "exact": True,
}


def usage(ev: engine.Evaluation) -> dict[str, Any]:
    """Headroom now: limits, in-flight, the window's use and when it resets."""
    return {
        "max_in_flight": ev.policy.max_in_flight,
        "in_flight": ev.in_flight,
        "max_claims_per_window": ev.policy.max_claims_per_window,
        "used": ev.used,
        "remaining": ev.headroom()["remaining"],
        "window_start": ev.window_start,
        "window_resets_at": ev.window_resets_at,
        "over_limit": ev.over_limit,
        "windows": [window_use_out(ev, u) for u in ev.windows],
    }


def pending_count(endpoint_id: UUID, queue: str) -> int:
    """How much work a hold on a queue identity keeps back (a deferral's ``pending``): its
    claimable todos, a lapsed claim or a due retry as much as a pending one
    (``gated.claimable_counts``; a refused claim_next asks it each time)."""
    with connection.cursor() as cursor:
        return gated.claimable_counts(cursor, endpoint_id, [queue]).get(queue, 0)


def deferred_entry(ev: engine.Evaluation, endpoint_id: UUID) -> dict[str, Any]:
    """One item of claim_next's ``deferred`` list."""
    return {
        "queue": ev.policy.queue,
        "reason": ev.reason,
        "pending": pending_count(endpoint_id, ev.policy.queue),
        "next_eligible_at": ev.next_eligible_at,
        "exact": ev.exact,
        "window": binding_window(ev),
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


# --- the policy as every surface shows it -------------------------------------------------------


def policy_dict(policy: AdmissionPolicy) -> dict[str, Any]:
    """The canonical policy: what the ledger records as before/after, and what verify compares."""
    return PolicySpec.of(policy).audited(policy.endpoint_id)


def policy_version(policy: AdmissionPolicy | None) -> str:
    """The budget's version (``switchboard.core.versions``): a digest of its definition
    (``policy_dict``). The API's entity tag and the console's check that a save applies the
    change its preview showed; ``versions.ABSENT`` when there is none."""
    if policy is None:
        return versions.ABSENT
    return versions.digest(policy_dict(policy))


def describe_window(policy: AdmissionPolicy) -> str | None:
    if policy.window_period is None:
        return None
    try:
        return windows.describe(policy)
    except windows.WindowUnavailable:
        return None


def policy_out(policy: AdmissionPolicy) -> dict[str, Any]:
    """The policy for the API, MCP, the CLI and the board: the canonical fields and who/when."""
    d = policy_dict(policy)
    if d["window"] is not None:
        d["window"]["description"] = describe_window(policy)
    for item in d["windows"]:
        spec = windows.Window(item["period"], item["tz"], item["start"], item["weekday"])
        try:
            item["description"] = windows.describe(spec)
        except windows.WindowUnavailable:
            item["description"] = None
    endpoint = policy.endpoint
    return {
        "scope": f"endpoint:{endpoint.slug}",
        "endpoint": endpoint.slug,
        **d,
        "created_at": policy.created_at,
        "updated_at": policy.updated_at,
        "updated_by": policy.updated_by.get_username() if policy.updated_by_id else "",
        "version": policy_version(policy),
    }


def policy_status_out(policy: AdmissionPolicy, ev: engine.Evaluation) -> dict[str, Any]:
    return {"policy": policy_out(policy), "status": status(ev), "usage": usage(ev)}


# --- who may read and change which budgets ------------------------------------------------------


# What ``parse_scope`` takes, as a pattern (the OpenAPI document's, for the path's scope).
SCOPE_RE = r"^endpoint:[^\x00]+$"


def parse_scope(scope: str) -> str:
    """The endpoint reference in ``endpoint:<slug-or-id>``."""
    kind, sep, ref = (scope or "").partition(":")
    if not sep or kind != "endpoint" or not ref or "\x00" in ref:
        raise InvalidArgument("scope must be endpoint:<slug-or-id>", field="scope")
    return ref


def _endpoint_by_ref(ref: str) -> Endpoint | None:
    """An id-shaped reference is an id, always (slugs are never UUID-shaped; see check_slug),
    so a reference cannot land on another endpoint whose slug happens to spell it."""
    qs = Endpoint.objects.select_related("owner")
    try:
        as_id = uuid.UUID(ref)
    except ValueError:
        return qs.filter(slug=ref).first()
    return qs.filter(id=as_id).first()


def endpoint_for(actor: Actor, endpoint: Endpoint | str, *, write: bool) -> Endpoint:
    """The endpoint a budget read or write names, if the actor may see it; else not_found.

    ``endpoint`` is an Endpoint, a ``endpoint:<slug-or-id>`` scope, or a bare slug or id. Writes
    are refused to auditors (forbidden: they read and change nothing).
    """
    if isinstance(endpoint, Endpoint):
        found: Endpoint | None = endpoint
    else:
        ref = parse_scope(endpoint) if endpoint.startswith("endpoint:") else endpoint
        found = _endpoint_by_ref(ref)
    missing = NotFound("no such endpoint", scope=_scope_text(endpoint))
    if found is None:
        raise missing
    access.check_endpoint(
        actor,
        found,
        write=write,
        missing=missing,
        forbidden="auditors read budgets; they do not change them",
    )
    return found


def _scope_text(endpoint: Endpoint | str) -> str:
    if isinstance(endpoint, Endpoint):
        return f"endpoint:{endpoint.slug}"
    return endpoint if endpoint.startswith("endpoint:") else f"endpoint:{endpoint}"


def visible_policies(actor: Actor) -> QuerySet[AdmissionPolicy]:
    qs = AdmissionPolicy.objects.select_related("endpoint", "updated_by").order_by(
        "endpoint__slug", "queue"
    )
    return qs.filter(access.endpoint_q(actor))


def policies_with_status(
    actor: Actor, *, endpoint: Endpoint | None = None, queue: str | None = None
) -> list[dict[str, Any]]:
    """``GET /api/v1/admission`` and ``queue budget show``: each visible policy, status, usage."""
    qs = visible_policies(actor)
    if endpoint is not None:
        qs = qs.filter(endpoint=endpoint)
    if queue is not None:
        qs = qs.filter(queue=queue)
    policies = list(qs)
    evaluations = evaluate_policies(policies)
    return [policy_status_out(p, evaluations[p.id]) for p in policies]


def policy_get(actor: Actor, endpoint: Endpoint | str, queue: str) -> AdmissionPolicy:
    """One policy the actor may read; a missing policy is not_found like a foreign endpoint. A
    queue no name can be is refused naming it, as a write's is (it was looked up, not found)."""
    check_queue_name(queue)
    found = endpoint_for(actor, endpoint, write=False)
    policy = (
        AdmissionPolicy.objects.select_related("endpoint", "updated_by")
        .filter(endpoint=found, queue=queue)
        .first()
    )
    if policy is None:
        raise NotFound(
            f"no budget on endpoint:{found.slug}/{queue}",
            scope=f"endpoint:{found.slug}",
            queue=queue,
        )
    return policy


def window_history(
    policy: AdmissionPolicy, limit: int = HISTORY_WINDOWS, *, key: str | None = None
) -> list[dict[str, Any]]:
    """The last ``limit`` windows, newest first: used, refused and the limit then in force
    (of one window limit when ``key`` names its counter)."""
    qs = AdmissionWindow.objects.filter(policy=policy)
    if key is not None:
        qs = qs.filter(window_key=key)
    # A window's counters are its shard rows summed (migration 0007); its limit is the one the
    # latest charge or refusal recorded.
    rows = (
        qs.values("window_key", "window_start")
        .annotate(
            total_used=Sum("used"),
            total_refused=Sum("refused"),
            limits=ArrayAgg("claims_limit", order_by=("-updated_at", "-shard")),
        )
        .order_by("-window_start", "window_key")[:limit]
    )
    return [
        {
            "window_key": w["window_key"],
            "window_start": w["window_start"],
            "used": w["total_used"],
            "refused": w["total_refused"],
            "limit": w["limits"][0],
        }
        for w in rows
    ]


def audit_tail(policy: AdmissionPolicy, limit: int = AUDIT_TAIL) -> list[dict[str, Any]]:
    """Ledger rows of this scope and queue, newest first (policy changes and waivers)."""
    rows = LedgerEntry.objects.filter(
        scope=f"endpoint:{policy.endpoint.slug}", queue=policy.queue
    ).order_by("-seq")[:limit]
    return [ledger_row_out(r) for r in rows]


def ledger_row_out(row: LedgerEntry) -> dict[str, Any]:
    return {
        "seq": row.seq,
        "kind": row.kind,
        "at": row.at,
        "actor_human": row.actor_human_name or None,
        "actor_endpoint": row.actor_endpoint_slug or None,
        "scope": row.scope,
        "queue": row.queue,
        "before": row.before,
        "after": row.after,
        "entry_hash": row.entry_hash,
    }


def policy_detail(actor: Actor, endpoint: Endpoint | str, queue: str) -> dict[str, Any]:
    """``GET /api/v1/admission/{scope}/{queue}``: the policy, status, last windows, audit tail."""
    policy = policy_get(actor, endpoint, queue)
    ev = evaluate_policy(policy)
    return {
        **policy_status_out(policy, ev),
        "windows": window_history(policy),
        "audit": audit_tail(policy),
    }


def admission_status(actor: AgentActor, queue: str | None = None) -> list[dict[str, Any]]:
    """The agent's ``admission_status``: each scoped queue (or one), with its budget if any.

    An out-of-scope queue is forbidden, as for claim_next.
    """
    endpoint = actor.endpoint
    queues = [q for q in endpoint.scope_queues if q != QUARANTINE_QUEUE]
    if queue is not None:
        access.check_scope(actor, queue)
        queues = [queue]
    policies = {
        p.queue: p
        for p in AdmissionPolicy.objects.select_related("endpoint", "updated_by").filter(
            endpoint=endpoint, queue__in=queues
        )
    }
    evaluations = evaluate_policies(policies.values())
    out = []
    for q in queues:
        p = policies.get(q)
        if p is None:
            out.append({"queue": q, "policy": None, "status": dict(ADMITTED), "usage": None})
        else:
            ev = evaluations[p.id]
            out.append(
                {"queue": q, "policy": policy_out(p), "status": status(ev), "usage": usage(ev)}
            )
    return out


def visible_ledger(actor: HumanActor) -> QuerySet[LedgerEntry]:
    """Auditors and superusers read every row; owners the rows of their endpoints' scopes and
    the pauses of the queue names those endpoints drain (the board, the ledger page, the CSV)."""
    return LedgerEntry.objects.filter(access.ledger_q(actor))


def ledger_rows(
    *,
    actor: HumanActor,
    scope: str | None = None,
    queue: str | None = None,
    actor_name: str | None = None,
    kind: str | None = None,
    since: date | None = None,
    until: date | None = None,
    tz: tzinfo | None = None,
) -> QuerySet[LedgerEntry]:
    """Ledger rows the actor may read, newest first, filtered; dates are whole days in ``tz``."""
    qs = visible_ledger(actor)
    if scope:
        qs = qs.filter(scope=scope.strip())
    if queue:
        qs = qs.filter(queue=queue.strip())
    if actor_name:
        name = actor_name.strip()
        qs = qs.filter(Q(actor_human_name__iexact=name) | Q(actor_endpoint_slug__iexact=name))
    if kind:
        qs = qs.filter(kind=kind)
    zone = tz or timezone.get_current_timezone()
    if since:
        qs = qs.filter(at__gte=datetime.combine(since, time.min, tzinfo=zone))
    if until and until < date.max:  # to the last day Python holds is to no end at all
        qs = qs.filter(at__lt=datetime.combine(until + timedelta(days=1), time.min, tzinfo=zone))
    return qs.order_by("-seq")


def chain_badge(actor: HumanActor) -> dict[str, Any]:
    """The ledger page's badge: the last stored verification (the beat task's, or one asked
    for), never a full verify per page view, as this human may read it. Owners see whether the
    chain holds and their own budgets' drift; auditors and superusers also the fleet's row count
    and where it breaks."""
    stored = ledger.last_check()
    report = stored.report
    problem = report["chain"]["problem"]
    detail = ""
    if problem is not None:
        where = f"seq {problem['seq']}: " if problem["seq"] else ""
        detail = f"{where}{problem['problem']}. {problem['detail']}"
    elif report["drift"]:
        detail = "; ".join(f"{d['policy']}: {d['problem']}" for d in report["drift"][:3])
    drift = report["drift"]
    if not actor.sees_all:
        mine = {
            f"endpoint:{slug}/"
            for slug in access.visible_endpoints(actor).values_list("slug", flat=True)
        }
        drift = [d for d in drift if any(d["policy"].startswith(prefix) for prefix in mine)]
    return {
        "ok": stored.ok if actor.sees_all else (problem is None and not drift),
        "rows": report["rows"] if actor.sees_all else None,
        "chain_ok": problem is None,
        "drift": len(drift),
        "checked_at": stored.checked_at,
        "detail": detail if actor.sees_all else "",
    }
