"""The claim with admission: charging, refusing, postures and the deferred answers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.db.models import Sum
from django.utils import timezone

from admission import windows
from admission.models import AdmissionPolicy, AdmissionWindow
from queues import services
from queues.models import Attempt, Todo, TodoState
from queues.services import Claimed, NothingClaimable
from switchboard.core import verbs
from switchboard.core.errors import Deferred
from switchboard.ledger import chain as ledger
from switchboard.ledger.models import LedgerEntry, LedgerKind
from tests.admission.conftest import budget, window_total
from tests.conftest import Personas, lapse, make_retry_due, push


def far_start() -> str:
    """A daily start about twelve hours away, so no boundary falls inside a test."""
    return (timezone.now() + timedelta(hours=12)).astimezone(UTC).strftime("%H:00")


def used(policy: AdmissionPolicy) -> int:
    """Claims charged to the policy's current window (its shard rows summed)."""
    return window_total(policy)


def claimed(result: Any) -> Claimed:
    assert isinstance(result, Claimed), result
    return result


def nothing(result: Any) -> NothingClaimable:
    assert isinstance(result, NothingClaimable), result
    return result


def test_a_claim_on_a_budgeted_queue_is_charged_and_shows_its_headroom(personas: Personas) -> None:
    p = personas
    policy = budget(p, per="day", limit=10, start=far_start(), max_in_flight=3)
    push(p, 2)
    result = claimed(services.claim_next(actor=p.as_agent()))
    assert result.admission is not None
    assert result.admission["max_in_flight"] == 3 and result.admission["in_flight"] == 1
    assert result.admission["max_claims_per_window"] == 10
    assert result.admission["used"] == 1 and result.admission["remaining"] == 9
    assert result.admission["window_resets_at"] == windows.next_boundary(policy, timezone.now())
    assert used(policy) == 1


def test_the_eleventh_claim_in_a_window_of_ten_is_refused(personas: Personas) -> None:
    p = personas
    policy = budget(p, per="day", limit=10, start=far_start())
    push(p, 12)
    for _ in range(10):
        claimed(services.claim_next(actor=p.as_agent()))
    empty = nothing(services.claim_next(actor=p.as_agent()))
    (entry,) = empty.deferred
    assert entry["queue"] == "inbox" and entry["reason"] == "window_exhausted"
    assert entry["pending"] == 2
    assert entry["exact"] is True
    assert entry["next_eligible_at"] == windows.next_boundary(policy, timezone.now())
    assert used(policy) == 10
    assert window_total(policy, "refused") == 1


def test_a_spent_window_holding_back_a_lapsed_claim_or_a_due_retry_says_so(
    personas: Personas,
) -> None:
    # Both are claimable as pending work is (a takeover, a retry). The deferral counted pending
    # todos alone, so until a sweep made them pending the answer was {"empty": true} and no why.
    p = personas
    policy = budget(p, per="day", limit=2, start=far_start())
    push(p, 2, max_attempts=3)
    first = claimed(services.claim_next(actor=p.as_agent()))
    second = claimed(services.claim_next(actor=p.as_agent()))
    lapse(first.todo)
    services.fail(actor=p.as_agent(), todo_id=second.todo.id, error={"type": "Flaky"})
    (entry,) = nothing(services.claim_next(actor=p.as_agent())).deferred
    assert entry["reason"] == "window_exhausted" and entry["pending"] == 1  # retry not due yet
    make_retry_due(second.todo)
    (entry,) = nothing(services.claim_next(actor=p.as_agent())).deferred
    assert entry["queue"] == "inbox" and entry["reason"] == "window_exhausted"
    assert entry["pending"] == 2
    assert entry["next_eligible_at"] == windows.next_boundary(policy, timezone.now())


def test_claim_next_with_no_pending_work_is_plainly_empty(personas: Personas) -> None:
    p = personas
    budget(p, per="day", limit=0, start=far_start())
    assert nothing(services.claim_next(actor=p.as_agent())).deferred == []


