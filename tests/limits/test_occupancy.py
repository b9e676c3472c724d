"""Occupancy history (issue 13, item 9): claims held per pool and per tag, per minute over the
last 24 h, drawn on the console's occupancy page with its words and a table behind it."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from admission.limits import selectors as limit_selectors
from queues import activity, services
from queues.models import Attempt, Todo
from tests.conftest import Personas, push
from tests.limits.conftest import pool, tag
from tests.web.conftest import signed_in


def test_each_minute_counts_the_most_claims_held_at_once_in_it(personas: Personas) -> None:
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
    assert (
        "pool gpu, last 24 hours, limit now 2 (enforce): 1 held at once at the busiest minute."
        in page
    )
    assert '<polyline class="series-held"' in page
    assert '<th scope="row">' in page  # the minute-by-minute table behind the chart


def test_with_no_limit_declared_the_page_says_how_to_declare_one(personas: Personas) -> None:
    page = signed_in(personas.owner).get("/limits/occupancy").content.decode()
    assert "No pool or tag limit is declared" in page


def _minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def test_claims_one_after_another_are_one_held_not_their_count(personas: Personas) -> None:
    # The page drew "12 held at the busiest minute" beside a limit of 2 for twelve claims made
    # one after another (never more than one held): it counted the claims touching the minute.
    pool("gpu", slots=2)
    agent = personas.as_agent()
    for todo in push(personas, 12, pool="gpu"):
        services.claim(actor=agent, todo_id=todo.id)
        services.complete(actor=agent, todo_id=todo.id)
    [gpu] = activity.occupancy_history(limit_selectors.declared_occupancy_limits())
    assert gpu.peak == 1
    assert sum(gpu.held) <= 2  # the minute of the claims, and at most the one after it


def test_a_minute_holds_the_most_at_once_and_later_minutes_carry_the_level(
    personas: Personas,
) -> None:
    """Made exact on the attempt rows. Minute 0: A and B claimed (2 at once), A ends, C claimed
    while B holds (2 again), B ends. Minute 1: nothing starts or ends (C held: 1). Minute 2: C
    ends at the instant D is claimed (a slot freed and taken again: 1, never 2). Minutes 3 and 4:
    D held."""
    pool("gpu", slots=3)
    agent = personas.as_agent()
    a, b, c, d = push(personas, 4, pool="gpu")
    base = _minute(timezone.now()) - timedelta(minutes=10)
    spans = {a: (1, 5), b: (2, 30), c: (20, 125), d: (125, None)}
    for todo in (a, b, c):
        services.claim(actor=agent, todo_id=todo.id)
    for todo in (a, b, c):
        services.complete(actor=agent, todo_id=todo.id)
    services.claim(actor=agent, todo_id=d.id)
    for todo, (start, end) in spans.items():
        claimed = base + timedelta(seconds=start)
        if end is None:
            Todo.objects.filter(pk=todo.pk).update(claimed_at=claimed)
        else:
            Attempt.objects.filter(todo=todo).update(
                claimed_at=claimed, ended_at=base + timedelta(seconds=end)
            )
    [gpu] = activity.occupancy_history(
        limit_selectors.declared_occupancy_limits(), now=base + timedelta(minutes=4, seconds=30)
    )
    at = dict(zip(gpu.minutes, gpu.held, strict=True))
    assert [at[base + timedelta(minutes=i)] for i in range(5)] == [2, 1, 1, 1, 1]
    assert at[base - timedelta(minutes=1)] == 0
