"""The board's reads: who sees which queue identities, and what each section shows.

A section is one queue identity ``(endpoint, queue)``. Everything it shows comes from the shared
selectors: counts per identity (``identity_counts`` here, the per-identity sibling of
``queues.selectors.queue_stats``), cards from ``queues.selectors.todos_for``, the chip of a
waiting todo from ``queues.selectors.admission_for`` (a budget) or from the named limits' claim
gates (``queues.gates``: their skips say which todos they hold, their ``explain`` why and until
when, as on the todo's page), the budget strip from
``admission.selectors.evaluate_policies`` / ``status`` / ``usage``, the pause from
``queues.selectors.pauses_of`` (written only by ``queues.pauses``). The pages
(``switchboard/console/views.py``) and the live stream (``switchboard/console/live.py``) both
render these sections, so they cannot disagree.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from typing import Any
from uuid import UUID

from django.db import connection, models
from django.db.models import F, Q, QuerySet, Window
from django.db.models.expressions import RawSQL
from django.db.models.functions import RowNumber
from django.http import QueryDict

from admission import engine
from admission import selectors as admission_selectors
from admission.limits.gates import QUARANTINED, PoolGate, RateGate, TagGate
from admission.models import AdmissionPolicy
from queues import access, conditions, gates, selectors, sql
from queues.access import Viewer, visible_endpoints
from queues.conditions import Condition
from queues.declared import UNDECLARED
from queues.gates import GateState
from queues.models import (
    QUARANTINE_QUEUE,
    Endpoint,
    EndpointState,
    Todo,
    TodoState,
)
from queues.sql import activity as activity_sql
from switchboard.core.errors import InvalidArgument
from switchboard.core.pages import identity_key
from switchboard.core.zones import zone_named

CARD_LIMIT = 20
# Past this many sections the board folds healthy ones to a line each (trouble stays in full),
# and a section shows at most FLEET_CARD_LIMIT cards ("Show only this queue" shows a page).
FOLD_AFTER = 12
FLEET_CARD_LIMIT = 6
# Cards in a section: held work first, then waiting, then the rest.
CARD_ORDER = (
    TodoState.CLAIMED,
    TodoState.PENDING,
    TodoState.FAILED,
    TodoState.DONE,
    TodoState.DISCARDED,
)
PAGE_LIMIT = 50
# ``TodoState.values`` builds a new list on every read; the board reads it once per identity.
TODO_STATES: tuple[str, ...] = tuple(TodoState.values)

# The board's state filter: "live" (claimed, then pending) is the default.
STATE_CHOICES: tuple[tuple[str, str], ...] = (
    ("live", "live (claimed and pending)"),
    (TodoState.PENDING, "pending"),
    (TodoState.CLAIMED, "claimed"),
    (TodoState.FAILED, "failed"),
    ("dead_letter", "dead letter"),
    (TodoState.DONE, "done"),
    (TodoState.DISCARDED, "discarded"),
)

# What a refusal reason reads as on a chip and in the strip: the words of queues.conditions; a
# named limit's (its claim gate's reasons), the condition's "Deferred" and which hold it is.
REASON_TEXT: dict[str, str] = {
    **{reason: condition.label for reason, condition in conditions.BY_REASON.items()},
    PoolGate.reason: "Deferred · pool full",
    TagGate.reason: "Deferred · tag limit full",
    RateGate.reason: "Deferred · rate limit reached",
    QUARANTINED: "Deferred · limit quarantined",
    UNDECLARED: "Deferred · limit not declared",
}
# A named limit's hold in a section's head, after the limit's kind and name.
HOLD_TEXT: dict[str, str] = {
    PoolGate.reason: "full",
    TagGate.reason: "full",
    RateGate.reason: "used up this minute",
    QUARANTINED: "quarantined (0): an operator must raise its limit",
    UNDECLARED: "not declared: an operator must declare it",
}
# Forever (a hold only an operator ends) outranks any instant, as in ``Explanation.binding``.
_FOREVER = datetime.max.replace(tzinfo=UTC)
# The todo row as the gates' SQL fragments name it in an ORM query over the todos.
_TODO = Todo._meta.db_table


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
    condition: str = ""
    q: str = ""  # search: a todo's title, id or payload text

    @classmethod
    def from_query(cls, query: QueryDict) -> Filters:
        """The filters a query asks for, or ``invalid_argument`` naming the first it cannot be:
        dropping one would widen what the board shows, and what a bulk action changes."""
        endpoint = query.get("endpoint", "").strip()
        queue = query.get("queue", "").strip()
        state = query.get("state", "live").strip() or "live"
        condition = query.get("condition", "").strip()
        q = query.get("q", "").strip()
        # A bulk action's own check of its selection, then the board's one filter more.
        selectors.Selection(endpoint=endpoint, queue=queue, state=state, q=q).check()
        if condition and condition not in Condition.values:
            choices = ", ".join(Condition.values)
            raise InvalidArgument(f"condition must be one of {choices}", field="condition")
        return cls(
            endpoint=endpoint,
            queue=queue,
            state=state,
            cursor=query.get("cursor", ""),
            condition=condition,
            q=q,
        )

    @property
    def retry_query(self) -> str:
        """The bulk retry's selection: the failed todos of what these filters select. A state
        that holds none (live, the default) sent "Retry the failed ones…" to a page with nothing
        to retry while the section counted failed todos."""
        if self.state in (TodoState.FAILED, "dead_letter"):
            return self.query()
        return self.query(state=TodoState.FAILED)

    def query(self, **changes: str) -> str:
        values = {
            "endpoint": self.endpoint,
            "queue": self.queue,
            "state": "" if self.state == "live" else self.state,
            "condition": self.condition,
            "q": self.q,
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

    @property
    def fields(self) -> list[tuple[str, str]]:
        """The filters as form fields (a confirmation form carries them back)."""
        query = QueryDict(self.query())
        return [(key, query[key]) for key in query]

    @property
    def state_label(self) -> str:
        return dict(STATE_CHOICES)[self.state]

    @property
    def condition_label(self) -> str:
        return Condition(self.condition).label if self.condition else ""


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
        entry = out.setdefault((endpoint_id, queue), IdentityCounts(dict.fromkeys(TODO_STATES, 0)))
        entry.counts[state] = count
        entry.dead_letter += dead
    return out


def limit_held(sections: list[Section]) -> set[tuple[UUID, str]]:
    """The identities among ``sections`` whose pending work named limits hold, every todo of it:
    none a claim could take now (``queues.selectors.claimable_identities``). One query; a paused queue's work waits
    for its resume, not a limit, and the quarantine queue's for nothing."""
    asked = {
        (s.endpoint.id, s.queue)
        for s in sections
        if s.counts.get(TodoState.PENDING) and s.pause is None and not s.quarantine
    }
    waiting = selectors.claimable_identities(asked)
    return {(e, q) for e, q in asked if (str(e), q) not in waiting}


