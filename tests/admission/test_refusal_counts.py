"""A refusal's count in its windows' history, written after the claim (engine.record_refusal),
racing the budget's writes (races11, an outside tester): a budget cleared or changed since the
refusal was decided. The count is history: it is dropped when its budget or its window is gone,
and never fails the claim that the agent is answered with."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest

from admission import engine
from admission import selectors as admission_selectors
from admission import services as admission_services
from admission.gate import BudgetGate
from admission.models import PRIMARY_WINDOW_KEY, AdmissionPolicy, AdmissionWindow
from queues import services
from queues.services import Claimed
from tests.admission.conftest import budget
from tests.conftest import Personas, database_url, in_thread, push, until_a_lock_waits

HOUR = {"limit": 1000, "period": "hour", "tz": "UTC", "start": "00:00"}
WEEK = {"limit": 20, "period": "week", "tz": "UTC", "start": "00:00", "weekday": "Mon"}


def _set(p: Personas, windows: list[dict[str, Any]]) -> AdmissionPolicy:
    policy: AdmissionPolicy = admission_services.policy_set(
        actor=p.as_human(p.owner),
        endpoint=p.agent,
        queue="inbox",
        max_in_flight=None,
        max_claims_per_window=None,
        window=None,
        windows=windows,
    )
    return policy


@pytest.fixture(autouse=True)
def _unlimited_writes(settings: Any) -> None:
    settings.POLICY_WRITE_RATE_LIMIT = (0, 0)


def test_a_refusal_of_a_budget_cleared_since_counts_nothing_and_fails_nothing(
    personas: Personas,
) -> None:
    policy = _set(personas, [HOUR, WEEK])
    refusal = admission_selectors.evaluate_policy(policy)
    admission_services.policy_clear(
        actor=personas.as_human(personas.owner), endpoint=personas.agent, queue="inbox"
    )
    BudgetGate().refused([refusal])  # a foreign key's refusal, a 500 to the agent, before
    assert not AdmissionWindow.objects.filter(policy_id=policy.id).exists()


def test_a_refusal_racing_the_budgets_clear_to_its_commit_counts_nothing(
    tx_personas: Personas,
) -> None:
    """The clear's delete is not committed when the refusal's statement reads the budget: the
    statement writes its row, then waits for the clear at its foreign key's check, which the
    clear's commit fails. The refusal is dropped; no error reaches the claim."""
    p = tx_personas
    policy = _set(p, [HOUR])
    refusal = admission_selectors.evaluate_policy(policy)
    with psycopg.connect(database_url()) as clear:
        clear.execute("DELETE FROM admission_admissionwindow WHERE policy_id = %s", [policy.id])
        clear.execute("DELETE FROM admission_admissionpolicy WHERE id = %s", [policy.id])
        refuser, refused = in_thread(lambda: BudgetGate().refused([refusal]))
        until_a_lock_waits("the refusal")  # for the clear
        clear.commit()
    refuser.join(timeout=60)
    assert refused.exception(timeout=60) is None
    assert not AdmissionWindow.objects.filter(policy_id=policy.id).exists()


def test_a_refusal_decided_under_another_first_window_is_not_counted_in_the_new_ones(
    personas: Personas,
) -> None:
    """Decided under [hour, week]; the list is [week] when it is counted. The first window's
    key now names the week: the hour's refusal is not put in the week's history."""
    policy = _set(personas, [HOUR, WEEK])
    refusal = admission_selectors.evaluate_policy(policy)
    hour_start = refusal.windows[0].window_start
    _set(personas, [WEEK])
    BudgetGate().refused([refusal])
    first = AdmissionWindow.objects.filter(policy=policy, window_key=PRIMARY_WINDOW_KEY)
    assert not first.filter(window_start=hour_start).exists()
    # Under the list it was decided under, a refusal counts in every window.
    _set(personas, [HOUR, WEEK])
    again = admission_selectors.evaluate_policy(policy)
    BudgetGate().refused([again])
    counted = AdmissionWindow.objects.filter(policy=policy, refused__gt=0)
    assert {(r.window_key, r.window_start) for r in counted} >= {
        (PRIMARY_WINDOW_KEY, hour_start),
        (again.windows[1].key, again.windows[1].window_start),
    }


