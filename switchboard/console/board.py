"""The board's reads: who sees which queue identities, and what each section shows.

A section is one queue identity ``(endpoint, queue)``. Everything it shows comes from the shared
selectors: counts per identity (``identity_counts`` here, the per-identity sibling of
``queues.selectors.queue_stats``), cards from ``queues.selectors.todos_for``, the chip of a
waiting todo from ``queues.selectors.admission_for``, the budget strip from
``admission.selectors.evaluate_policies`` / ``status`` / ``usage``, the pause from ``QueuePause``
(written only by ``queues.pauses``). The pages (``switchboard/console/views.py``) and the live stream
(``switchboard/console/live.py``) both render these sections, so they cannot disagree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import tzinfo
from typing import Any
from uuid import UUID

from django.db import connection
from django.db.models import Q
from django.http import QueryDict

from admission import engine
from admission import selectors as admission_selectors
from admission.models import AdmissionPolicy, DeferralReason
from queues import access, selectors, sql
from queues.access import Viewer, visible_endpoints
from queues.models import (
    QUARANTINE_QUEUE,
    QUEUE_NAME_RE,
    Endpoint,
    EndpointState,
    QueuePause,
    Todo,
    TodoState,
)
from switchboard.core.pages import identity_key
from switchboard.core.zones import zone_named

CARD_LIMIT = 20
PAGE_LIMIT = 50

# The board's state filter: "live" (claimed, then pending) is the default.
STATE_CHOICES: tuple[tuple[str, str], ...] = (
    ("live", "live (claimed and pending)"),
    (TodoState.PENDING, "pending"),
    (TodoState.CLAIMED, "claimed"),
    (TodoState.FAILED, "failed"),
    ("dead_letter", "dead letter"),
    (TodoState.DONE, "done"),
)
STATE_VALUES = tuple(v for v, _ in STATE_CHOICES)

# What a refusal reason reads as on a chip and in the strip.
REASON_TEXT: dict[str, str] = {
    DeferralReason.WINDOW_EXHAUSTED: "budget",
    DeferralReason.IN_FLIGHT_FULL: "in flight full",
    DeferralReason.PAUSED: "held by a zero limit",
    DeferralReason.ADMISSION_UNAVAILABLE: "admission unavailable",
}


class Tone:
    """A section's condition, each with a text label and a colour (never colour alone)."""

    ADMITTED = "admitted"
    EXHAUSTED = "exhausted"
    PAUSED = "paused"
    UNAVAILABLE = "unavailable"
    QUARANTINE = "quarantine"


# --- the viewer --------------------------------------------------------------------------------


# --- filters -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Filters:
    endpoint: str = ""
    queue: str = ""
    state: str = "live"
    cursor: str = ""

    @classmethod
    def from_query(cls, query: QueryDict) -> Filters:
        endpoint = query.get("endpoint", "").strip()
        queue = query.get("queue", "").strip()
        state = query.get("state", "live").strip() or "live"
        if state not in STATE_VALUES:
            state = "live"
        if queue and not re.fullmatch(QUEUE_NAME_RE, queue):
            queue = ""
        return cls(endpoint=endpoint[:63], queue=queue, state=state, cursor=query.get("cursor", ""))

    def query(self, **changes: str) -> str:
        values = {
            "endpoint": self.endpoint,
            "queue": self.queue,
            "state": "" if self.state == "live" else self.state,
        }
        values.update(changes)
        q = QueryDict(mutable=True)
        for key, value in values.items():
            if value:
                q[key] = value
        return q.urlencode()

    @property
    def single_identity(self) -> bool:
        return bool(self.endpoint and self.queue)


# --- identities and counts ---------------------------------------------------------------------


@dataclass
class IdentityCounts:
    counts: dict[str, int]
    dead_letter: int = 0


def identity_counts(endpoint_ids: list[UUID]) -> dict[tuple[UUID, str], IdentityCounts]:
    """Counts by state per queue identity of the given endpoints (one grouped query)."""
    if not endpoint_ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(sql.IDENTITY_COUNTS_SQL, [endpoint_ids])
        rows = cursor.fetchall()
    out: dict[tuple[UUID, str], IdentityCounts] = {}
    for endpoint_id, queue, state, count, dead in rows:
        entry = out.setdefault(
            (endpoint_id, queue), IdentityCounts(dict.fromkeys(TodoState.values, 0))
        )
        entry.counts[state] = count
        entry.dead_letter += dead
    return out


