"""Throughput at a glance: claims, completions and failures per minute over the last hour per
queue, drawn on the server as SVG with a text alternative; and the agents view, each endpoint's
last sighting and what it holds now. Each page costs the same queries however big the fleet."""

from __future__ import annotations

import html as htmllib
import re
from datetime import UTC, datetime
from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from queues import activity, services
from queues.access import HUMAN_PREFIX
from queues.models import Endpoint
from tests.conftest import FIXTURE, Personas, push
from tests.web.conftest import signed_in


def work(p: Personas, queue: str, *, done: int, failed: int, held: int = 0) -> None:
    """Claims on a queue: some completed, some failed, some still held."""
    agent = p.as_agent()
    for i, todo in enumerate(push(p, done + failed + held, queue=queue)):
        services.claim(actor=agent, todo_id=todo.id, claimant=f"worker-{i}")
        if i < done:
            services.complete(actor=agent, todo_id=todo.id)
        elif i < done + failed:
            services.fail(actor=agent, todo_id=todo.id, error="boom")


def chart_summaries(page: str) -> list[str]:
    return [htmllib.unescape(d) for d in re.findall(r"<desc id=\"[^\"]+\">([^<]*)</desc>", page)]


def test_each_queue_has_a_chart_with_its_last_hour_in_words(personas: Personas) -> None:
    p = personas
    work(p, "inbox", done=3, failed=1, held=1)
    work(p, "outbox", done=1, failed=0)
    # The claims are stamped when their statements ran; on a slow machine they may straddle a
    # minute's turn, so the test puts them all in the current minute (the busiest-minute line).
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE queues_attempt SET claimed_at = date_trunc('minute', now()), "
            "ended_at = date_trunc('minute', now())"
        )
        # The claim in progress (its row is written when it ends).
        cursor.execute(
            "UPDATE queues_todo SET claimed_at = date_trunc('minute', now())"
            " WHERE state = 'claimed'"
        )
    page = signed_in(p.owner).get("/throughput").content.decode()

    summaries = chart_summaries(page)
    assert [s.split(",")[0] for s in summaries] == ["inbox", "outbox"]  # busiest first
    assert summaries[0].startswith("inbox, last hour: 5 claims, 3 completions, 1 failures.")
    assert "Busiest minute: 5 claims at" in summaries[0]
    assert page.count('role="img"') == 2
    assert page.count("<polyline") == 6
    assert "Minute by minute" in page
    assert re.search(r"<td>5</td><td>3</td><td>1</td>", page)


def test_attempts_older_than_an_hour_and_other_owners_queues_are_left_out(
    personas: Personas,
) -> None:
    p = personas
    work(p, "inbox", done=2, failed=0)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE queues_attempt SET claimed_at = now() - interval '2 hours', "
            "ended_at = now() - interval '2 hours'"
        )
    services.claim(actor=p.as_agent(p.foreign), todo_id=push(p, 1, endpoint=p.foreign)[0].id)
    page = signed_in(p.owner).get("/throughput").content.decode()
    assert chart_summaries(page) == []
    assert "Nothing was claimed, completed or failed in the last 60 minutes" in page
    fleet = signed_in(p.admin).get("/throughput").content.decode()
    assert [s.split(",")[0] for s in chart_summaries(fleet)] == ["inbox"]


def test_the_chart_counts_what_happened_in_each_minute(personas: Personas) -> None:
    p = personas
    work(p, "inbox", done=2, failed=1)
    now = timezone.now()
    [data] = activity.throughput([p.agent.id], now=now)
    assert len(data.minutes) == 60 and data.minutes[-1] == now.replace(second=0, microsecond=0)
    assert (data.total("claims"), data.total("completions"), data.total("failures")) == (3, 2, 1)
    assert data.series["claims"][-1] == 3


def test_the_throughput_page_costs_the_same_queries_for_two_queues_or_twelve(
    personas: Personas,
) -> None:
    p = personas
    client = signed_in(p.owner)
    work(p, "inbox", done=1, failed=1)
    with CaptureQueriesContext(connection) as few:
        client.get("/throughput")
    for i in range(10):
        queue = f"q{i}"
        endpoint, _ = services.endpoint_vend(
            actor=FIXTURE, owner=p.owner, name=f"E{i}", queues=[queue], rps=0
        )
        work_on(p, endpoint, queue)
    with CaptureQueriesContext(connection) as many:
        page = client.get("/throughput").content.decode()
    assert len(chart_summaries(page)) == 11
    assert len(many.captured_queries) == len(few.captured_queries)