def test_in_flight_cap_two_refuses_the_third_and_admits_after_one_completes(
    personas: Personas,
) -> None:
    p = personas
    budget(p, max_in_flight=2)
    push(p, 3)
    first = claimed(services.claim_next(actor=p.as_agent()))
    second = claimed(services.claim_next(actor=p.as_agent()))
    (entry,) = nothing(services.claim_next(actor=p.as_agent())).deferred
    assert entry["reason"] == "in_flight_full" and entry["pending"] == 1
    assert first.todo.lease_expires_at and second.todo.lease_expires_at
    earliest = min(first.todo.lease_expires_at, second.todo.lease_expires_at)
    assert entry["next_eligible_at"] == earliest + timedelta(
        seconds=settings.SWEEP_INTERVAL_SECONDS
    )
    assert entry["exact"] is False
    services.complete(actor=p.as_agent(), todo_id=first.todo.id)
    third = claimed(services.claim_next(actor=p.as_agent()))
    assert third.admission is not None and third.admission["in_flight"] == 2


def test_a_takeover_at_cap_one_is_admitted_and_charged(personas: Personas) -> None:
    p = personas
    policy = budget(p, max_in_flight=1, per="day", limit=10, start=far_start())
    (todo,) = push(p, 1)
    claimed(services.claim_next(actor=p.as_agent()))
    lapse(todo)
    again = claimed(services.claim_next(actor=p.as_agent(), claimant="rescuer"))
    assert again.todo.id == todo.id and again.attempt == 2
    assert again.admission is not None and again.admission["in_flight"] == 1
    assert used(policy) == 2


def test_a_retry_is_charged(personas: Personas) -> None:
    p = personas
    policy = budget(p, per="day", limit=10, start=far_start())
    (todo,) = push(p, 1)
    claimed(services.claim_next(actor=p.as_agent()))
    services.fail(actor=p.as_agent(), todo_id=todo.id, error="boom")
    make_retry_due(todo)
    retry = claimed(services.claim_next(actor=p.as_agent()))
    assert retry.todo.id == todo.id and retry.attempt == 2
    assert used(policy) == 2


def test_a_release_does_not_refund(personas: Personas) -> None:
    p = personas
    policy = budget(p, per="day", limit=10, start=far_start())
    (todo,) = push(p, 1)
    claimed(services.claim_next(actor=p.as_agent()))
    services.release(actor=p.as_agent(), todo_id=todo.id)
    assert used(policy) == 1
    claimed(services.claim_next(actor=p.as_agent()))
    assert used(policy) == 2


def test_a_deduplicated_create_charges_nothing(personas: Personas) -> None:
    p = personas
    policy = budget(p, per="day", limit=10, start=far_start())
    (first,) = push(p, 1, idempotency_key="same")
    made = services.todo_create(
        actor=p.as_agent(), endpoint=p.agent, queue="inbox", title="again", idempotency_key="same"
    )
    assert made.created is False and made.todo.id == first.id
    assert not AdmissionWindow.objects.filter(policy=policy).exists()
    claimed(services.claim_next(actor=p.as_agent()))
    assert used(policy) == 1


def test_a_refused_claim_charges_nothing(personas: Personas) -> None:
    p = personas
    policy = budget(p, per="day", limit=1, start=far_start())
    push(p, 3)
    claimed(services.claim_next(actor=p.as_agent()))
    for _ in range(3):
        nothing(services.claim_next(actor=p.as_agent()))
    assert used(policy) == 1
    assert window_total(policy, "refused") == 3


def test_lowering_a_limit_below_usage_refuses_further_claims_and_keeps_committed_ones(
    personas: Personas,
) -> None:
    p = personas
    start = far_start()
    policy = budget(p, per="day", limit=5, start=start)
    push(p, 5)
    held = [claimed(services.claim_next(actor=p.as_agent())).todo.id for _ in range(3)]
    budget(p, per="day", limit=2, start=start)
    (entry,) = nothing(services.claim_next(actor=p.as_agent())).deferred
    assert entry["reason"] == "window_exhausted"
    assert Todo.objects.filter(id__in=held, state=TodoState.CLAIMED).count() == 3
    assert used(policy) == 3


