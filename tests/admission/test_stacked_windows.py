"""Stacked windows (issue 12): a policy holds several window limits, every one charged and
enforced on the same claim; a deferral names the window that binds; the ledger carries the list."""

from __future__ import annotations

from datetime import UTC, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Sum
from django.utils import timezone

from admission import services, windows
from admission.models import AdmissionPolicy, AdmissionWindow
from admission.policy import PolicySpec, audited_windows
from queues import services as queue_services
from queues.models import Todo, TodoState
from queues.services import Claimed, NothingClaimable
from switchboard.core.errors import InvalidArgument
from switchboard.ledger import chain as ledger
from switchboard.ledger.models import LedgerEntry, LedgerKind
from tests.admission.racer import race
from tests.admission.test_api import human
from tests.conftest import Personas, attempt_count, database_url, push, statements

WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def far_start() -> str:
    """A daily start about twelve hours away, so no boundary falls inside a test."""
    return (timezone.now() + timedelta(hours=12)).astimezone(UTC).strftime("%H:00")


def far_weekday() -> str:
    """A week boundary three days away."""
    return WEEKDAYS[(timezone.now().astimezone(UTC).weekday() + 3) % 7]


def day(limit: int) -> dict[str, Any]:
    return {"limit": limit, "period": "day", "tz": "UTC", "start": far_start()}


def week(limit: int) -> dict[str, Any]:
    return {
        "limit": limit,
        "period": "week",
        "tz": "Europe/Berlin",
        "start": "00:00",
        "weekday": far_weekday(),
    }


def stacked(
    p: Personas,
    *items: dict[str, Any],
    max_in_flight: int | None = None,
    posture: str = "enforce",
) -> Any:
    return services.policy_set(
        actor=p.as_human(p.owner),
        endpoint=p.agent,
        queue="inbox",
        max_in_flight=max_in_flight,
        max_claims_per_window=None,
        window=None,
        windows=list(items),
        posture=posture,
    )


def counters(policy: AdmissionPolicy) -> dict[str, int]:
    """Each window's count by counter key: its shard rows summed (migration 0007)."""
    rows = AdmissionWindow.objects.filter(policy=policy).values("window_key")
    return dict(rows.annotate(n=Sum("used")).values_list("window_key", "n"))


def week_reset() -> Any:
    spec = windows.Window("week", "Europe/Berlin", "00:00", far_weekday())
    return windows.next_boundary(spec, timezone.now())


@pytest.fixture(autouse=True)
def _writes(settings: Any) -> None:
    settings.POLICY_WRITE_RATE_LIMIT = (0, 0)


def test_every_window_is_charged_on_one_claim_and_the_tighter_one_refuses(
    personas: Personas,
) -> None:
    p = personas
    policy = stacked(p, day(5), week(3))
    push(p, 6)
    for _ in range(3):
        assert isinstance(queue_services.claim_next(actor=p.as_agent()), Claimed)
    week_key = f"week|Europe/Berlin|00:00|{far_weekday()}"
    assert counters(policy) == {"": 3, week_key: 3}
    empty = queue_services.claim_next(actor=p.as_agent())
    assert isinstance(empty, NothingClaimable)
    (entry,) = empty.deferred
    assert entry["reason"] == "window_exhausted" and entry["exact"] is True
    assert entry["next_eligible_at"] == week_reset()
    assert entry["window"]["period"] == "week" and entry["window"]["limit"] == 3
    assert counters(policy) == {"": 3, week_key: 3}
    assert attempt_count() == 3


def _claim(p: Personas, n: int) -> None:
    for _ in range(n):
        assert isinstance(queue_services.claim_next(actor=p.as_agent()), Claimed)


def _admitted(p: Personas) -> int:
    """Claims admitted until the first refusal."""
    n = 0
    while isinstance(queue_services.claim_next(actor=p.as_agent()), Claimed):
        n += 1
    return n


