"""The sweeps wired through real Celery: beat's schedule names them, a real worker on the real
Redis broker runs them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings

from queues import services, tasks
from queues.models import Todo, TodoState
from switchboard.celery import app
from tests.celery_worker import real_worker
from tests.conftest import Personas, claim_and_lapse, make_retry_due, push


@pytest.fixture
def celery_worker(tx_personas: Personas) -> Iterator[Any]:
    with real_worker() as worker:
        yield worker


def wait_for_state(todo_id: Any, state: str, timeout: float = 30.0) -> bool:
    """Poll the database until the worker's sweep has moved the todo (a functional wait)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if Todo.objects.get(pk=todo_id).state == state:
            return True
        time.sleep(0.1)
    return False


def test_beat_runs_every_sweep_on_the_interval() -> None:
    schedule: dict[str, dict[str, Any]] = settings.CELERY_BEAT_SCHEDULE
    names = {entry["task"] for entry in schedule.values()}
    assert {"queues.tasks.reap_expired", "queues.tasks.requeue_due_retries"} <= names
    for entry in schedule.values():
        if entry["task"].startswith("queues.tasks."):
            assert entry["schedule"] == settings.SWEEP_INTERVAL_SECONDS == 30
        assert entry["task"] in app.tasks or entry["task"].split(".")[0] == "admission"


def test_a_real_worker_reaps_and_requeues(celery_worker: Any, tx_personas: Personas) -> None:
    p = tx_personas
    lapsed, due = push(p, 2)
    claim_and_lapse(p, [lapsed])
    services.claim(actor=p.as_agent(), todo_id=due.id)
    services.fail(actor=p.as_agent(), todo_id=due.id)
    make_retry_due(due)
    tasks.reap_expired.delay()
    assert wait_for_state(lapsed.id, TodoState.PENDING)
    assert Todo.objects.get(pk=due.pk).state == TodoState.FAILED  # not the reaper's row
    tasks.requeue_due_retries.delay()
    assert wait_for_state(due.id, TodoState.PENDING)