def test_raising_a_limit_admits_at_once(personas: Personas) -> None:
    p = personas
    start = far_start()
    budget(p, per="day", limit=2, start=start)
    push(p, 3)
    for _ in range(2):
        claimed(services.claim_next(actor=p.as_agent()))
    nothing(services.claim_next(actor=p.as_agent()))
    budget(p, per="day", limit=3, start=start)
    claimed(services.claim_next(actor=p.as_agent()))


def test_redefining_the_window_is_audited_and_counts_in_the_new_window(personas: Personas) -> None:
    p = personas
    day = budget(p, per="day", limit=2, start=far_start())
    old_start = windows.window_start(day, timezone.now())
    push(p, 3)
    for _ in range(2):
        claimed(services.claim_next(actor=p.as_agent()))
    nothing(services.claim_next(actor=p.as_agent()))
    hour = budget(p, per="hour", limit=2, start="00:00")
    new_start = windows.window_start(hour, timezone.now())
    assert new_start != old_start
    update = LedgerEntry.objects.get(kind=LedgerKind.POLICY_UPDATE)
    assert update.before is not None and update.after is not None
    assert update.before["window"]["period"] == "day"
    assert update.after["window"]["period"] == "hour"
    claimed(services.claim_next(actor=p.as_agent()))
    counters = dict(
        AdmissionWindow.objects.filter(policy=hour)
        .values("window_start")
        .annotate(n=Sum("used"))
        .values_list("window_start", "n")
    )
    assert counters == {old_start: 2, new_start: 1}


def test_a_limit_of_zero_holds_the_queue_as_paused(personas: Personas) -> None:
    p = personas
    budget(p, max_in_flight=0)
    push(p, 1)
    (entry,) = nothing(services.claim_next(actor=p.as_agent())).deferred
    assert entry["reason"] == "paused" and entry["next_eligible_at"] is None


def test_one_deferred_queue_does_not_starve_another_granted_queue(personas: Personas) -> None:
    p = personas
    budget(p, "inbox", per="day", limit=0, start=far_start())
    push(p, 3, queue="inbox")  # older: the candidate scan meets these first
    (out,) = push(p, 1, queue="outbox")
    got = claimed(services.claim_next(actor=p.as_agent()))
    assert got.todo.id == out.id
    (entry,) = nothing(services.claim_next(actor=p.as_agent())).deferred
    assert entry["queue"] == "inbox" and entry["pending"] == 3


def test_a_budget_binds_one_endpoint_not_the_queue_name(personas: Personas) -> None:
    p = personas
    budget(p, max_in_flight=0)
    push(p, 1, endpoint=p.agent2)
    claimed(services.claim_next(actor=p.as_agent(p.agent2)))


def test_claim_of_a_deferred_todo_fails_with_deferred_and_changes_nothing(
    personas: Personas,
) -> None:
    p = personas
    policy = budget(p, per="day", limit=1, start=far_start())
    first, second = push(p, 2)
    claimed(services.claim(actor=p.as_agent(), todo_id=first.id))
    with pytest.raises(Deferred) as caught:
        services.claim(actor=p.as_agent(), todo_id=second.id)
    err = caught.value.as_dict()
    assert err["code"] == "deferred"
    assert err["queue"] == "inbox" and err["reason"] == "window_exhausted"
    assert err["exact"] is True
    assert datetime.fromisoformat(err["next_eligible_at"]) == windows.next_boundary(
        policy, timezone.now()
    )
    second.refresh_from_db()
    assert second.state == TodoState.PENDING and second.attempt == 0 and second.owner == ""
    assert not Attempt.objects.filter(todo=second).exists()
    assert used(policy) == 1


def test_the_operators_board_claim_is_charged_too(personas: Personas) -> None:
    p = personas
    policy = budget(p, per="day", limit=1, start=far_start())
    first, second = push(p, 2)
    claimed(services.claim(actor=p.as_human(), todo_id=first.id))
    assert used(policy) == 1
    with pytest.raises(Deferred):
        services.claim(actor=p.as_human(), todo_id=second.id)