def test_a_window_keeps_its_count_wherever_it_stands_in_the_list(personas: Personas) -> None:
    # The first window counted under its place (""), the others under their definition: a week
    # window moved behind a new one started again from 0, and moved back to the front found the
    # count it had there. 7 claims were admitted in a week under a limit of 5 in force throughout.
    p = personas
    push(p, 12)
    policy = stacked(p, week(5))
    _claim(p, 3)
    stacked(p, day(100), week(5))
    assert _admitted(p) == 2
    stacked(p, week(5))
    assert _admitted(p) == 0
    assert attempt_count() == 5
    week_key = f"week|Europe/Berlin|00:00|{far_weekday()}"
    day_key = f"day|UTC|{far_start()}|"
    assert counters(policy) == {"": 5, day_key: 2}
    assert week_key not in counters(policy)


def test_a_new_first_window_does_not_take_over_the_count_of_the_one_it_replaced(
    personas: Personas,
) -> None:
    # Both counted under "" and their start: a week window starting at the very instant the
    # day window it replaced started read the day's count as its own (and a window of other
    # bounds that happened to start then, the count of claims outside them).
    p = personas
    push(p, 12)
    began = timezone.now().astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    began += timedelta(hours=12) - timedelta(days=1)  # where day(…)'s current window began
    same_start = {
        "limit": 5,
        "period": "week",
        "tz": "UTC",
        "start": far_start(),
        "weekday": WEEKDAYS[began.weekday()],
    }
    policy = stacked(p, day(5))
    _claim(p, 3)
    assert windows.window_start(stacked(p, same_start), timezone.now()) == began
    status = human(p.owner).get("/api/v1/admission").json()["policies"][0]
    assert [w["used"] for w in status["usage"]["windows"]] == [0]
    assert _admitted(p) == 5
    assert counters(policy) == {"": 5, f"day|UTC|{far_start()}|": 3}


def test_an_hour_window_s_start_rewritten_at_another_hour_keeps_its_count(
    personas: Personas,
) -> None:
    # "07:20" and "00:20" are one window, every hour from :20 (Window.boundaries; a second such
    # window is refused as a repeat), but the save moved the count away as for a new window:
    # 3 more claims in the hour under a limit of 3 in force throughout. Its preview says so too.
    p = personas
    push(p, 8)
    # Minutes half an hour from now, so no hour boundary falls inside the test.
    mm = (timezone.now().astimezone(ZoneInfo("Asia/Kathmandu")).minute + 30) % 60
    hour = {"limit": 3, "period": "hour", "tz": "Asia/Kathmandu", "start": f"07:{mm:02d}"}
    policy = stacked(p, hour)
    _claim(p, 3)
    before = PolicySpec.of(AdmissionPolicy.objects.get(pk=policy.pk))
    rewritten = {**hour, "start": f"00:{mm:02d}"}
    after = PolicySpec.clean(
        queue="inbox", max_in_flight=None, max_claims_per_window=None, window=None,
        windows=[rewritten],
    )  # fmt: skip
    assert services.counters_after_save(before, after) == {}
    stacked(p, rewritten)
    assert AdmissionPolicy.objects.get(pk=policy.pk).window_start == f"00:{mm:02d}"
    assert _admitted(p) == 0
    assert counters(policy) == {"": 3}
    # Another minute is another window: it starts from 0, its count its own.
    stacked(p, {**hour, "start": f"00:{(mm + 1) % 60:02d}"})
    assert _admitted(p) == 3


def test_the_binding_window_is_the_exhausted_one_that_resets_last(personas: Personas) -> None:
    p = personas
    stacked(p, day(2), week(2))
    push(p, 3)
    for _ in range(2):
        assert isinstance(queue_services.claim_next(actor=p.as_agent()), Claimed)
    empty = queue_services.claim_next(actor=p.as_agent())
    assert isinstance(empty, NothingClaimable)
    (entry,) = empty.deferred
    # Both are spent; the day resets first, but the claim waits for the week.
    assert entry["next_eligible_at"] == week_reset()
    assert entry["window"]["period"] == "week"
    status = human(p.owner).get("/api/v1/admission").json()["policies"][0]
    assert status["status"]["state"] == "deferred"
    assert status["status"]["window"]["period"] == "week"
    assert [w["used"] for w in status["usage"]["windows"]] == [2, 2]


