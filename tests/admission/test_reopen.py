"""Reopen: one todo_ready per queue identity that became admitted and has work, heard by LISTEN."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, timedelta
from typing import Any

import psycopg
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from admission import services, windows
from admission.models import AdmissionPolicy, AdmissionWindow
from queues import services as queue_services
from queues import wakes
from queues.models import QueuePause, Todo
from queues.services import Claimed
from switchboard.celery import app
from tests.admission.conftest import budget, window_total
from tests.conftest import Personas, lapse, push, run_threads


class Bell:
    """A LISTEN on todo_ready, registered before the code under test runs."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def heard(self, wait: float = 0.5) -> list[str]:
        """Every notification delivered so far (each was sent at a commit that has returned)."""
        return [wakes.identity(n.payload) for n in self.conn.notifies(timeout=wait)]


@contextmanager
def listening() -> Iterator[Bell]:
    conn = psycopg.connect(autocommit=True, **connection.get_connection_params())
    try:
        conn.execute("LISTEN todo_ready")
        yield Bell(conn)
    finally:
        conn.close()


# Each test's windows are daily ones starting about twelve hours from when this module was
# loaded, so no boundary falls inside any test of the run. With hourly windows a test that ran
# across the top of an hour failed: the window it had spent rolled over in the middle, so a
# raised limit found the identity already admitted and did not ring (fresh-clone CI at 01:00 UTC).
START = (timezone.now() + timedelta(hours=12)).astimezone(UTC).strftime("%H:00")


def daily(p: Personas, **kwargs: Any) -> AdmissionPolicy:
    return budget(p, per="day", start=START, **kwargs)


def ring(p: Personas, queue: str = "inbox") -> str:
    return f"{p.agent.id}:{queue}"


def exhaust(policy: AdmissionPolicy) -> AdmissionWindow:
    """Spend the whole current window, as claims would have: the whole count on shard 0."""
    start = windows.window_start(policy, timezone.now())
    assert policy.max_claims_per_window is not None
    AdmissionWindow.objects.filter(policy=policy, window_start=start).exclude(shard=0).delete()
    window, _ = AdmissionWindow.objects.update_or_create(
        policy=policy, window_start=start, shard=0, defaults={"used": policy.max_claims_per_window}
    )
    return window


def roll_over(window: AdmissionWindow) -> None:
    """Make the spent window a past one, as if its boundary had passed."""
    AdmissionWindow.objects.filter(pk=window.pk).update(
        window_start=window.window_start - timedelta(days=1)
    )


def test_the_sweep_rings_once_when_a_spent_window_rolls_over(tx_personas: Personas) -> None:
    p = tx_personas
    policy = daily(p, limit=2)
    push(p, 2)
    spent = exhaust(policy)
    with listening() as bell:
        assert services.reopen_sweep().rung == []
        assert bell.heard() == []
        roll_over(spent)
        assert services.reopen_sweep().rung == [ring(p)]
        assert bell.heard() == [ring(p)]
        # Admitted on the next tick too: it does not ring again.
        assert services.reopen_sweep().rung == []
        assert bell.heard() == []


def test_the_sweep_rings_once_when_in_flight_falls_below_the_cap(tx_personas: Personas) -> None:
    p = tx_personas
    budget(p, max_in_flight=1)
    first, _second = push(p, 2)
    assert isinstance(queue_services.claim_next(actor=p.as_agent()), Claimed)
    with listening() as bell:
        assert services.reopen_sweep().rung == []
        # The claim ends outside the services (so nothing else rings): the sweep must notice.
        Todo.objects.filter(pk=first.pk).update(state="done", lease_expires_at=None)
        assert services.reopen_sweep().rung == [ring(p)]
        assert services.reopen_sweep().rung == []
        assert bell.heard() == [ring(p)]


def test_a_queue_still_deferred_never_rings(tx_personas: Personas) -> None:
    p = tx_personas
    exhaust(daily(p, limit=1))
    push(p, 1)
    with listening() as bell:
        for _ in range(3):
            assert services.reopen_sweep().rung == []
        assert bell.heard() == []


def test_an_admitted_queue_without_work_does_not_ring(tx_personas: Personas) -> None:
    p = tx_personas
    spent = exhaust(daily(p, limit=1))
    services.reopen_sweep()
    roll_over(spent)
    with listening() as bell:
        assert services.reopen_sweep().rung == []
        assert bell.heard() == []


def test_a_paused_queue_does_not_ring_when_its_budget_reopens(tx_personas: Personas) -> None:
    p = tx_personas
    spent = exhaust(daily(p, limit=1))
    push(p, 1)
    services.reopen_sweep()
    QueuePause.objects.create(
        queue="inbox", reason="draining", paused_by=p.pauser, paused_at=timezone.now()
    )
    roll_over(spent)
    with listening() as bell:
        assert services.reopen_sweep().rung == []
        assert bell.heard() == []


