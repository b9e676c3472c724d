"""Throughput and agents in Chromium at 1440 and 390 px, JavaScript on and off: the chart is an
image with its words (and a table behind a disclosure that opens without JavaScript), the agents
view lists what each endpoint holds; axe finds nothing, nothing scrolls sideways."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from queues import services
from queues.models import Endpoint
from tests.browser.conftest import PHONE, WIDTHS, Session, screenshot
from tests.browser.helpers import findings, sideways_overflow
from tests.browser.test_failures import mode, open_page
from tests.conftest import Personas, push
from tests.limits.conftest import pool, tag


def busy_fleet(p: Personas) -> None:
    agent = p.as_agent()
    for i, todo in enumerate(push(p, 9)):
        services.claim(actor=agent, todo_id=todo.id, claimant=f"worker-{i % 3}")
        if i < 5:
            services.complete(actor=agent, todo_id=todo.id)
        elif i < 7:
            services.fail(actor=agent, todo_id=todo.id, error="boom")
    for todo in push(p, 2, queue="outbox"):
        services.claim(actor=agent, todo_id=todo.id)
        services.complete(actor=agent, todo_id=todo.id)
    services.touch_endpoint(p.agent)


@pytest.mark.parametrize("javascript", [True, False], ids=["js", "nojs"])
@pytest.mark.parametrize("width", WIDTHS)
def test_the_throughput_page_draws_each_queue_with_its_words(
    session: Session, tx_personas: Personas, width: int, javascript: bool
) -> None:
    busy_fleet(tx_personas)
    page = open_page(session, tx_personas.owner, width=width, javascript=javascript)
    page.goto("/")
    if width == PHONE:
        page.get_by_text("Menu", exact=True).click()
    page.get_by_role("navigation", name="Console").get_by_role("link", name="Throughput").click()
    charts = page.get_by_role("img", name=re.compile("claims, completions and failures"))
    expect(charts).to_have_count(2)
    expect(page.locator("section.chart h2")).to_have_text(["inbox", "outbox"])
    expect(page.locator("section.chart").first.locator(".chart-totals")).to_have_text(
        re.compile(r"9\s*claims\s*5\s*completions\s*2\s*failures")
    )
    page.get_by_text("Minute by minute").first.click()
    expect(page.get_by_role("region", name="inbox, minute by minute")).to_be_visible()
    assert sideways_overflow(page) == 0
    assert findings(page) == []
    screenshot(page, f"throughput-{width}-{mode(javascript)}")


@pytest.mark.parametrize("javascript", [True, False], ids=["js", "nojs"])
@pytest.mark.parametrize("width", WIDTHS)
def test_the_agents_view_shows_what_each_endpoint_holds(
    session: Session, tx_personas: Personas, width: int, javascript: bool
) -> None:
    busy_fleet(tx_personas)
    # A hook that gave up, with the longest error an endpoint keeps and no space in it.
    Endpoint.objects.filter(pk=tx_personas.agent.pk).update(
        hook_failed_at=timezone.now(), hook_error="TimeoutError:" + "x" * 487
    )
    page = open_page(session, tx_personas.owner, width=width, javascript=javascript)
    page.goto("/agents")

    first = page.locator(".agent").first
    expect(first.locator(".agent-name")).to_contain_text("agent")
    expect(first.locator(".agent-seen")).to_contain_text("holds 2 todos")
    expect(first.locator(".held li")).to_have_count(2)
    expect(page.locator(".agent").nth(1).locator(".agent-seen")).to_contain_text("never")
    expect(first.locator(".agent-hook")).to_contain_text("Ready hook gave up at")
    expect(page.locator(".agent-hook")).to_have_count(1)
    assert sideways_overflow(page) == 0
    assert findings(page) == []
    screenshot(page, f"agents-{width}-{mode(javascript)}")


@pytest.mark.parametrize("width", WIDTHS)
def test_the_occupancy_page_draws_each_pool_and_tag_with_its_words(
    session: Session, tx_personas: Personas, width: int
) -> None:
    pool("gpu", slots=2)
    tag("vendor.a", 2)
    for todo in push(tx_personas, 2, pool="gpu", tags=["vendor.a"]):
        services.claim(actor=tx_personas.as_agent(), todo_id=todo.id)
    page = open_page(session, tx_personas.owner, width=width, javascript=True)
    page.goto("/limits/occupancy")
    charts = page.get_by_role("img", name=re.compile("claims held per minute"))
    expect(charts).to_have_count(2)
    expect(page.locator("section.chart h2")).to_have_text(["pool gpu", "tag vendor.a"])
    page.locator("details.chart-data summary").first.click()
    expect(page.get_by_role("region", name="pool gpu, minute by minute")).to_be_visible()
    assert sideways_overflow(page) == 0
    assert findings(page) == []
    screenshot(page, f"occupancy-{width}")