def test_an_advise_waiver_records_every_window_the_claim_went_over(personas: Personas) -> None:
    p = personas
    tokyo = {"limit": 2, "period": "day", "tz": "Asia/Tokyo", "start": "00:00"}
    stacked(p, day(5), week(2), tokyo, posture="advise")
    push(p, 3)
    for _ in range(3):
        assert isinstance(queue_services.claim_next(actor=p.as_agent()), Claimed)
    waiver = LedgerEntry.objects.get(kind=LedgerKind.ADMISSION_WAIVER)
    assert waiver.after is not None
    over = waiver.after["windows_exceeded"]
    assert [(w["period"], w["tz"], w["limit"], w["used"]) for w in over] == [
        ("week", "Europe/Berlin", 2, 2),
        ("day", "Asia/Tokyo", 2, 2),
    ]
    # The week resets after the Tokyo day (three days off), so it is the one that binds.
    assert [w["binding"] for w in over] == [True, False]
    assert all(w["window_start"] and w["key"] for w in over)
    assert waiver.after["used"] == 2 and waiver.after["max_claims_per_window"] == 5
    assert ledger.verify().ok


def test_the_api_takes_a_windows_list_and_names_the_wrong_row(personas: Personas) -> None:
    p = personas
    api = human(p.owner)
    path = f"/api/v1/admission/endpoint:{p.agent.slug}/inbox"
    ok = api.put(path, {"windows": [day(100), week(1000)], "max_in_flight": 4})
    assert ok.status_code == 200, ok.json()
    shown = api.get(path).json()["policy"]
    assert [w["limit"] for w in shown["windows"]] == [100, 1000]
    assert shown["max_claims_per_window"] == 100  # the first window, as before
    bad = api.put(path, {"windows": [day(1), {**week(2), "tz": "Mars/Olympus"}]})
    assert bad.status_code == 400 and bad.json()["field"] == "windows[1].tz"
    twice = api.put(path, {"windows": [day(1), day(2)]})
    assert twice.status_code == 400 and twice.json()["field"] == "windows[1].period"
    both = api.put(path, {"windows": [day(1)], "max_claims_per_window": 3})
    assert both.status_code == 400 and both.json()["field"] == "windows"
    assert [w["limit"] for w in api.get(path).json()["policy"]["windows"]] == [100, 1000]
    # An hour window starts at its minutes past every hour: 10:30 and 00:30 are one window.
    hours = [
        {"limit": n, "period": "hour", "tz": "UTC", "start": s}
        for n, s in ((5, "10:30"), (6, "00:30"))
    ]
    again = api.put(path, {"windows": hours})
    assert again.status_code == 400 and again.json()["field"] == "windows[1].period"
    assert "past every hour" in again.json()["error"]
    hours[1]["start"] = "00:45"
    assert api.put(path, {"windows": hours}).status_code == 200
    assert [w["limit"] for w in api.get(path).json()["policy"]["windows"]] == [5, 6]


def test_the_spec_refuses_a_fifth_window_and_a_missing_limit() -> None:
    five = [
        {**day(1), "tz": tz} for tz in ("UTC", "Etc/GMT-1", "Etc/GMT-2", "Etc/GMT-3", "Etc/GMT-4")
    ]
    for windows_, field in (
        (five, "windows"),
        ([day(1), {"period": "day", "tz": "UTC", "start": "01:00"}], "windows[1].limit"),
    ):
        with pytest.raises(InvalidArgument) as exc:
            PolicySpec.clean(
                queue="inbox",
                max_in_flight=None,
                max_claims_per_window=None,
                window=None,
                windows=windows_,
            )
        assert exc.value.field == field


def test_the_database_refuses_a_bad_stacked_window(personas: Personas) -> None:
    policy = stacked(personas, day(5), week(3))
    for bad in (
        [{"limit": 1, "period": "fortnight", "tz": "UTC", "start": "00:00"}],
        [{"limit": -1, "period": "day", "tz": "UTC", "start": "00:00"}],
        [{"limit": 1, "period": "week", "tz": "UTC", "start": "00:00"}],
        [{**day(1), "start": policy.window_start}],  # the same as the first window
    ):
        with pytest.raises(IntegrityError) as exc, transaction.atomic():
            AdmissionPolicy.objects.filter(pk=policy.pk).update(extra_windows=bad)
        assert "policy_extra_windows_valid" in str(exc.value)