def test_two_sweeps_at_once_ring_once(tx_personas: Personas) -> None:
    p = tx_personas
    spent = exhaust(daily(p, limit=1))
    push(p, 1)
    services.reopen_sweep()
    roll_over(spent)
    with listening() as bell:
        results = run_threads(2, lambda i: services.reopen_sweep().rung)
        assert sorted(len(r) for r in results) == [0, 1]
        assert bell.heard() == [ring(p)]


def test_completing_a_claim_rings_the_freed_queue_at_once(tx_personas: Personas) -> None:
    p = tx_personas
    budget(p, max_in_flight=1)
    first, _ = push(p, 2)
    queue_services.claim_next(actor=p.as_agent())
    with listening() as bell:
        queue_services.complete(actor=p.as_agent(), todo_id=first.id)
        assert bell.heard() == [ring(p)]


def test_failing_releasing_and_reaping_ring_the_freed_queue(tx_personas: Personas) -> None:
    p = tx_personas
    budget(p, max_in_flight=1)
    push(p, 2)

    def reap(todo: Todo) -> None:
        lapse(todo)
        queue_services.reap_expired()

    ends: dict[str, Callable[[Todo], object]] = {
        "fail": lambda t: queue_services.fail(actor=p.as_agent(), todo_id=t.id, error="x"),
        "release": lambda t: queue_services.release(actor=p.as_agent(), todo_id=t.id),
        "reap": reap,
    }
    for name, end in ends.items():
        held = queue_services.claim_next(actor=p.as_agent())
        assert isinstance(held, Claimed), name
        with listening() as bell:
            end(held.todo)
            heard = bell.heard()
        assert heard and set(heard) == {ring(p)}, name


def test_a_claim_ending_on_a_full_queue_does_not_ring(tx_personas: Personas) -> None:
    p = tx_personas
    policy = daily(p, limit=1)
    first, _ = push(p, 2)
    queue_services.claim_next(actor=p.as_agent())
    assert window_total(policy) == 1
    with listening() as bell:
        queue_services.complete(actor=p.as_agent(), todo_id=first.id)
        assert bell.heard() == []


def test_raising_a_limit_rings_at_once_and_lowering_does_not(tx_personas: Personas) -> None:
    p = tx_personas
    exhaust(daily(p, limit=1))
    push(p, 1)
    with listening() as bell:
        daily(p, limit=1, max_in_flight=5)  # still spent: no ring
        assert bell.heard() == []
        daily(p, limit=2)
        assert bell.heard() == [ring(p)]
        daily(p, limit=1)
        assert bell.heard() == []


def test_clearing_a_deferred_budget_rings_at_once(tx_personas: Personas) -> None:
    p = tx_personas
    exhaust(daily(p, limit=1))
    push(p, 1)
    with listening() as bell:
        services.policy_clear(actor=p.as_human(), endpoint=p.agent, queue="inbox")
        assert bell.heard() == [ring(p)]


def test_the_reopen_task_is_the_sweep_on_beat(tx_personas: Personas, settings: Any) -> None:
    p = tx_personas
    spent = exhaust(daily(p, limit=1))
    push(p, 1)
    services.reopen_sweep()
    roll_over(spent)
    app.loader.import_default_modules()
    schedule = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert {"admission.tasks.reopen", "admission.tasks.retention"} <= schedule
    with listening() as bell:
        result = app.tasks["admission.tasks.reopen"].apply().get()
        assert result["rung"] == [ring(p)]
        assert bell.heard() == [ring(p)]


def test_the_reopen_command_runs_the_sweep(tx_personas: Personas, capsys: Any) -> None:
    p = tx_personas
    spent = exhaust(daily(p, limit=1))
    push(p, 1)
    services.reopen_sweep()
    roll_over(spent)
    call_command("admission_reopen", "--json")
    assert f'"{ring(p)}"' in capsys.readouterr().out


def test_retention_prunes_windows_older_than_thirty_five_days(personas: Personas) -> None:
    p = personas
    app.loader.import_default_modules()
    policy = budget(p, per="day", limit=5)
    now = timezone.now()
    for days in (1, 30, 34, 36, 90):
        AdmissionWindow.objects.create(
            policy=policy, window_start=now - timedelta(days=days), used=1
        )
    assert app.tasks["admission.tasks.retention"].apply().get() == 2
    kept = sorted((now - w).days for w in policy.windows.values_list("window_start", flat=True))
    assert kept == [1, 30, 34]
