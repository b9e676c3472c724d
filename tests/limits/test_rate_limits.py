"""Adaptive rate limits: claims per minute under max(floor, base >> 429s in the decay window),
read from observation rows; 429s reported by their own verb or on fail."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from admission.limits import rates
from admission.limits.models import RateLimit, RateMinute, RateObservation
from queues import services
from queues.models import Verb
from queues.services import Claimed, NothingClaimable
from switchboard.core.errors import Deferred, InvalidArgument
from switchboard.ledger.models import LedgerEntry, LedgerKind
from tests.api.conftest import Api
from tests.conftest import FIXTURE, Personas
from tests.limits.conftest import clear_of_a_minute_boundary, push_named

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("observed", "now", "effective"),
    [
        ([100], 200, 4),  # one 429 in the window halves base 8
        ([100, 150], 200, 2),  # two halve it twice
        ([100], 500, 8),  # aged out of the 300 s window: back to base
        ([], 200, 8),
        ([10, 20, 30, 40, 50], 100, 1),  # never below the floor
    ],
)
def test_the_decay_table(db: None, observed: list[int], now: int, effective: int) -> None:
    rate = RateLimit.objects.create(name="openai", base_limit=8, floor=1)
    for t in observed:
        RateObservation.objects.create(rate_limit=rate, observed_at=at(t))
    st = rates.state("openai", now=at(now))
    assert st is not None and st.effective == effective


def test_the_floor_holds_and_the_window_is_tunable(db: None) -> None:
    rate = RateLimit.objects.create(name="r", base_limit=8, floor=3, decay_window_seconds=60)
    for t in (100, 110, 120):
        RateObservation.objects.create(rate_limit=rate, observed_at=at(t))
    assert rates.state("r", now=at(130)).effective == 3  # type: ignore[union-attr]
    assert rates.state("r", now=at(175)).effective == 4  # type: ignore[union-attr]
    assert rates.state("r", now=at(200)).effective == 8  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("window", "observed", "used", "eligible"),
    [
        (12, [1, 4], 2, 13),  # the first 429 ages out: 4 a minute, 2 used
        (12, [1, 4], 4, 16),  # 4 used: only the second's age-out (8) lets one more through
        (12, [1, 4], 7, 16),
        (120, [1, 4], 2, 60),  # no age-out this minute: the next minute (exact)
        (50, [i / 10 for i in range(1, 71)], 3, 56.9),  # 70 in the window: the 69th's age-out
        (50, [i / 10 for i in range(1, 71)], 8, 60),  # back to 8 only after the minute
    ],
)
def test_a_held_rate_s_time_is_when_the_limit_rises_over_the_claims_used(
    db: None, window: int, observed: list[float], used: int, eligible: float
) -> None:
    # An age-out raises the limit, but not necessarily over this minute's claims: a time
    # before the one that does let a claim through would be a promise broken.
    rate = RateLimit.objects.create(name="r", base_limit=8, floor=1, decay_window_seconds=window)
    for t in observed:
        RateObservation.objects.create(rate_limit=rate, observed_at=T0 + timedelta(seconds=t))
    RateMinute.objects.create(rate_limit=rate, minute=T0, used=used)
    st = rates.state("r", now=at(8))
    assert st is not None and st.exceeded
    assert st.next_eligible_at == T0 + timedelta(seconds=eligible)
    assert st.exact == (eligible == 60)
    later = rates.state("r", now=st.next_eligible_at)
    assert later is not None and (later.effective > used or later.used == 0)
    before = rates.state("r", now=st.next_eligible_at - timedelta(microseconds=1))
    assert before is not None and before.exceeded


@pytest.mark.parametrize(
    ("step", "observed", "effective"),
    [
        (1, [100], 4),  # the default: today's curve
        (2, [100], 2),  # two halvings per 429
        (2, [100, 150], 1),  # down to the floor
        (0, [100, 150], 8),  # no decay at all
    ],
)
def test_the_decay_step_tunes_the_halvings_per_429(
    db: None, step: int, observed: list[int], effective: int
) -> None:
    rate = RateLimit.objects.create(name="openai", base_limit=8, floor=1, decay_step=step)
    for t in observed:
        RateObservation.objects.create(rate_limit=rate, observed_at=at(t))
    st = rates.state("openai", now=at(200))
    assert st is not None and st.effective == effective


def test_claims_follow_a_tuned_decay_step(personas: Personas) -> None:
    clear_of_a_minute_boundary()
    RateLimit.objects.create(name="openai", base_limit=8, decay_step=2)
    rates.observe(rate_limit="openai", actor=personas.as_agent())  # 8 >> 2: two a minute
    push_named(personas, 3, rate_limit="openai")
    results = [services.claim_next(actor=personas.as_agent()) for _ in range(3)]
    assert [type(r) for r in results] == [Claimed, Claimed, NothingClaimable]
    assert results[2].deferred[0]["reason"] == "rate_limited"  # type: ignore[union-attr]


def test_claims_stop_at_the_effective_limit_with_the_next_minute_or_an_age_out(
    personas: Personas,
) -> None:
    RateLimit.objects.create(name="openai", base_limit=4, floor=1)
    push_named(personas, 6, rate_limit="openai")
    clear_of_a_minute_boundary()
    services.claim_next(actor=personas.as_agent())  # 1 of 4 this minute
    rates.observe(rate_limit="openai", actor=personas.as_agent())  # effective 2
    assert isinstance(services.claim_next(actor=personas.as_agent()), Claimed)
    refused = services.claim_next(actor=personas.as_agent())
    assert isinstance(refused, NothingClaimable)
    [deferred] = refused.deferred
    st = rates.state("openai")
    assert st is not None and (st.used, st.effective) == (2, 2)
    assert deferred["reason"] == "rate_limited"
    assert deferred["next_eligible_at"] == st.next_eligible_at
    assert st.next_eligible_at == min(
        rates.minute_of(st.now) + timedelta(minutes=1),
        st.newest_observations[0] + timedelta(seconds=300),  # back to 4 a minute, 2 used
    )


def test_advise_admits_over_a_rate_with_a_waiver_and_off_only_counts(personas: Personas) -> None:
    RateLimit.objects.create(name="openai", base_limit=1, posture="advise")
    RateLimit.objects.create(name="quiet", base_limit=1, posture="off")
    push_named(personas, 2, rate_limit="openai")
    push_named(personas, 2, rate_limit="quiet")
    clear_of_a_minute_boundary()
    assert all(isinstance(services.claim_next(actor=personas.as_agent()), Claimed) for _ in "abcd")
    assert [rates.state(name).used for name in ("openai", "quiet")] == [2, 2]  # type: ignore[union-attr]
    [waiver] = LedgerEntry.objects.filter(kind=LedgerKind.LIMITS_WAIVER)
    assert waiver.after is not None and waiver.after["gate"] == "rate_limit"
    assert waiver.after["exceeded"] == [{"name": "openai", "limit": 1, "held": 1}]


def test_a_claim_by_id_over_a_rate_names_its_gate(personas: Personas) -> None:
    RateLimit.objects.create(name="openai", base_limit=1)
    first, second = push_named(personas, 2, rate_limit="openai")
    clear_of_a_minute_boundary()
    services.claim(actor=personas.as_agent(), todo_id=first.id)
    with pytest.raises(Deferred) as refused:
        services.claim(actor=personas.as_agent(), todo_id=second.id)
    assert refused.value.details["reason"] == "rate_limited"
    assert refused.value.details["rate_limit"] == ["openai"]
    assert refused.value.details["limits"] == [{"kind": "rate", "name": "openai"}]


def test_report_rate_limited_is_its_own_family(personas: Personas, client: Client) -> None:
    RateLimit.objects.create(name="openai", base_limit=8)
    basic = Api(client, personas.agent_token).verb("report_rate_limited", {"rate_limit": "openai"})
    assert basic.status_code == 403
    assert Verb.REPORT_RATE_LIMITED not in personas.agent.scope_verbs
    endpoint, token = services.endpoint_vend(
        actor=FIXTURE,
        owner=personas.owner,
        name="Reporter",
        queues=["inbox"],
        verbs=["claim_next", "report_rate_limited"],
        rps=0,
    )
    api = Api(Client(), token)
    reported = api.verb("report_rate_limited", {"rate_limit": "openai"})
    assert reported.status_code == 200, reported.content
    assert reported.json()["effective_limit"] == 4
    assert reported.json()["observations"] == 1
    unknown = api.verb("report_rate_limited", {"rate_limit": "nope"})
    assert unknown.status_code == 400 and unknown.json()["field"] == "rate_limit"
    assert RateObservation.objects.get().endpoint_id == endpoint.id


def test_fail_with_rate_limited_records_one_observation(personas: Personas) -> None:
    RateLimit.objects.create(name="openai", base_limit=8)
    [named] = push_named(personas, 1, rate_limit="openai")
    [plain] = push_named(personas, 1, queue="outbox")
    for todo in (named, plain):
        services.claim(actor=personas.as_agent(), todo_id=todo.id)
    services.fail(actor=personas.as_agent(), todo_id=named.id, rate_limited=True)
    assert rates.state("openai").effective == 4  # type: ignore[union-attr]
    with pytest.raises(InvalidArgument) as refused:
        services.fail(actor=personas.as_agent(), todo_id=plain.id, rate_limited=True)
    assert refused.value.details["field"] == "rate_limited"
    plain.refresh_from_db()
    assert plain.state == "claimed"  # nothing changed