def work_on(p: Personas, endpoint: Any, queue: str) -> None:
    agent = p.as_agent(endpoint)
    [todo] = push(p, 1, queue=queue, endpoint=endpoint)
    services.claim(actor=agent, todo_id=todo.id)
    services.complete(actor=agent, todo_id=todo.id)


def test_the_agents_view_shows_when_each_was_seen_and_what_it_holds(personas: Personas) -> None:
    p = personas
    work(p, "inbox", done=1, failed=0, held=7)
    services.touch_endpoint(p.agent)
    page = signed_in(p.owner).get("/agents").content.decode()

    first = page.index("agent <span")
    assert page.index(p.agent2.slug) > first  # seen most recently first; agent2 never
    assert "holds 7 todos" in page and "holds nothing" in page
    assert "Last seen: never" in page
    assert page.count('<li><a href="/todos/') == activity.HELD_SHOWN
    assert "and 7 in all" in page
    assert 'href="/?endpoint=agent&amp;state=claimed"' in page
    assert p.foreign.slug not in page
    assert p.foreign.slug in signed_in(p.auditor).get("/agents").content.decode()


def test_the_agents_view_says_when_an_endpoints_ready_hook_gave_up(personas: Personas) -> None:
    # The API and the admin showed it; the page an owner reads about their agents did not.
    p = personas
    failed_at = datetime(2026, 12, 1, 14, 3, 9, tzinfo=UTC)
    Endpoint.objects.filter(pk=p.agent.pk).update(
        hook_failed_at=failed_at, hook_error="<b>Remote end closed connection</b>"
    )
    page = signed_in(p.owner).get("/agents").content.decode()
    agent = page[page.index(f"{p.agent.slug} <span") :]
    assert (
        "Ready hook gave up at 2026-12-01 14:03:09 UTC, after every attempt: "
        "<bdi>&lt;b&gt;Remote end closed connection&lt;/b&gt;</bdi>" in agent.split("</li>")[0]
    )
    assert page.count("Ready hook gave up") == 1  # agent2's hook never failed


def test_the_agents_view_tells_a_persons_claims_from_the_agents(personas: Personas) -> None:
    """An operator's claim in the console is on the endpoint's todo, so the endpoint holds it,
    but the agent did not take it: the count says how many of its claims are people's."""
    p = personas
    work(p, "inbox", done=0, failed=0, held=2)
    person = p.as_human(p.owner, via="console")
    (taken,) = push(p, 1)
    services.claim(actor=person, todo_id=taken.id)
    client = signed_in(p.owner)
    agent_line = re.compile(r"agent-seen.*?</p>", re.S)

    def line() -> str:
        page = client.get("/agents").content.decode()
        return " ".join(agent_line.findall(page)[0].split())

    assert "holds 3 todos</strong> (1 claimed in the console, not by the agent)" in line()
    for todo in activity.agents([p.agent])[0].held:
        if not todo.owner.startswith(HUMAN_PREFIX):
            services.complete(actor=p.as_agent(), todo_id=todo.id)
    assert "holds 1 todo</strong> (claimed in the console, not by the agent)" in line()
    (second,) = push(p, 1)
    services.claim(actor=person, todo_id=second.id)
    assert "holds 2 todos</strong> (all claimed in the console, not by the agent)" in line()
    services.release(actor=person, todo_id=taken.id)
    services.release(actor=person, todo_id=second.id)
    assert "holds nothing</strong> ·" in line()


def test_the_agents_view_costs_the_same_queries_for_three_endpoints_or_thirteen(
    personas: Personas,
) -> None:
    p = personas
    client = signed_in(p.admin)
    work(p, "inbox", done=0, failed=0, held=2)
    with CaptureQueriesContext(connection) as few:
        client.get("/agents")
    for i in range(10):
        endpoint, _ = services.endpoint_vend(
            actor=FIXTURE, owner=p.owner, name=f"E{i}", queues=["inbox"], rps=0
        )
        services.claim(actor=p.as_agent(endpoint), todo_id=push(p, 1, endpoint=endpoint)[0].id)
    with CaptureQueriesContext(connection) as many:
        page = client.get("/agents").content.decode()
    assert page.count("holds 1 todo<") == 10
    assert len(many.captured_queries) == len(few.captured_queries)