# --- sections ----------------------------------------------------------------------------------


@dataclass
class LimitHold:
    """A named limit holding some of a section's waiting cards: what the todo's page says of it
    (``GateState``, the binding gate of each card), and how many of the cards shown it holds."""

    state: GateState
    noun: str  # the limit's kind as its refusals name it: "pool", "tag", "rate limit"
    cards: int = 0

    @property
    def names(self) -> str:
        return ", ".join(self.state.limits)

    def shows(self, other: GateState) -> bool:
        """Whether ``other`` reads as this hold does in the head: the same gate, reason,
        limits and time (``detail``, the todo page's, may differ)."""
        mine = self.state
        return (mine.gate, mine.reason, mine.limits, mine.next_eligible_at, mine.exact) == (
            other.gate,
            other.reason,
            other.limits,
            other.next_eligible_at,
            other.exact,
        )

    @property
    def words(self) -> str:
        reason = self.state.reason or ""
        return HOLD_TEXT.get(reason, reason.replace("_", " "))


@dataclass
class Section:
    key: str
    endpoint: Endpoint
    queue: str
    counts: dict[str, int]
    dead_letter: int
    # Named limits hold every pending todo: nothing here can be claimed now (``limit_held``).
    limits_hold_all: bool = False
    policy: AdmissionPolicy | None = None
    evaluation: engine.Evaluation | None = None
    pause: selectors.PauseInfo | None = None
    cards: list[Todo] = field(default_factory=list)
    chips: dict[UUID, dict[str, Any]] = field(default_factory=dict)
    # The named limits holding the cards shown, each once (the head says which, and until when).
    holds: list[LimitHold] = field(default_factory=list)
    next_cursor: str | None = None
    total: int = 0  # todos the state filter matches (cards show at most a page of them)
    can_write_budget: bool = False
    can_act: bool = False
    # Healthy sections show as one line on a board of many; filters open them in full.
    collapsed: bool = False

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
    def failing(self) -> int:
        """Failed todos with a retry still to come (dead letters are counted apart)."""
        return self.counts.get(TodoState.FAILED, 0) - self.dead_letter

    @functools.cached_property
    def conditions(self) -> list[Condition]:
        found = conditions.of(
            quarantine=self.quarantine,
            paused=self.pause is not None,
            refusals=[status["reason"]]
            if (status := self.status) and status["state"] == "deferred"
            else [],
            failing=self.failing,
            dead_letter=self.dead_letter,
        )
        if self.limits_hold_all and Condition.DEFERRED_LIMIT not in found:
            # As a budget's refusal reads (``conditions.of``), worst first, never "Healthy".
            found = sorted(
                [*(c for c in found if c != Condition.HEALTHY), Condition.DEFERRED_LIMIT],
                key=conditions.RANK.__getitem__,
            )
        return found

    @property
    def condition(self) -> Condition:
        return self.conditions[0]

    @property
    def trouble(self) -> bool:
        return self.condition in conditions.TROUBLE

    @property
    def tone(self) -> str:
        return conditions.TONE[self.condition]

    @property
    def tone_label(self) -> str:
        """The condition in words, shown beside its colour; further conditions after it."""
        words = [c.label for c in self.conditions]
        ev = self.evaluation
        if self.condition == Condition.HEALTHY and ev is not None and ev.over_limit:
            words[0] += f" · over limit ({ev.policy.posture})"
        return words[0] + "".join(f" + {w.split(' · ')[0].lower()}" for w in words[1:])

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