def test_the_ledger_carries_the_list_and_verify_reads_old_rows(personas: Personas) -> None:
    p = personas
    policy = stacked(p, day(5), week(3))
    assert ledger.verify().ok
    assert policy.extra_windows[0]["limit"] == 3
    create = LedgerEntry.objects.filter(kind=LedgerKind.POLICY_CREATE).order_by("seq").last()
    assert create is not None and create.after is not None
    assert [w["limit"] for w in create.after["windows"]] == [5, 3]
    # A row written before stacked windows had no list: it reads as its one window.
    old = {k: v for k, v in create.after.items() if k != "windows"}
    assert (audited_windows(old) or {})["windows"] == [create.after["windows"][0]]
    # A single-window policy audited in the old shape still verifies.
    services.policy_clear(actor=p.as_human(p.owner), endpoint=p.agent, queue="inbox")
    single = AdmissionPolicy.objects.create(
        endpoint=p.agent,
        queue="inbox",
        max_claims_per_window=5,
        window_period="day",
        window_tz="UTC",
        window_start="00:00",
        created_by=p.owner,
        updated_by=p.owner,
    )
    shape = PolicySpec.of(single).audited(single.endpoint_id)
    del shape["windows"]
    ledger.append(
        kind=LedgerKind.POLICY_CREATE,
        actor=ledger.Actor(human_id=p.owner.pk, human_name=p.owner.get_username()),
        scope=f"endpoint:{p.agent.slug}",
        queue="inbox",
        after=shape,
    )
    assert ledger.verify().ok
    # ...and a change to it outside the audited path is still caught.
    AdmissionPolicy.objects.filter(pk=single.pk).update(
        extra_windows=[{"limit": 9, "period": "hour", "tz": "UTC", "start": "00:00"}]
    )
    (drift,) = ledger.verify().drift
    assert drift.problem == "changed_outside_audit" and "windows" in drift.detail


def test_forty_racers_in_two_processes_stop_at_the_tightest_of_three_windows(
    tx_personas: Personas, tmp_path: Path
) -> None:
    p = tx_personas
    policy = stacked(
        p, day(12), week(7), {"limit": 9, "period": "day", "tz": "Asia/Tokyo", "start": "00:00"}
    )
    push(p, 40)
    reports = race(p.agent.id, 20, tmp_path, database_url(), settings.REDIS_URL)
    assert [r["errors"] for r in reports] == [[], []]
    claimed = [t for r in reports for t in r["claimed"]]
    assert len(claimed) == 7 and len(set(claimed)) == 7
    assert Todo.objects.filter(state=TodoState.CLAIMED).count() == 7
    assert attempt_count() == 7
    assert sorted(counters(policy).values()) == [7, 7, 7]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM (SELECT sum(used) AS n FROM admission_admissionwindow "
            "GROUP BY policy_id, window_key, window_start) w WHERE n > 7"
        )
        assert cursor.fetchone()[0] == 0


def test_a_claim_under_stacked_windows_is_decided_in_its_one_statement(
    personas: Personas,
) -> None:
    """The fast path's hint holds each window definition's bounds once (admission migration
    0009), so a claim under two stacked windows is admitted and charged inside the claim's one
    statement; a hint missing a definition would send every claim to the locked path."""
    import json

    from admission.gate import BudgetGate
    from admission.policy import Window

    def key(w: dict[str, Any]) -> str:
        return Window(w["period"], w["tz"], w["start"], w.get("weekday")).key

    p = personas
    policy = stacked(p, day(5), week(9))
    # A second budget of the endpoint with the same daily window: its definition is not repeated.
    services.policy_set(
        actor=p.as_human(p.owner),
        endpoint=p.agent,
        queue="outbox",
        max_in_flight=None,
        max_claims_per_window=None,
        window=None,
        windows=[day(7)],
        posture="enforce",
    )
    hint = json.loads(BudgetGate().fast_params(p.agent.id))
    assert sorted(hint) == sorted([key(day(5)), key(week(9))])
    push(p, 2)
    first = queue_services.claim_next(actor=p.as_agent(), queue="inbox")
    assert isinstance(first, Claimed)
    with statements() as seen:
        second = queue_services.claim_next(actor=p.as_agent(), queue="inbox")
    assert isinstance(second, Claimed)
    assert len(seen) == 1 and "admission_admit" in seen[0], seen
    assert second.admission is not None
    assert [w["used"] for w in second.admission["windows"]] == [2, 2]
    assert counters(policy) == {"": 2, key(week(9)): 2}
