"""When the beat's sweeps last ran, and what the board and /metrics say when they stop (chaos10:
with the worker and beat killed, the board said "at cap" over leases nobody reaped, and nothing
told the operator)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError, transaction
from django.test import Client, RequestFactory
from django.utils import timezone

from queues import tasks
from queues.access import Viewer
from queues.models import SweepRun
from switchboard.console import live
from switchboard.console.board import Filters
from tests.conftest import Personas, push
from tests.web.conftest import signed_in

LATE = "The background sweeps have not run since"


def test_each_sweep_records_when_it_finished_and_what_it_did(personas: Personas) -> None:
    assert not SweepRun.objects.exists()
    for sweep in (tasks.reap_expired, tasks.requeue_due_retries):
        sweep()
    first = dict(SweepRun.objects.values_list("name", "finished_at"))
    assert set(first) == {"reap_expired", "requeue_due_retries"}
    tasks.reap_expired()
    again = SweepRun.objects.get(name="reap_expired")
    assert again.finished_at >= first["reap_expired"] and again.count == 0
    with pytest.raises(IntegrityError), transaction.atomic():
        SweepRun.objects.create(name="made_up", finished_at=timezone.now())


def test_the_board_says_when_the_sweeps_stopped(personas: Personas, settings: Any) -> None:
    settings.SWEEP_INTERVAL_SECONDS = 30
    push(personas, 1)
    client = signed_in(personas.owner)
    assert LATE not in client.get("/").content.decode()  # never ran: a fresh start, not late
    now = timezone.now()
    SweepRun.objects.create(name="reap_expired", finished_at=now - timedelta(seconds=60))
    assert LATE not in client.get("/").content.decode()  # two intervals: not yet late
    SweepRun.objects.filter(name="reap_expired").update(finished_at=now - timedelta(minutes=5))
    SweepRun.objects.create(name="ring_stalled", finished_at=now - timedelta(minutes=4))
    html = client.get("/").content.decode()
    message = html[html.index(LATE) :].split("</p>", 1)[0]
    assert "reap_expired, ring_stalled" in message
    assert "Is the Celery worker or beat running?" in message
    assert "requeue" not in message.split("(")[1].split(")")[0]  # only the late ones named
    SweepRun.objects.update(finished_at=timezone.now())
    assert LATE not in client.get("/").content.decode()


def test_metrics_says_when_each_sweep_last_finished(personas: Personas, client: Client) -> None:
    at = timezone.now() - timedelta(minutes=3)
    SweepRun.objects.create(name="remind_waiting", finished_at=at)
    text = client.get("/metrics", headers={"Authorization": "Bearer test-metrics-token"})
    series = 'switchboard_sweep_finished_timestamp_seconds{sweep="remind_waiting"} '
    (line,) = [x for x in text.content.decode().splitlines() if x.startswith(series)]
    assert abs(float(line.removeprefix(series)) - at.timestamp()) < 0.001


def test_the_live_board_moves_when_a_sweep_falls_late(personas: Personas, settings: Any) -> None:
    settings.SWEEP_INTERVAL_SECONDS = 30
    request = RequestFactory().get("/live")
    request.user = personas.owner
    viewer = Viewer.of(request)
    SweepRun.objects.create(name="reap_expired", finished_at=timezone.now())
    fresh = live.fingerprint_now(viewer, Filters())
    assert live.fingerprint_now(viewer, Filters()) == fresh
    SweepRun.objects.update(finished_at=timezone.now() - timedelta(minutes=5))
    assert live.read_fleet().late_sweeps == ("reap_expired",)
    assert live.fingerprint_now(viewer, Filters()) != fresh
