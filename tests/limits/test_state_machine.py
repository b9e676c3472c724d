"""Named limits under random interleavings (issue 13, item 12): a hypothesis state machine that
creates todos naming a pool and tags, claims them two at a time on two threads with their own
database connections (one claim_next, one claim by id, released together), completes,
releases, lets leases lapse for the reaper, and changes limits and postures through the
service. After every step: a claim never lifts occupancy above an enforced limit, each claim
admitted over an advise limit left exactly one waiver naming that limit, and the ledger
verifies from genesis.

Not here: quarantine (helper i13c's service had not landed on main) and rate limits (their
minute counter straddles wall-clock minutes; the decay table and rate tests cover them).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from admission.limits import services as limit_services
from queues import services
from queues.models import Todo, TodoState
from queues.services import sweeps
from switchboard.core.errors import DomainError
from switchboard.ledger import chain
from switchboard.ledger.models import LedgerEntry, LedgerKind
from tests.conftest import Personas, lapse, push, run_threads

LIMITS = (("pool", "p"), ("tag", "a"), ("tag", "b"))
POSTURES = ("enforce", "advise", "off")


def occupancy() -> dict[str, int]:
    claimed = Todo.objects.filter(state=TodoState.CLAIMED)
    return {
        "p": claimed.filter(pool="p").count(),
        "a": claimed.filter(tags__contains=["a"]).count(),
        "b": claimed.filter(tags__contains=["b"]).count(),
    }


def claims() -> dict[tuple[str, int], Todo]:
    """The claims held now, by (todo, attempt)."""
    return {
        (str(t.id), t.attempt): t
        for t in Todo.objects.filter(state=TodoState.CLAIMED).select_related("endpoint")
    }


def names_of(todo: Todo) -> set[str]:
    return ({todo.pool} if todo.pool else set()) | set(todo.tags)


class NamedLimits(RuleBasedStateMachine):
    p: Personas

    def __init__(self) -> None:
        super().__init__()
        Todo.objects.all().delete()
        self.admin = self.p.as_human(self.p.admin)
        self.limits: dict[str, tuple[int, str]] = {}
        for kind, name in LIMITS:
            self.set_limit(kind, name, 1, "enforce")
        self.last_seq = LedgerEntry.objects.order_by("-seq").values_list("seq", flat=True)[0]

    def set_limit(self, kind: str, name: str, value: int, posture: str) -> None:
        field = "slots" if kind == "pool" else "limit"
        limit_services.limit_set(
            actor=self.admin, kind=kind, name=name, **{field: value, "posture": posture}
        )
        self.limits[name] = (value, posture)

    @rule(pool=st.booleans(), tags=st.sets(st.sampled_from(["a", "b"])))
    def create(self, pool: bool, tags: set[str]) -> None:
        push(self.p, 1, pool="p" if pool else None, tags=sorted(tags))

    @rule(pick=st.integers(min_value=0, max_value=50))
    def claim_two_at_once(self, pick: int) -> None:
        pending = list(Todo.objects.filter(state=TodoState.PENDING).order_by("created_at"))
        by_id = pending[pick % len(pending)].id if pending else None
        before, held_before = claims(), occupancy()
        seq_before = self.last_seq

        def claim(i: int) -> Any:
            try:
                if i == 0:
                    return services.claim_next(actor=self.p.as_agent())
                if by_id is not None:
                    return services.claim(actor=self.p.as_agent(), todo_id=by_id)
            except DomainError as refused:  # deferred or taken by the other claimer
                return refused
            return None

        run_threads(2, claim)
        new = [t for key, t in claims().items() if key not in before]
        held_after = occupancy()
        for name, (limit, posture) in self.limits.items():
            if posture == "enforce":
                assert held_after[name] <= max(limit, held_before[name]), (name, limit)
        waivers = LedgerEntry.objects.filter(kind=LedgerKind.LIMITS_WAIVER, seq__gt=seq_before)
        rows = [w.after or {} for w in waivers]
        named = Counter(e["name"] for w in rows for e in w["exceeded"])
        for name, (limit, posture) in self.limits.items():
            k = sum(name in names_of(t) for t in new)
            # The claims naming it took its lock one after another: held b, b+1, ... b+k-1.
            over = sum(held_before[name] + i >= limit for i in range(k))
            assert named[name] == (over if posture == "advise" else 0), (name, limit, posture)
        per_grant = Counter((w["todo"], w["attempt"], w["gate"]) for w in rows)
        assert all(n == 1 for n in per_grant.values()), per_grant

    def _claimed(self, pick: int) -> Todo | None:
        held = list(Todo.objects.filter(state=TodoState.CLAIMED).order_by("created_at"))
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
        which=st.sampled_from(LIMITS),
        value=st.integers(min_value=0, max_value=3),
        posture=st.sampled_from(POSTURES),
    )
    def change_limit(self, which: tuple[str, str], value: int, posture: str) -> None:
        self.set_limit(*which, value, posture)

    @invariant()
    def the_ledger_verifies(self) -> None:
        assert chain.verify().ok
        self.last_seq = LedgerEntry.objects.order_by("-seq").values_list("seq", flat=True)[0]


def test_random_interleavings_keep_every_limit_and_waiver_exact(tx_personas: Personas) -> None:
    NamedLimits.p = tx_personas
    run_state_machine_as_test(
        NamedLimits,
        settings=settings(
            max_examples=10,
            stateful_step_count=14,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
            database=None,
        ),
    )
