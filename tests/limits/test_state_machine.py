"""Named limits under random interleavings (issue 13, item 12): a hypothesis state machine over
a pool, two tags and a rate limit. Its rules create todos naming them, make claims in two
long-lived child processes at once (each its own Django and database connection: their claims
race), complete, release, let leases lapse for the reaper, record 429s, change limits and
postures, and quarantine a pool or a tag, the last two optionally while both children claim.

After every step each function of ``INVARIANTS`` checks the world against the one before:
occupancy never rose above an enforce limit in force (pools, tags; a rate limit's claims per
wall-clock minute, bucket by bucket as the gate charged them, against the effective limit),
every claim over an advise limit left exactly one waiver naming that limit (exactly counted
wherever the step makes the count knowable, and never a waiver without an excess), every
admitted claim naming the rate limit was charged once, a quarantine expired exactly the
matching claims and its ledger row replays its manifest byte for byte, the ledger and the
limits verify (the chain from genesis, every grant against the limit then in force), and the
grants the ledger holds open are exactly the ones the todos hold.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db.models import F, Q
from django.utils import timezone
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from admission.limits import selectors
from admission.limits import services as limit_services
from admission.limits.models import RateMinute, RateObservation
from admission.limits.rates import effective_limit, minute_of, observe
from admission.limits.verify import limits_verify
from queues import services
from queues.models import Attempt, Todo, TodoState
from queues.services import sweeps
from switchboard.ledger import chain
from switchboard.ledger.models import LedgerEntry, LedgerKind
from tests.children import Child
from tests.children import children as started
from tests.conftest import Personas, every_attempt, lapse, push

OCCUPANCY = {"p": "pool", "a": "tag", "b": "tag"}  # the pool and tag limits, by name
RATE = "r"
POSTURES = ("enforce", "advise", "off")
DECAY_WINDOW = 3600  # no 429 ages out while an example runs: the effective limit is exact

# A claim is the todo id or "next" (claim_next); a child's turn is one to three of them.
CLAIMS = st.lists(
    st.one_of(st.just("next"), st.integers(min_value=0, max_value=50)), min_size=1, max_size=3
)


def names_of(todo: Todo) -> set[str]:
    return ({todo.pool} if todo.pool else set()) | set(todo.tags)


@dataclass(frozen=True)
class World:
    """What the invariants compare between two steps, read after a step."""

    limits: dict[str, tuple[int, str]]  # name: (limit; for the rate limit its effective, posture)
    occupancy: dict[str, int]
    claimed: dict[str, tuple[int, str, frozenset[str]]]  # todo: (attempt, holder, names)
    attempts: dict[tuple[str, int], frozenset[str]]  # (todo, number): the names the todo carries
    minutes: dict[datetime, int]  # the rate limit's charges per minute
    last_seq: int


@dataclass
class Step:
    """What the last rule did that the invariants need to know."""

    changed: dict[str, tuple[int, str]] = field(default_factory=dict)  # raced limit changes
    quarantined: str | None = None
    quarantine: dict[str, Any] | None = None  # limit_quarantine's answer
    minute_turned: bool = False  # the rate buckets moved (no claim was made)


class NamedLimits(RuleBasedStateMachine):
    p: Personas
    children: list[Child]

    def __init__(self) -> None:
        super().__init__()
        # The last example's claims end as the services end them (the reaper's end row), so
        # their grants do not stay open in the ledger once their todos are gone.
        for todo in Todo.objects.filter(state=TodoState.CLAIMED):
            lapse(todo)
        while sweeps.reap_expired():
            pass
        Todo.objects.all().delete()  # and their attempts
        RateObservation.objects.all().delete()
        RateMinute.objects.all().delete()
        self.admin = self.p.as_human(self.p.admin)
        self.limits: dict[str, tuple[int, str]] = {}
        for name, kind in OCCUPANCY.items():
            self.set_limit(kind, name, 1, "enforce")
        self.rate = (4, 1, "enforce")  # base, floor, posture
        self.observations = 0
        self.minutes_turned = 0
        limit_services.limit_set(
            actor=self.admin,
            kind="rate",
            name=RATE,
            base_limit=4,
            floor=1,
            decay_window_seconds=DECAY_WINDOW,
            decay_step=1,
            posture="enforce",
        )
        self.first_seq = self.read().last_seq
        self.before = self.read()
        self.step = Step()

    # --- the machine's own view of what is in force -----------------------------------------

    def set_limit(self, kind: str, name: str, value: int, posture: str) -> None:
        field_name = "slots" if kind == "pool" else "limit"
        given: dict[str, Any] = {field_name: value, "posture": posture}
        limit_services.limit_set(actor=self.admin, kind=kind, name=name, **given)
        self.limits[name] = (value, posture)

    def in_force(self) -> dict[str, tuple[int, str]]:
        base, floor, posture = self.rate
        return {**self.limits, RATE: (effective_limit(base, floor, self.observations), posture)}

    def read(self) -> World:
        claimed = Todo.objects.filter(state=TodoState.CLAIMED)
        attempts = every_attempt()
        return World(
            limits=self.in_force(),
            occupancy={
                "p": claimed.filter(pool="p").count(),
                "a": claimed.filter(tags__contains=["a"]).count(),
                "b": claimed.filter(tags__contains=["b"]).count(),
            },
            claimed={
                str(t.id): (t.attempt, t.owner, frozenset(names_of(t))) for t in claimed.all()
            },
            attempts={
                (str(a.todo_id), a.number): frozenset(
                    names_of(a.todo) | ({RATE} if a.todo.rate_limit else set())
                )
                for a in attempts
            },
            minutes=dict(
                RateMinute.objects.filter(rate_limit__name=RATE).values_list("minute", "used")
            ),
            last_seq=LedgerEntry.objects.order_by("-seq").values_list("seq", flat=True)[0],
        )

    # --- claims in both children at once ----------------------------------------------------

    def _targets(self, picks: list[Any]) -> list[str]:
        pending = [
            str(i)
            for i in Todo.objects.filter(state=TodoState.PENDING)
            .order_by("created_at", "id")
            .values_list("id", flat=True)
        ]
        return [
            "next" if pick == "next" or not pending else pending[pick % len(pending)]
            for pick in picks
        ]

    def race(self, first: list[Any], second: list[Any], meanwhile: Callable[[], Any]) -> Any:
        """Both children claim at once while this process runs ``meanwhile``."""
        endpoint = str(self.p.agent.id)
        for child, picks in zip(self.children, (first, second), strict=True):
            child.send({"endpoint": endpoint, "claims": self._targets(picks)})
        try:
            done = meanwhile()
        finally:
            reports = [child.receive() for child in self.children]
        errors = [e for r in reports for e in r["errors"]]
        assert not errors, errors
        return done

    # --- rules ------------------------------------------------------------------------------

    @rule(
        n=st.integers(min_value=1, max_value=3),
        pool=st.booleans(),
        tags=st.sets(st.sampled_from(["a", "b"])),
        rate=st.booleans(),
    )
    def create(self, n: int, pool: bool, tags: set[str], rate: bool) -> None:
        push(
            self.p,
            n,
            pool="p" if pool else None,
            tags=sorted(tags),
            rate_limit=RATE if rate else None,
        )

    @rule(
        first=CLAIMS,
        second=CLAIMS,
        fresh=st.integers(min_value=0, max_value=2),
        pool=st.booleans(),
        tags=st.sets(st.sampled_from(["a", "b"])),
        rate=st.booleans(),
    )
    def claim_in_both_children(
        self,
        first: list[Any],
        second: list[Any],
        fresh: int,
        pool: bool,
        tags: set[str],
        rate: bool,
    ) -> None:
        """Both children claim at once, after ``fresh`` new todos (so most races have work;
        the draws never depend on what the database holds, which would make hypothesis's
        replays of a race draw differently)."""
        if fresh:
            self.create(fresh, pool, tags, rate)
        self.race(first, second, lambda: None)

    def _claimed(self, pick: int) -> Todo | None:
        held = list(Todo.objects.filter(state=TodoState.CLAIMED).order_by("created_at", "id"))
        return held[pick % len(held)] if held else None

    @rule(pick=st.integers(min_value=0, max_value=50))
    def complete(self, pick: int) -> None:
        todo = self._claimed(pick)
        if todo is not None:
            services.complete(actor=self.p.as_agent(), todo_id=todo.id)

    @rule(pick=st.integers(min_value=0, max_value=50))
    def release(self, pick: int) -> None:
        todo = self._claimed(pick)
        if todo is not None:
            services.release(actor=self.p.as_agent(), todo_id=todo.id)

    @rule(pick=st.integers(min_value=0, max_value=50))
    def expire(self, pick: int) -> None:
        todo = self._claimed(pick)
        if todo is not None:
            lapse(todo)
            assert sweeps.reap_expired() >= 1

    @rule(
        name=st.sampled_from(sorted(OCCUPANCY)),
        value=st.integers(min_value=0, max_value=3),
        posture=st.sampled_from(POSTURES),
        racing=st.none() | st.tuples(CLAIMS, CLAIMS),
    )
    def change_limit(
        self, name: str, value: int, posture: str, racing: tuple[list[Any], list[Any]] | None
    ) -> None:
        def change() -> None:
            self.set_limit(OCCUPANCY[name], name, value, posture)

        if racing is None:
            change()
        else:
            self.race(*racing, change)
            self.step.changed[name] = (value, posture)

    @rule(
        name=st.sampled_from(sorted(OCCUPANCY)),
        racing=st.none() | st.tuples(CLAIMS, CLAIMS),
    )
    def quarantine(self, name: str, racing: tuple[list[Any], list[Any]] | None) -> None:
        def quarantine() -> dict[str, Any]:
            return limit_services.limit_quarantine(
                actor=self.admin, kind=OCCUPANCY[name], name=name
            )

        done = quarantine() if racing is None else self.race(*racing, quarantine)
        self.limits[name] = (0, "enforce")
        self.step.quarantined, self.step.quarantine = name, done

    @rule(
        base=st.integers(min_value=1, max_value=6),
        floor=st.integers(min_value=1, max_value=6),
        posture=st.sampled_from(POSTURES),
    )
    def change_rate_limit(self, base: int, floor: int, posture: str) -> None:
        floor = min(floor, base)
        limit_services.limit_set(
            actor=self.admin,
            kind="rate",
            name=RATE,
            base_limit=base,
            floor=floor,
            posture=posture,
        )
        self.rate = (base, floor, posture)

    @rule()
    def the_minute_turns(self) -> None:
        """The rate limit's current minute ends: its bucket moves into the past (a day per turn,
        so no two collide), as if the clock had moved on, and the next claims count from zero.
        Without it the bucket fills once per wall-clock minute and refuses every later claim,
        so a race across the limit (two claimers both finding one unit left) almost never
        happens and a lost rate lock goes unseen."""
        self.minutes_turned += 1
        self.step.minute_turned = True
        RateMinute.objects.filter(minute=minute_of(timezone.now())).update(
            minute=F("minute") - timedelta(days=self.minutes_turned)
        )

    @rule()
    def a_429_is_reported(self) -> None:
        observe(rate_limit=RATE, actor=self.p.as_agent())
        self.observations += 1

    @invariant()
    def every_invariant_holds(self) -> None:
        now = self.read()
        for check in INVARIANTS:
            check(self, self.before, now, self.step)
        self.before, self.step = now, Step()


# --- the invariants: each (machine, world before the step, world after it, what the step did) --


def _new_attempts(before: World, now: World) -> dict[tuple[str, int], frozenset[str]]:
    return {key: names for key, names in now.attempts.items() if key not in before.attempts}


def _new_waivers(before: World) -> list[dict[str, Any]]:
    rows = LedgerEntry.objects.filter(kind=LedgerKind.LIMITS_WAIVER, seq__gt=before.last_seq)
    return [row.after or {} for row in rows]


def enforce_limits_are_never_exceeded(
    m: NamedLimits, before: World, now: World, step: Step
) -> None:
    """No claim lifts occupancy above an enforce limit in force while it was admitted; a
    lowered limit may leave more held than it allows until they end, never more than before."""
    for name in OCCUPANCY:
        if name == step.quarantined:
            assert now.occupancy[name] == 0, (name, "held after its quarantine")
            continue
        in_force = [before.limits[name]] + ([step.changed[name]] if name in step.changed else [])
        if all(posture == "enforce" for _, posture in in_force):
            ceiling = max(*(limit for limit, _ in in_force), before.occupancy[name])
            assert now.occupancy[name] <= ceiling, (name, in_force, before.occupancy, now.occupancy)
    effective, posture = before.limits[RATE]  # the rate limit never changes while claims race
    if posture == "enforce" and not step.minute_turned:
        for minute, used in now.minutes.items():
            assert used <= max(effective, before.minutes.get(minute, 0)), (
                minute,
                effective,
                before.minutes,
                now.minutes,
            )


def _over(held: int, limit: int, admitted: int) -> int:
    """How many of ``admitted`` claims, taking the limit's lock one after another from ``held``,
    found it at or over ``limit``."""
    return sum(held + i >= limit for i in range(admitted))


def advise_excess_has_exactly_one_waiver(
    m: NamedLimits, before: World, now: World, step: Step
) -> None:
    """Every claim admitted over an advise limit left exactly one waiver naming that limit.

    Counted exactly for each limit whose occupancy only grew during the step (neither changed
    while claims raced nor emptied by a racing quarantine of another limit; the quarantined one
    is exact too: every claim naming it was admitted before the quarantine). The rate limit is
    counted per minute bucket, as charged. Every waiver names a real excess of an advise limit,
    and no claim has two waivers from one gate."""
    waivers = _new_waivers(before)
    named = Counter(e["name"] for w in waivers for e in w["exceeded"])
    new = _new_attempts(before, now)
    expired = {e["todo"] for e in (step.quarantine or {}).get("manifest", {}).get("expired", [])}
    emptied = {n for (t, _), names in now.attempts.items() if t in expired for n in names}
    for name in OCCUPANCY:
        if name in step.changed or (name in emptied and name != step.quarantined):
            continue
        limit, posture = before.limits[name]
        admitted = sum(name in names for names in new.values())
        expected = _over(before.occupancy[name], limit, admitted) if posture == "advise" else 0
        assert named[name] == expected, (name, limit, posture, before.occupancy, admitted)
    effective, posture = before.limits[RATE]
    expected = 0
    if posture == "advise" and not step.minute_turned:
        for minute, used in now.minutes.items():
            was = before.minutes.get(minute, 0)
            expected += _over(was, effective, used - was)
    assert named[RATE] == expected, (effective, posture, before.minutes, now.minutes)
    for w in waivers:
        for e in w["exceeded"]:
            limits = [before.limits[e["name"]], step.changed.get(e["name"])]
            assert e["held"] >= e["limit"], w
            assert any(x is not None and x[1] == "advise" for x in limits), (w, limits)
    every = LedgerEntry.objects.filter(kind=LedgerKind.LIMITS_WAIVER, seq__gt=m.first_seq)
    per_gate = Counter(
        (w["todo"], w["attempt"], w["gate"]) for w in (row.after or {} for row in every)
    )
    assert all(n == 1 for n in per_gate.values()), per_gate


def every_rate_limited_claim_is_charged_once(
    m: NamedLimits, before: World, now: World, step: Step
) -> None:
    """The minute counters add up to the claims of work naming the rate limit, whatever the
    posture: a claim spends one unit of the minute it was admitted in."""
    assert sum(now.minutes.values()) == sum(RATE in n for n in now.attempts.values())


def a_quarantine_expires_exactly_the_matching_claims(
    m: NamedLimits, before: World, now: World, step: Step
) -> None:
    """The manifest names every claim naming the limit (held before, or admitted while the
    quarantine raced) with its holder, each attempt closed as expired; the queued todos are
    the ones still waiting on it; the ledger row alone replays the manifest byte for byte."""
    name, done = step.quarantined, step.quarantine
    if name is None or done is None:
        return
    manifest = done["manifest"]
    new = _new_attempts(before, now)
    matching = {t for t, (_, _, names) in before.claimed.items() if name in names}
    matching |= {t for (t, _), names in new.items() if name in names}
    assert {e["todo"] for e in manifest["expired"]} == matching, (manifest, matching)
    for e in manifest["expired"]:
        if e["todo"] in before.claimed:
            assert e["holder"] == before.claimed[e["todo"]][1]
        attempt = Attempt.objects.get(todo_id=e["todo"], number=e["attempt"])
        assert attempt.outcome == "expired" and attempt.ended_at is not None, e
    naming = Q(pool=name) if OCCUPANCY[name] == "pool" else Q(tags__contains=[name])
    waiting = {
        str(i)
        for i in Todo.objects.filter(naming, state=TodoState.PENDING).values_list("id", flat=True)
    }
    requeued = {e["todo"] for e in manifest["expired"] if e["state"] == "pending"}
    assert waiting == set(manifest["queued"]) | requeued, (manifest, waiting)
    replayed = selectors.quarantines()[-1]
    assert replayed["entry_hash"] == done["entry_hash"]
    assert selectors.manifest_bytes(replayed["manifest"]) == selectors.manifest_bytes(manifest)
    row = LedgerEntry.objects.get(entry_hash=done["entry_hash"])
    assert chain.compute_hash(row) == row.entry_hash


def the_ledger_verifies_and_its_open_grants_are_the_ones_the_todos_hold(
    m: NamedLimits, before: World, now: World, step: Step
) -> None:
    """``limits verify`` passes (the chain from genesis, every grant replayed against the limit
    in force when it was claimed), and the grants its replay leaves open are exactly the ones
    the todos hold (``grant_hash``): same todos, same hashes, every one a live claim."""
    report = limits_verify()
    assert report.ok, report.as_dict()
    holding = Todo.objects.exclude(grant_hash=None)
    assert report.open == {t.grant_hash: str(t.id) for t in holding}, report.open
    assert all(t.state == TodoState.CLAIMED for t in holding)


Invariant = Callable[[NamedLimits, World, World, Step], None]
INVARIANTS: list[Invariant] = [
    enforce_limits_are_never_exceeded,
    advise_excess_has_exactly_one_waiver,
    every_rate_limited_claim_is_charged_once,
    a_quarantine_expires_exactly_the_matching_claims,
    the_ledger_verifies_and_its_open_grants_are_the_ones_the_todos_hold,
]


@pytest.fixture
def children(tx_personas: Personas) -> Iterator[list[Child]]:
    with started("tests.limits.machine_racer") as both:
        yield both


def test_random_interleavings_in_two_processes_keep_every_limit_waiver_and_manifest_exact(
    tx_personas: Personas, children: list[Child]
) -> None:
    NamedLimits.p = tx_personas
    NamedLimits.children = children
    run_state_machine_as_test(
        NamedLimits,
        settings=settings(
            max_examples=30,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
            database=None,
            # A race does not replay: shrinking one spends minutes replaying steps whose claims
            # interleave differently each time. A failure is reported as found (with its steps).
            phases=[Phase.explicit, Phase.generate],
        ),
    )
