"""Occupancy history (issue 13, item 9): claims held per pool and per tag, per minute over the
last 24 h, drawn on the console's occupancy page with its words and a table behind it."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from admission.limits import selectors as limit_selectors
from queues import activity, services
from tests.conftest import Personas, push
from tests.limits.conftest import pool, tag
from tests.web.conftest import signed_in


def test_each_minute_counts_the_claims_held_in_it(personas: Personas) -> None:
    pool("gpu", slots=3)
    tag("vendor.a", 2)
    agent = personas.as_agent()
    first, second, third = push(personas, 3, pool="gpu", tags=["vendor.a"])
    for todo in (first, second):
        services.claim(actor=agent, todo_id=todo.id)
    services.complete(actor=agent, todo_id=first.id)
    later = timezone.now() + timedelta(minutes=3)
    histories = activity.occupancy_history(limit_selectors.declared_occupancy_limits(), now=later)
    assert [(h.kind, h.name, h.limit, len(h.minutes)) for h in histories] == [
        ("pool", "gpu", 3, 1440),
        ("tag", "vendor.a", 2, 1440),
    ]
    gpu = histories[0]
    # Both were held in the minute of the claims; the second is still held three minutes on.
    assert gpu.peak == 2 and gpu.held[-1] == 1 and sum(gpu.held) >= 2 + 3
    assert gpu.held[:-5] == [0] * (1440 - 5)  # nothing before
    assert third.id and histories[1].held == gpu.held


def test_the_occupancy_page_draws_each_limit_with_its_words(personas: Personas) -> None:
    pool("gpu", slots=2)
    [todo] = push(personas, 1, pool="gpu")
    services.claim(actor=personas.as_agent(), todo_id=todo.id)
    page = signed_in(personas.auditor).get("/limits/occupancy").content.decode()
    assert '<h2 id="chart-1-title">pool gpu</h2>' in page
    assert "pool gpu, last 24 hours, limit 2 (enforce): 1 held at the busiest minute." in page
    assert '<polyline class="series-held"' in page
    assert '<th scope="row">' in page  # the minute-by-minute table behind the chart


def test_with_no_limit_declared_the_page_says_how_to_declare_one(personas: Personas) -> None:
    page = signed_in(personas.owner).get("/limits/occupancy").content.decode()
    assert "No pool or tag limit is declared" in page