# --- sections ----------------------------------------------------------------------------------


@dataclass
class Section:
    key: str
    endpoint: Endpoint
    queue: str
    counts: dict[str, int]
    dead_letter: int
    policy: AdmissionPolicy | None = None
    evaluation: engine.Evaluation | None = None
    pause: QueuePause | None = None
    cards: list[Todo] = field(default_factory=list)
    chips: dict[UUID, dict[str, Any]] = field(default_factory=dict)
    next_cursor: str | None = None
    total: int = 0  # todos the state filter matches (cards show at most a page of them)
    can_write_budget: bool = False
    can_act: bool = False

    @property
    def quarantine(self) -> bool:
        return self.queue == QUARANTINE_QUEUE

    @property
    def in_flight(self) -> int:
        return self.counts.get(TodoState.CLAIMED, 0)

    @property
    def status(self) -> dict[str, Any] | None:
        return admission_selectors.status(self.evaluation) if self.evaluation else None

    @property
    def usage(self) -> dict[str, Any] | None:
        return admission_selectors.usage(self.evaluation) if self.evaluation else None

    @property
    def tone(self) -> str:
        if self.quarantine:
            return Tone.QUARANTINE
        if self.pause is not None:
            return Tone.PAUSED
        ev = self.evaluation
        if ev is None or ev.admits:
            return Tone.ADMITTED
        if ev.reason == DeferralReason.ADMISSION_UNAVAILABLE:
            return Tone.UNAVAILABLE
        if ev.reason == DeferralReason.PAUSED:
            return Tone.PAUSED
        return Tone.EXHAUSTED

    @property
    def tone_label(self) -> str:
        """The condition in words, shown beside its colour."""
        tone = self.tone
        ev = self.evaluation
        if tone == Tone.QUARANTINE:
            return "Quarantine · never delivered"
        if tone == Tone.PAUSED and self.pause is not None:
            return "Paused"
        if tone == Tone.PAUSED:
            return "Held · a limit is 0"
        if tone == Tone.UNAVAILABLE:
            return "Unavailable · budget cannot be evaluated"
        if tone == Tone.EXHAUSTED and ev is not None:
            if ev.reason == DeferralReason.IN_FLIGHT_FULL:
                return "Deferred · in flight full"
            return "Exhausted · window used up"
        if ev is not None and ev.over_limit:
            return f"Admitted · over limit ({ev.policy.posture})"
        return "Admitted" if ev is not None else "Open · no budget"

    @property
    def announce(self) -> str:
        return f"{self.endpoint.slug} / {self.queue}: {self.tone_label}"

    @property
    def window_description(self) -> str | None:
        return admission_selectors.describe_window(self.policy) if self.policy else None

    @property
    def policy_zone(self) -> tzinfo | None:
        if self.policy is None or not self.policy.window_tz:
            return None
        name, zone = zone_named(self.policy.window_tz)
        return zone if name == self.policy.window_tz else None


def _identities(
    endpoints: list[Endpoint],
    counts: dict[tuple[UUID, str], IdentityCounts],
    policies: list[AdmissionPolicy],
    filters: Filters,
) -> list[tuple[Endpoint, str]]:
    """Each endpoint's scoped queues, plus any queue it has todos or a budget on."""
    by_id = {e.id: e for e in endpoints}
    names: dict[UUID, set[str]] = {
        e.id: set(e.scope_queues) for e in endpoints if e.state == EndpointState.ACTIVE
    }
    for endpoint_id, queue in counts:
        if endpoint_id in by_id:
            names.setdefault(endpoint_id, set()).add(queue)
    for p in policies:
        names.setdefault(p.endpoint_id, set()).add(p.queue)
    out = []
    for endpoint_id, queues in names.items():
        for queue in queues:
            if filters.queue and queue != filters.queue:
                continue
            out.append((by_id[endpoint_id], queue))
    out.sort(key=lambda pair: (pair[0].slug, pair[1] == QUARANTINE_QUEUE, pair[1]))
    return out


