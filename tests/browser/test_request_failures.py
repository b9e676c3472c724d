"""A request the page sends that comes back refused without a swap, or gets no answer, is said
above the page (static/js/console.js): a pause pressed while the database is down, or while the
network drops, left the page as it was without a word, so the queue looked paused. The form
keeps what was typed; the notice goes once a request succeeds."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from queues.models import QueuePause
from tests.browser.conftest import WIDTHS, Session
from tests.browser.helpers import findings, sideways_overflow
from tests.conftest import Personas, database_down, push


@pytest.mark.parametrize("width", WIDTHS)
def test_a_pause_pressed_while_the_database_is_down_says_it_was_not_done(
    session: Session, tx_personas: Personas, width: int
) -> None:
    p = tx_personas
    push(p, 1)
    page = session.page(p.admin, width=width)
    page.goto("/?endpoint=agent&queue=inbox")
    head = page.locator("#head-agent--inbox")
    expect(head.locator(".badge")).to_have_text("Healthy")
    notice = page.locator("#request-failed")
    expect(notice).to_be_hidden()
    page.fill("#pause-agent--inbox-reason", "upgrading the consumer")
    with database_down():
        page.get_by_role("button", name="Pause").click()
        expect(notice).to_be_visible()
    expect(notice).to_have_attribute("role", "alert")
    expect(notice).to_contain_text("the database did not answer in time; nothing was changed")
    expect(page.locator("#pause-agent--inbox-reason")).to_have_value("upgrading the consumer")
    expect(head.locator(".badge")).to_have_text("Healthy")
    assert not QueuePause.objects.exists()
    assert findings(page) == []
    assert sideways_overflow(page) == 0

    page.get_by_role("button", name="Pause").click()  # the database is back
    expect(head.locator(".badge")).to_have_text("Paused")
    expect(notice).to_be_hidden()
    assert QueuePause.objects.filter(queue="inbox").exists()


def test_a_pause_whose_request_got_no_answer_says_so_until_dismissed(
    session: Session, tx_personas: Personas
) -> None:
    p = tx_personas
    push(p, 1)
    page = session.page(p.admin)
    page.goto("/?endpoint=agent&queue=inbox")
    page.route("**/queues/inbox/pause", lambda route: route.abort())
    page.fill("#pause-agent--inbox-reason", "upgrading the consumer")
    page.get_by_role("button", name="Pause").click()
    notice = page.locator("#request-failed")
    expect(notice).to_be_visible()
    expect(notice).to_contain_text("The server did not answer")
    assert not QueuePause.objects.exists()
    notice.get_by_role("button", name="Dismiss").click()
    expect(notice).to_be_hidden()


@pytest.mark.parametrize("width", WIDTHS)
def test_a_page_loaded_while_the_database_is_down_says_so_and_when_to_try_again(
    session: Session, tx_personas: Personas, width: int
) -> None:
    """The page made without the database (templates/refused.html), as a phone and a laptop
    show it: readable, nothing sideways, a way to load it again; axe finds nothing."""
    p = tx_personas
    page = session.page(p.owner, width=width)
    with database_down():
        answer = page.goto("/queues/inbox?state=pending")
        assert answer is not None and answer.status == 503
        expect(page.get_by_role("heading", level=1)).to_have_text(
            "Switchboard cannot answer right now"
        )
        expect(page.get_by_role("alert")).to_contain_text("the database did not answer in time")
        again = page.get_by_role("link", name="load this page again")
        expect(again).to_have_attribute("href", "/queues/inbox?state=pending")
        assert findings(page) == []
        assert sideways_overflow(page) == 0
    again.click()  # the database is back
    expect(page.get_by_role("heading", level=1)).not_to_have_text(
        "Switchboard cannot answer right now"
    )