def test_posture_advise_admits_over_limit_and_signs_a_waiver(personas: Personas) -> None:
    p = personas
    policy = budget(p, per="day", limit=1, start=far_start(), posture="advise")
    push(p, 2)
    claimed(services.claim_next(actor=p.as_agent()))
    assert not LedgerEntry.objects.filter(kind=LedgerKind.ADMISSION_WAIVER).exists()
    over = claimed(services.claim_next(actor=p.as_agent()))
    assert over.admission is not None and over.admission["posture"] == "advise"
    waiver = LedgerEntry.objects.get(kind=LedgerKind.ADMISSION_WAIVER)
    assert waiver.scope == f"endpoint:{p.agent.slug}" and waiver.queue == "inbox"
    assert waiver.after is not None
    assert waiver.after["exceeded"] == ["max_claims_per_window"]
    assert waiver.after["reason"] == "window_exhausted"
    assert waiver.after["todo"] == str(over.todo.id)
    assert waiver.after["used"] == 1 and waiver.after["max_claims_per_window"] == 1
    assert waiver.actor_endpoint_id == p.agent.id and waiver.actor_human_id == p.owner.pk
    assert used(policy) == 2
    assert ledger.verify().ok


def test_posture_off_admits_and_only_counts(personas: Personas) -> None:
    p = personas
    policy = budget(p, per="day", limit=1, max_in_flight=1, start=far_start(), posture="off")
    push(p, 3)
    for _ in range(3):
        claimed(services.claim_next(actor=p.as_agent()))
    assert used(policy) == 3
    assert not LedgerEntry.objects.filter(kind=LedgerKind.ADMISSION_WAIVER).exists()