def sections(viewer: Viewer, filters: Filters, *, cards: bool = True) -> list[Section]:
    """The board: one section per visible queue identity, narrowed by the filters."""
    qs = visible_endpoints(viewer.actor)
    if filters.endpoint:
        qs = qs.filter(slug=filters.endpoint)
    endpoints = list(qs)
    ids = [e.id for e in endpoints]
    counts = identity_counts(ids)
    policies = list(admission_selectors.visible_policies(viewer.actor).filter(endpoint_id__in=ids))
    evaluations = admission_selectors.evaluate_policies(policies)
    policy_of = {(p.endpoint_id, p.queue): p for p in policies}
    pairs = _identities(endpoints, counts, policies, filters)
    pause_of = {
        p.queue: p
        for p in QueuePause.objects.select_related("paused_by").filter(
            queue__in={q for _, q in pairs}
        )
    }
    out: list[Section] = []
    for endpoint, queue in pairs:
        c = counts.get((endpoint.id, queue)) or IdentityCounts(dict.fromkeys(TodoState.values, 0))
        policy = policy_of.get((endpoint.id, queue))
        out.append(
            Section(
                key=identity_key(endpoint.slug, queue),
                endpoint=endpoint,
                queue=queue,
                counts=c.counts,
                dead_letter=c.dead_letter,
                policy=policy,
                evaluation=evaluations.get(policy.id) if policy else None,
                pause=pause_of.get(queue),
                can_write_budget=viewer.can_write_budget(endpoint) and queue != QUARANTINE_QUEUE,
                can_act=viewer.can_act(endpoint),
            )
        )
    if cards:
        _fill_cards(viewer, filters, out)
    return out


def _fill_cards(viewer: Viewer, filters: Filters, found: list[Section]) -> None:
    """Cards per section through ``todos_for``; one ``admission_for`` call for every chip."""
    limit = PAGE_LIMIT if filters.single_identity else CARD_LIMIT
    states = [TodoState.CLAIMED, TodoState.PENDING] if filters.state == "live" else [filters.state]
    every: list[Todo] = []
    for s in found:
        s.total = shown_total(s, filters.state)
        if not any(_count_for(s, state) for state in states):
            continue
        for state in states:
            rows, next_cursor = selectors.todos_for(
                actor=viewer.actor,
                endpoint=s.endpoint,
                queue=s.queue,
                state=state,
                limit=limit,
                cursor=filters.cursor if filters.single_identity and len(states) == 1 else None,
            )
            s.cards.extend(rows)
            if len(states) == 1:
                s.next_cursor = next_cursor
        every.extend(s.cards)
    chips = selectors.admission_for(every)
    for s in found:
        s.chips = {t.id: chips[t.id] for t in s.cards if t.id in chips}


def _count_for(section: Section, state: str) -> int:
    if state == "dead_letter":
        return section.dead_letter
    return section.counts.get(state, 0)


def shown_total(section: Section, state: str) -> int:
    """How many todos the filter matches in a section (for "showing 20 of 134")."""
    if state == "live":
        return section.counts.get(TodoState.CLAIMED, 0) + section.counts.get(TodoState.PENDING, 0)
    return _count_for(section, state)


def visible_queue_names(viewer: Viewer) -> list[str]:
    """Queue names for the filter: those the viewer's endpoints scope, hold todos or budgets on."""
    names: set[str] = set()
    endpoints = visible_endpoints(viewer.actor)
    for scope in endpoints.values_list("scope_queues", flat=True):
        names.update(scope)
    ids = list(endpoints.values_list("id", flat=True))
    names.update(
        Todo.objects.filter(endpoint_id__in=ids).values_list("queue", flat=True).distinct()
    )
    names.update(
        AdmissionPolicy.objects.filter(endpoint_id__in=ids).values_list("queue", flat=True)
    )
    return sorted(names)


def pause_fleet_view(viewer: Viewer) -> bool:
    """Whether the queue list shows the fleet (as ``GET /api/v1/queues`` does) or own queues."""
    return access.sees_fleet(viewer.actor)


def queue_list(viewer: Viewer) -> list[selectors.QueueStat]:
    """Every queue the viewer may see, with its counts and pause (``queue_stats``)."""
    return selectors.queue_overview(actor=viewer.actor)


def in_flight_on(queue: str) -> int:
    """Claimed todos on a queue name across the fleet: a pause's drain progress."""
    return Todo.objects.filter(Q(queue=queue) & Q(state=TodoState.CLAIMED)).count()
