"""The todo drawer is a dialog for the keyboard: it takes focus, keeps it while open, closes on
Escape or "Close", and gives focus back to the link that opened it."""

from __future__ import annotations

import pytest
from playwright.sync_api import Locator, Page, expect

from tests.browser.conftest import WIDTHS, Session
from tests.browser.helpers import LIVE, findings
from tests.conftest import Personas, push

IN_DRAWER = "document.getElementById('drawer').contains(document.activeElement)"


def _open_by_keyboard(page: Page, link: Locator) -> Locator:
    link.focus()
    page.keyboard.press("Enter")
    drawer = page.locator("#drawer")
    expect(drawer.get_by_role("heading", level=2)).to_be_focused()
    expect(page.locator(".htmx-settling")).to_have_count(0)  # its forms wired by htmx
    return drawer


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("where", ["/?endpoint=agent&queue=inbox", "/queues/inbox"])
def test_the_drawer_keeps_the_keyboard_until_closed_and_gives_it_back_to_its_link(
    session: Session, tx_personas: Personas, where: str, width: int
) -> None:
    # Escape did nothing, Tab walked out of the drawer into the board behind it (hidden under
    # the drawer at 390 px), and Close dropped focus to <body>.
    p = tx_personas
    push(p, 2)
    page = session.page(p.owner, width=width)
    page.goto(where)
    link = page.locator("#sections").get_by_role("link", name="todo 1")
    drawer = _open_by_keyboard(page, link)
    expect(page.get_by_role("dialog", name="todo 1")).to_be_visible()
    assert findings(page) == []

    stops = page.evaluate(
        "Array.from(document.querySelectorAll('#drawer a[href], #drawer button,"
        ' #drawer input:not([type=hidden]), #drawer textarea, #drawer [tabindex="0"]\'))'
        ".length"
    )
    assert stops >= 3  # Close, the links of the facts, the actions, the payload
    seen = set()
    for _ in range(stops + 2):
        page.keyboard.press("Tab")
        assert page.evaluate(IN_DRAWER), "Tab left the open drawer"
        seen.add(page.evaluate("document.activeElement.outerHTML"))
    assert len(seen) == stops  # every stop in it, round again, none outside
    for _ in range(stops + 2):
        page.keyboard.press("Shift+Tab")
        assert page.evaluate(IN_DRAWER), "Shift+Tab left the open drawer"

    page.keyboard.press("Escape")
    expect(drawer).to_be_empty()
    expect(page.get_by_role("dialog")).to_have_count(0)
    expect(link).to_be_focused()

    drawer = _open_by_keyboard(page, link)
    drawer.get_by_role("link", name="Close").focus()
    page.keyboard.press("Enter")
    expect(drawer).to_be_empty()
    expect(link).to_be_focused()


def test_focus_goes_back_to_the_todos_link_when_the_live_board_replaced_it(
    session: Session, tx_personas: Personas
) -> None:
    p = tx_personas
    push(p, 2)
    page = session.page(p.owner)
    page.goto("/?endpoint=agent&queue=inbox")
    expect(page.locator("[data-live-url]")).to_have_attribute("data-live", "open")
    cards = page.locator("#cards-agent--inbox .card")
    link = cards.get_by_role("link", name="todo 1")
    link.evaluate("a => { window.__opener = a; }")
    drawer = _open_by_keyboard(page, link)
    push(p, 1)  # the stream sends the queue's cards again: the opener is replaced
    expect(cards).to_have_count(3, timeout=LIVE)
    assert page.evaluate("!document.body.contains(window.__opener)")
    expect(page.get_by_role("heading", name="todo 1")).to_be_focused()
    page.keyboard.press("Escape")
    expect(drawer).to_be_empty()
    expect(cards.get_by_role("link", name="todo 1")).to_be_focused()