@dataclass
class SummaryItem:
    condition: Condition
    count: int
    query: str  # the board's query string that shows just these identities

    @property
    def tone(self) -> str:
        return conditions.TONE[self.condition]


@dataclass
class BoardView:
    sections: list[Section]
    summary: list[SummaryItem]
    total: int  # identities before the condition filter and the search
    healthy: int  # of those shown, collapsed to one line
    any_condition_query: str  # the same filters without the condition
    # Every queue name of every identity, when neither the endpoint nor the queue filter narrowed
    # them (then they are the queue filter's choices, with no query of their own).
    queue_names: list[str] | None = None
    # Every visible endpoint, when the endpoint filter did not narrow them (the filter's choices).
    endpoints: list[Endpoint] | None = None
    # The beat's sweeps that stopped running (a worker or beat down): said above the fleet.
    late_sweeps: list[selectors.LateSweep] = field(default_factory=list)


def board_view(viewer: Viewer, filters: Filters, *, cards: bool = True) -> BoardView:
    """The board: every visible queue identity, trouble first, healthy ones on one line each
    (unless the filters ask for them), with the fleet summary counted before the condition filter
    and the search narrow it. A constant number of queries, however many sections."""
    endpoints, every = _all_sections(viewer, filters)
    every.sort(key=lambda s: (conditions.RANK[s.condition], s.endpoint.slug, s.queue))
    summary = _summary(every, filters)
    shown = [s for s in every if not filters.condition or filters.condition in s.conditions]
    if filters.q:
        hits = _search_hits(viewer, filters, [s.endpoint.id for s in shown])
        shown = [s for s in shown if (s.endpoint.id, s.queue) in hits]
        for s in shown:
            s.total = hits[(s.endpoint.id, s.queue)]
    # On a board of many, healthy sections fold to one line; any filter opens them in full.
    fold = len(every) > FOLD_AFTER and not (
        filters.condition or filters.q or filters.single_identity
    )
    for s in shown:
        s.collapsed = fold and not s.trouble
    if cards:
        limit = FLEET_CARD_LIMIT if fold else None
        _fill_cards(viewer, filters, [s for s in shown if not s.collapsed], limit=limit)
    return BoardView(
        sections=shown,
        summary=summary,
        total=len(every),
        healthy=sum(1 for s in shown if s.collapsed),
        any_condition_query=filters.query(condition=""),
        queue_names=None if filters.endpoint or filters.queue else sorted({s.queue for s in every}),
        endpoints=None if filters.endpoint else endpoints,
        late_sweeps=selectors.late_sweeps(),
    )


def sections(viewer: Viewer, filters: Filters, *, cards: bool = True) -> list[Section]:
    """The board's sections, narrowed by the filters (see ``board_view``)."""
    return board_view(viewer, filters, cards=cards).sections