def test_a_claim_is_answered_though_a_refusal_beside_it_could_not_be_counted(
    personas: Personas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """claim_next claims in one queue and counts another queue's refusal after its commit. A
    count the database refuses is logged and dropped: the agent is answered with its claim,
    not a 500 for a claim it would then hold without knowing (races11: 86 such claims)."""
    p = personas
    budget(p, "inbox", per="day", limit=0)
    push(p, 1, queue="inbox")
    (free,) = push(p, 1, queue="outbox")

    def refused_by_the_database(cursor: Any, evaluation: Any) -> None:
        cursor.execute("SELECT 1 / 0")  # PostgreSQL's own error (division_by_zero)

    monkeypatch.setattr(engine, "record_refusal", refused_by_the_database)
    seen: list[logging.LogRecord] = []

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    handler = Seen()
    logger = logging.getLogger("queues.services.claiming")
    logger.addHandler(handler)
    try:
        claimed = services.claim_next(actor=p.as_agent())
    finally:
        logger.removeHandler(handler)
    assert isinstance(claimed, Claimed) and claimed.todo.id == free.id
    assert [r.getMessage() for r in seen] == ["could not count a refusal of queue inbox"]


def test_a_clear_waits_for_a_count_in_progress_and_takes_its_row_with_it(
    tx_personas: Personas,
) -> None:
    """A refusal's count has passed its foreign key check (``FOR KEY SHARE`` of the budget) and
    not committed when the budget is cleared: the clear waits for it, then removes its row with
    the rest. The clear deleted the counter rows first, the count committed its row, and the
    clear's commit failed on the key (regress11: 500 to the operator)."""
    p = tx_personas
    policy = _set(p, [HOUR])
    with psycopg.connect(database_url()) as count:
        count.execute(
            "SELECT 1 FROM admission_admissionpolicy WHERE id = %s FOR KEY SHARE", [policy.id]
        )
        clearer, cleared = in_thread(
            lambda: admission_services.policy_clear(
                actor=p.as_human(p.owner), endpoint=p.agent, queue="inbox"
            )
        )
        until_a_lock_waits("the clear")  # for the count
        count.execute(
            "INSERT INTO admission_admissionwindow (policy_id, window_key, window_start, shard, "
            "used, refused, claims_limit, updated_at) VALUES (%s, '', now(), 0, 0, 1, 1000, now())",
            [policy.id],
        )
        count.commit()
    clearer.join(timeout=60)
    assert cleared.exception(timeout=60) is None and isinstance(cleared.result(), dict)
    assert not AdmissionPolicy.objects.filter(pk=policy.pk).exists()
    assert not AdmissionWindow.objects.filter(policy_id=policy.id).exists()


def test_a_refusal_waits_for_a_write_of_its_first_window_in_progress(
    tx_personas: Personas,
) -> None:
    """Decided under [hour, week]; a write putting the week first holds the budget's shards,
    uncommitted, when the refusal is counted. The count waits for the write, then finds the
    first window changed and leaves the hour's refusal out of the week's history. It read the
    definition before the write committed and counted it there (regress11: 31 of 49 rows)."""
    p = tx_personas
    policy = _set(p, [HOUR, WEEK])
    refusal = admission_selectors.evaluate_policy(policy)
    hour_start = refusal.windows[0].window_start
    with psycopg.connect(database_url()) as write:
        write.execute("SELECT admission_shards_lock(%s)", [policy.id])
        write.execute(
            "UPDATE admission_admissionpolicy SET window_period = 'week', window_weekday = 'Mon', "
            "extra_windows = '[]'::jsonb WHERE id = %s",
            [policy.id],
        )
        refuser, refused = in_thread(lambda: BudgetGate().refused([refusal]))
        until_a_lock_waits("the count")  # for the write
        write.commit()
    refuser.join(timeout=60)
    assert refused.exception(timeout=60) is None
    first = AdmissionWindow.objects.filter(policy=policy, window_key=PRIMARY_WINDOW_KEY)
    assert not first.filter(window_start=hour_start).exists()
