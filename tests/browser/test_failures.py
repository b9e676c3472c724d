"""Failures acted on in Chromium, at 1440 and 390 px, with JavaScript on and off: a dead letter's
page shows every attempt's error with its traceback as code, and the board's selection is
retried or discarded through a confirmation page. axe finds nothing on either page."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from queues import services
from queues.models import Todo, TodoState
from tests.browser.conftest import WIDTHS, Session, screenshot
from tests.browser.helpers import findings, sideways_overflow
from tests.conftest import Personas, make_retry_due, push

TRACE = 'Traceback (most recent call last):\n  File "agent.py", line 3, in run\nTimeoutError: upstream took 30 s'


def failing_fleet(p: Personas) -> list[Any]:
    """Three dead letters on inbox, the first failed twice (a traceback, then structured JSON)."""
    todos = push(p, 3, max_attempts=2)
    agent = p.as_agent()
    for t in todos:
        services.claim(actor=agent, todo_id=t.id, claimant="worker-1")
        services.fail(actor=agent, todo_id=t.id, error={"type": "TimeoutError", "traceback": TRACE})
        make_retry_due(t)
        services.claim(actor=agent, todo_id=t.id, claimant="worker-2")
        services.fail(
            actor=agent, todo_id=t.id, error={"type": "ValueError", "detail": {"field": "amount"}}
        )
    push(p, 2)  # pending work the retry leaves alone
    return todos


def mode(javascript: bool) -> str:
    return "js" if javascript else "nojs"


def open_page(session: Session, user: Any, *, width: int, javascript: bool) -> Page:
    """A page as the user sees it. axe needs JavaScript to run, so "JS off" is the page with
    every script of its own refused: the server's HTML as it is, forms posting for real."""
    page = session.page(user, width=width)
    if not javascript:
        page.route("**/*.js", lambda route: route.abort())
    return page


@pytest.mark.parametrize("javascript", [True, False], ids=["js", "nojs"])
@pytest.mark.parametrize("width", WIDTHS)
def test_a_dead_letters_page_shows_every_attempts_error(
    session: Session, tx_personas: Personas, width: int, javascript: bool
) -> None:
    p = tx_personas
    dead = failing_fleet(p)[0]
    page = open_page(session, p.owner, width=width, javascript=javascript)
    page.goto(f"/todos/{dead.id}")

    expect(page.locator(".todo-head .state-label")).to_have_text("dead letter")
    expect(page.locator(".attempt")).to_have_count(2)
    expect(page.get_by_label("Traceback of attempt 1")).to_contain_text(
        "TimeoutError: upstream took 30 s"
    )
    trace_lines = page.get_by_label("Traceback of attempt 1").inner_text().splitlines()
    assert trace_lines[0] == "Traceback (most recent call last):"
    expect(page.get_by_label("Error of attempt 2")).to_contain_text('"field": "amount"')
    assert sideways_overflow(page) == 0
    assert findings(page) == []
    screenshot(page, f"todo-dead-letter-{width}-{mode(javascript)}")


@pytest.mark.parametrize("javascript", [True, False], ids=["js", "nojs"])
@pytest.mark.parametrize("width", WIDTHS)
def test_an_operator_retries_the_dead_letters_after_confirming(
    session: Session, tx_personas: Personas, width: int, javascript: bool
) -> None:
    p = tx_personas
    dead = failing_fleet(p)
    page = open_page(session, p.owner, width=width, javascript=javascript)
    page.goto("/")
    page.get_by_role("navigation", name="Fleet summary").get_by_role(
        "link", name=re.compile("Dead letters")
    ).click()
    page.get_by_role("link", name="Retry the failed ones…").click()

    expect(page.get_by_role("heading", level=1)).to_have_text("Retry 3 todos?")
    expect(page.locator(".bulk-sample li")).to_have_count(3)
    assert Todo.objects.filter(state=TodoState.FAILED).count() == 3  # nothing changed yet
    assert sideways_overflow(page) == 0
    assert findings(page) == []
    screenshot(page, f"bulk-confirm-{width}-{mode(javascript)}")

    page.get_by_role("button", name="Retry 3 todos").click()

    expect(page.locator(".messages")).to_contain_text("Retried 3 todos.")
    assert set(
        Todo.objects.filter(pk__in=[t.id for t in dead]).values_list("state", flat=True)
    ) == {TodoState.PENDING}


@pytest.mark.parametrize("javascript", [True, False], ids=["js", "nojs"])
def test_a_confirmation_gone_stale_is_shown_again_and_nothing_changes(
    session: Session, tx_personas: Personas, javascript: bool
) -> None:
    p = tx_personas
    dead = failing_fleet(p)
    page = session.page(p.owner, javascript=javascript)
    page.goto("/todos/bulk/discard?state=dead_letter")
    expect(page.get_by_role("heading", level=1)).to_have_text("Discard 3 todos?")
    services.todo_retry(actor=p.as_human(p.admin), todo_id=dead[0].id)  # another operator

    page.get_by_role("button", name="Discard 3 todos").click()

    expect(page.get_by_role("alert")).to_contain_text("The selection changed since you looked")
    expect(page.get_by_role("heading", level=1)).to_have_text("Discard 2 todos?")
    assert not Todo.objects.filter(state=TodoState.DISCARDED).exists()
    page.get_by_role("button", name="Discard 2 todos").click()
    expect(page.locator(".messages")).to_contain_text("Discarded 2 todos.")
    assert Todo.objects.filter(state=TodoState.DISCARDED).count() == 2


def test_a_dead_letter_is_discarded_from_the_drawer(
    session: Session, tx_personas: Personas
) -> None:
    p = tx_personas
    dead = failing_fleet(p)[0]
    page = session.page(p.owner)
    page.goto("/?state=dead_letter")
    page.get_by_role("link", name=dead.title).first.click()
    drawer = page.locator("#drawer")
    expect(drawer.locator(".todo-head .state-label")).to_have_text("dead letter")
    drawer.get_by_role("button", name="Discard").click()
    expect(drawer.locator(".todo-head .state-label")).to_have_text("discarded")
    assert Todo.objects.get(pk=dead.pk).state == TodoState.DISCARDED