def _summary(every: list[Section], filters: Filters) -> list[SummaryItem]:
    counts = dict.fromkeys(Condition, 0)
    for s in every:
        for c in s.conditions:
            counts[c] += 1
    # Failures are what an operator opens these for: their links show those cards.
    state = {Condition.DEAD_LETTERS: "dead_letter", Condition.FAILING: TodoState.FAILED}
    return [
        SummaryItem(c, n, filters.query(condition=c.value, q="", state=state.get(c, "")))
        for c, n in counts.items()
        if n or c == Condition.HEALTHY
    ]


def _all_sections(viewer: Viewer, filters: Filters) -> tuple[list[Endpoint], list[Section]]:
    """The visible endpoints (narrowed by the endpoint filter) and every section of theirs."""
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
    pause_of = selectors.pauses_of({q for _, q in pairs})
    out: list[Section] = []
    for endpoint, queue in pairs:
        c = counts.get((endpoint.id, queue)) or IdentityCounts(dict.fromkeys(TODO_STATES, 0))
        policy = policy_of.get((endpoint.id, queue))
        section = Section(
            key=identity_key(endpoint.slug, queue),
            endpoint=endpoint,
            queue=queue,
            counts=c.counts,
            dead_letter=c.dead_letter,
            policy=policy,
            evaluation=evaluations.get(policy.id) if policy else None,
            pause=pause_of.get(queue),
            can_write_budget=viewer.can_write_budget(endpoint, queue),
            can_act=viewer.can_act(endpoint),
        )
        section.total = shown_total(section, filters.state)
        out.append(section)
    held = limit_held(out)
    for section in out:
        section.limits_hold_all = (section.endpoint.id, section.queue) in held
    return endpoints, out


def _states(filters: Filters) -> list[str]:
    """The card states a filter shows; a search looks through every state unless one is chosen."""
    if filters.state == "live":
        return list(TodoState.values) if filters.q else [TodoState.CLAIMED, TodoState.PENDING]
    return [filters.state]


def _card_rows(viewer: Viewer, filters: Filters, endpoint_ids: list[UUID]) -> QuerySet[Todo]:
    """The todos the filters match on the given endpoints (state and search applied)."""
    return selectors.todos_matching(
        viewer.actor,
        endpoint_ids=endpoint_ids,
        queue=filters.queue,
        states=_states(filters),
        q=filters.q,
    )


def _search_hits(
    viewer: Viewer, filters: Filters, endpoint_ids: list[UUID]
) -> dict[tuple[UUID, str], int]:
    """How many todos match the search, per queue identity (one grouped query)."""
    rows = (
        _card_rows(viewer, filters, endpoint_ids)
        .order_by()
        .values_list("endpoint_id", "queue")
        .annotate(n=models.Count("id"))
    )
    return {(endpoint_id, queue): n for endpoint_id, queue, n in rows}


def _fill_cards(
    viewer: Viewer, filters: Filters, found: list[Section], *, limit: int | None = None
) -> None:
    """A page of cards per section: one query for every section (a window per identity and
    state), or ``todos_for``'s keyset pages when the board shows a single identity."""
    if not found:
        return
    limit = limit or (PAGE_LIMIT if filters.single_identity else CARD_LIMIT)
    states = _states(filters)
    if filters.single_identity and len(states) == 1 and not filters.q:
        s = found[0]
        s.cards, s.next_cursor = selectors.todos_for(
            actor=viewer.actor,
            endpoint=s.endpoint,
            queue=s.queue,
            state=states[0],
            limit=limit,
            cursor=filters.cursor or None,
        )
    else:
        by_key = {(s.endpoint.id, s.queue): s for s in found}
        order: dict[str, int] = {state: i for i, state in enumerate(CARD_ORDER)}
        # Only the identities shown in full: on a folded board their endpoints' other queues
        # (the one-line ones) would cost rows and model instances nobody sees.
        shown = RawSQL(
            activity_sql.SHOWN_IDENTITIES,
            ([s.endpoint.id for s in found], [s.queue for s in found]),
            output_field=models.BooleanField(),
        )
        rows = (
            _card_rows(viewer, filters, list({s.endpoint.id for s in found}))
            .alias(shown=shown)
            .filter(shown=True)
            # A card shows neither: decoding every card's JSON was a tenth of a large board.
            .defer("payload", "result")
            .annotate(
                rank=Window(
                    RowNumber(),
                    partition_by=[F("endpoint_id"), F("queue"), F("state")],
                    order_by=[F("created_at").asc(), F("id").asc()],
                )
            )
            .filter(rank__lte=limit)
            .order_by("created_at", "id")
        )
        for todo in rows:
            section = by_key.get((todo.endpoint_id, todo.queue))
            if section is not None:
                todo.endpoint = section.endpoint  # the one already read, not a join per card
                section.cards.append(todo)
        for s in found:
            s.cards.sort(key=lambda t: order[t.state])
            if limit < CARD_LIMIT:  # a board of many: a glimpse of each section, not a page
                del s.cards[limit:]
    # A waiting card's chip is its section's derived budget status (the API's ``admission``),
    # or the named limit that holds it, whichever binds (holds the longer, as the todo's page
    # says it).
    for s in found:
        status = s.status
        if status is not None:
            s.chips = {t.id: status for t in s.cards if t.state == TodoState.PENDING}
    _fill_limit_holds(found)