def break_zone(policy: AdmissionPolicy, zone: str = "Mars/Olympus_Mons") -> None:
    """Store a zone the tz database does not know, as a tzdata update that drops one would."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE admission_admissionpolicy SET window_tz = %s WHERE id = %s", [zone, policy.id]
        )


def test_an_unknown_stored_zone_fails_closed_for_that_queue_identity_only(
    personas: Personas,
) -> None:
    p = personas
    broken = budget(p, "inbox", per="day", limit=100, start=far_start())
    budget(p, "outbox", per="day", limit=100, start=far_start())
    break_zone(broken)
    (held,) = push(p, 1, queue="inbox")
    (out,) = push(p, 1, queue="outbox")
    (inbox_other,) = push(p, 1, queue="inbox", endpoint=p.agent2)
    assert claimed(services.claim_next(actor=p.as_agent())).todo.id == out.id
    (entry,) = nothing(services.claim_next(actor=p.as_agent())).deferred
    assert entry["queue"] == "inbox" and entry["reason"] == "admission_unavailable"
    with pytest.raises(Deferred) as caught:
        services.claim(actor=p.as_agent(), todo_id=held.id)
    assert caught.value.details["reason"] == "admission_unavailable"
    # The same queue name on another endpoint is another identity, and is admitted.
    assert claimed(services.claim_next(actor=p.as_agent(p.agent2))).todo.id == inbox_other.id


def agent_call(p: Personas, name: str, **arguments: Any) -> dict[str, Any]:
    spec = verbs.get(name)
    assert spec is not None
    actor = p.as_agent()
    return verbs.call(actor, spec, spec.parse(arguments))


def test_every_pending_todo_of_a_budgeted_queue_reads_with_its_status(personas: Personas) -> None:
    p = personas
    policy = budget(p, "inbox", per="day", limit=1, start=far_start())
    budget(p, "outbox", max_in_flight=5)
    push(p, 3, queue="inbox")
    push(p, 1, queue="outbox")
    claimed(services.claim_next(actor=p.as_agent(), queue="inbox"))
    listed = agent_call(p, "list_todos")["todos"]
    reset = windows.next_boundary(policy, timezone.now())
    seen = {"inbox": 0, "outbox": 0}
    for todo in listed:
        if todo["state"] != "pending":
            assert "admission" not in todo
            continue
        seen[todo["queue"]] += 1
        if todo["queue"] == "inbox":
            assert todo["admission"]["state"] == "deferred"
            assert todo["admission"]["reason"] == "window_exhausted"
            assert datetime.fromisoformat(todo["admission"]["next_eligible_at"]) == reset
            assert todo["admission"]["exact"] is True
        else:
            assert todo["admission"] == {
                "state": "admitted",
                "reason": None,
                "next_eligible_at": None,
                "exact": True,
            }
        one = agent_call(p, "get_todo", id=todo["id"])["todo"]
        assert one["admission"] == todo["admission"]
    assert seen == {"inbox": 2, "outbox": 1}


def test_an_unbudgeted_pending_todo_reads_without_admission(personas: Personas) -> None:
    p = personas
    push(p, 1)
    (todo,) = agent_call(p, "list_todos")["todos"]
    assert "admission" not in todo


def test_a_counter_left_by_an_earlier_window_never_hides_the_current_one(
    personas: Personas,
) -> None:
    p = personas
    from admission import selectors

    weekday = timezone.now().astimezone(UTC).strftime("%a")
    policy = budget(p, per="week", limit=2, weekday=weekday, start="00:00")
    now = timezone.now()
    week_start = windows.window_start(policy, now)
    AdmissionWindow.objects.create(policy=policy, window_start=week_start, used=2)
    # A later counter from when the budget was hourly.
    later = week_start + (now - week_start) / 2
    assert week_start < later <= now
    AdmissionWindow.objects.create(policy=policy, window_start=later, used=0)
    push(p, 1)
    assert selectors.identity_admitted(policy.id) is False
    status = selectors.identity_status(p.agent.id, "inbox")
    assert status is not None and status.reason == "window_exhausted" and status.used == 2
    assert selectors.evaluate_policy(policy).used == 2
    (entry,) = nothing(services.claim_next(actor=p.as_agent())).deferred
    assert entry["reason"] == "window_exhausted"


def test_the_claim_status_and_preview_read_usage_from_the_one_usage_query(
    personas: Personas,
) -> None:
    """admission_usage (migration 0005) is the only SQL that counts a budget's in-flight claims
    and reads its window counter; the locked claim, the status selector and the budget preview
    all go through it, so they cannot count differently."""
    from django.test.utils import CaptureQueriesContext

    from admission import engine, selectors
    from admission.policy import PolicySpec, Window
    from admission.views import preview

    p = personas
    policy = budget(p, max_in_flight=2, per="day", limit=5)
    push(p, 3)
    services.claim_next(actor=p.as_agent(), claimant="a")
    spec = PolicySpec("inbox", 1, 5, Window("day", "UTC", "00:00"), "enforce")
    # The claim's two paths: admission_check (in the claiming statement) and engine.decide.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_functiondef('admission_check(uuid, uuid, jsonb)'::regprocedure)"
        )
        assert "admission_verdict(" in cursor.fetchone()[0]  # both modes read through it
        cursor.execute(
            "SELECT pg_get_functiondef("
            "'admission_verdict(uuid, uuid, jsonb, integer)'::regprocedure)"
        )
        assert "admission_usage(" in cursor.fetchone()[0]
    assert "admission_usage(" in engine._DECIDE_SQL
    for read in (
        lambda: selectors.identity_status(p.agent.id, "inbox"),
        lambda: preview(p.agent, "inbox", policy, spec),
    ):
        with CaptureQueriesContext(connection) as ctx:
            read()
        sqls = [q["sql"] for q in ctx.captured_queries]
        assert any("admission_usage(" in s for s in sqls), sqls
        assert not any("state = 'claimed'" in s for s in sqls if "admission_usage(" not in s)
    assert selectors.identity_status(p.agent.id, "inbox").in_flight == 1  # type: ignore[union-attr]
    assert preview(p.agent, "inbox", policy, spec)
