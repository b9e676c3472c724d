"""The admission series at /metrics: statuses with zeros, deferred todos, charges and refusals,
and a collector failure that omits the series rather than report zeros."""

from __future__ import annotations

from datetime import UTC, timedelta

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from admission import selectors
from admission.models import AdmissionPolicy
from queues import services
from tests.admission.conftest import budget
from tests.conftest import Personas, push

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape() -> Samples:
    response = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer test-metrics-token")
    assert response.status_code == 200
    out: Samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def series(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


def far_start() -> str:
    return (timezone.now() + timedelta(hours=12)).astimezone(UTC).strftime("%H:00")


STATUSES = ["admitted", "window_exhausted", "in_flight_full", "paused", "admission_unavailable"]


def test_every_status_of_every_budgeted_queue_is_reported_zeros_included(
    tx_personas: Personas,
) -> None:
    p = tx_personas
    budget(p, "inbox", per="day", limit=1, start=far_start())
    budget(p, "outbox", max_in_flight=5)
    broken = budget(p, "inbox", endpoint=p.agent2, per="day", limit=5, start=far_start())
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE admission_admissionpolicy SET window_tz = 'Mars/Olympus_Mons' WHERE id = %s",
            [broken.id],
        )
    push(p, 3, queue="inbox")
    push(p, 2, queue="inbox", endpoint=p.agent2)
    push(p, 1, queue="outbox")
    assert isinstance(services.claim_next(actor=p.as_agent(), queue="inbox"), services.Claimed)
    services.claim_next(actor=p.as_agent(), queue="inbox")  # refused: window_exhausted
    before = series(scrape(), "switchboard_metrics_collection_errors_total")
    samples = scrape()
    policies = series(samples, "switchboard_admission_policies")
    expected = {(("queue", q), ("status", s)): 0.0 for q in ("inbox", "outbox") for s in STATUSES}
    expected[(("queue", "inbox"), ("status", "window_exhausted"))] = 1.0
    expected[(("queue", "inbox"), ("status", "admission_unavailable"))] = 1.0
    expected[(("queue", "outbox"), ("status", "admitted"))] = 1.0
    assert policies == expected
    deferred = series(samples, "switchboard_admission_deferred_todos")
    assert deferred[(("queue", "inbox"), ("reason", "window_exhausted"))] == 2.0
    assert deferred[(("queue", "inbox"), ("reason", "admission_unavailable"))] == 2.0
    assert deferred[(("queue", "outbox"), ("reason", "window_exhausted"))] == 0.0
    assert series(samples, "switchboard_admission_charged_total") == {(("queue", "inbox"),): 1.0}
    refusals = series(samples, "switchboard_admission_refusals_total")
    assert refusals == {(("queue", "inbox"), ("reason", "window_exhausted")): 1.0}
    # A stored zone the tz database lacks is a status, not a collector failure.
    assert series(samples, "switchboard_metrics_collection_errors_total") == before


def test_a_collector_failure_omits_the_admission_series_and_counts_the_error(
    personas: Personas, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = personas
    budget(p, max_in_flight=1)
    push(p, 1)
    key = (("collector", "admission"),)
    before = series(scrape(), "switchboard_metrics_collection_errors_total")[key]

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the evaluation failed")

    monkeypatch.setattr(selectors, "evaluate_policies", broken)
    samples = scrape()
    assert series(samples, "switchboard_admission_policies") == {}
    assert series(samples, "switchboard_admission_deferred_todos") == {}
    assert series(samples, "switchboard_metrics_collection_errors_total")[key] == before + 1
    # The other collectors carry on.
    assert series(samples, "switchboard_queue_todos")


def test_a_queue_without_a_budget_reports_no_admission_status(personas: Personas) -> None:
    push(personas, 1)
    assert not AdmissionPolicy.objects.exists()
    assert series(scrape(), "switchboard_admission_policies") == {}