def _fill_limit_holds(found: list[Section]) -> None:
    """The chips of waiting cards a named limit holds, and each section's ``holds``.

    Only waiting cards that name a limit (a pool, tags, a rate limit) are asked, all in one
    query: each per-todo gate's skip (whether it holds the todo now, as claim_next passes it
    over) and probe (the limits the todo names). Then each gate's ``explain``, the todo page's
    read, once per distinct probe of the held ones, not once per card."""
    waiting = {
        t.id: (s, t)
        for s in found
        if s.pause is None and not s.quarantine
        for t in s.cards
        if t.state == TodoState.PENDING and (t.pool or t.tags or t.rate_limit)
    }
    per_todo = [(g, skip) for g in gates.gates() if g.per_todo and (skip := g.skip(_TODO))]
    if not waiting or not per_todo:
        return
    # How each kind's refusals name it ("pool gpu is at its limit"; "tag", "rate limit").
    nouns = {g.name: str(getattr(g, "noun", g.name.replace("_", " "))) for g, _ in per_todo}
    asked: dict[str, RawSQL] = {}
    for i, (gate, skip) in enumerate(per_todo):
        asked[f"key{i}"] = RawSQL(f"({gate.probe(_TODO)})::text", (), models.TextField())
        asked[f"held{i}"] = RawSQL(skip, (), models.BooleanField())
    rows = (
        Todo.objects.filter(id__in=list(waiting))
        .order_by()
        .annotate(**asked)
        .values_list("id", *asked)
    )
    said: dict[tuple[int, str], GateState | None] = {}
    for todo_id, *flags in rows:
        s, todo = waiting[todo_id]
        held: list[GateState] = []
        for i, (gate, _) in enumerate(per_todo):
            key, skipped = flags[2 * i], flags[2 * i + 1]
            if not skipped:
                continue
            if (i, key) not in said:
                said[(i, key)] = gate.explain(todo)
            state = said[(i, key)]
            if state is not None and state.holds:
                held.append(state)
        binding = selectors.Explanation(held).binding
        if binding is None or not _binds_over(binding, s.chips.get(todo_id)):
            continue
        noun = nouns[binding.gate]
        s.chips[todo_id] = {
            "state": "deferred",
            "reason": binding.reason,
            "next_eligible_at": binding.next_eligible_at,
            "exact": binding.exact,
            "limits": [{"kind": noun, "name": name} for name in binding.limits],
        }
        # One line per hold as the head shows it: explain's detail reads every limit a todo
        # names, so two todos one full tag holds differ there when they name other tags too.
        hold = next((h for h in s.holds if h.shows(binding)), None)
        if hold is None:
            hold = LimitHold(binding, noun)
            s.holds.append(hold)
        hold.cards += 1


def _binds_over(hold: GateState, budget: dict[str, Any] | None) -> bool:
    """Whether a named limit's hold outlasts the budget's deferral of the same todo (the later
    instant binds; one only an operator ends binds over any; on a tie the budget, first in lock
    order, as ``Explanation.binding``)."""
    if budget is None or budget.get("state") != "deferred":
        return True
    return (hold.next_eligible_at or _FOREVER) > (budget.get("next_eligible_at") or _FOREVER)


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
    # order_by(): the model's default ordering would make DISTINCT run over every todo's row.
    names.update(
        Todo.objects.filter(endpoint_id__in=ids)
        .order_by()
        .values_list("queue", flat=True)
        .distinct()
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
