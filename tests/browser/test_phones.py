"""The console on a phone (390 px) and a laptop (1440 px): nothing scrolls sideways, the top bar
folds into a menu (a <details>, so JavaScript is not needed), the drawer is a full-screen sheet."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from admission.models import AdmissionPolicy
from tests.browser.conftest import DESKTOP, PHONE, WIDTHS, Session, screenshot
from tests.browser.helpers import (
    LONG_QUEUE,
    LONG_SLUG,
    console_pages,
    long_fleet,
    long_pages,
    sideways_overflow,
    small_fleet,
)
from tests.conftest import Personas


@pytest.mark.parametrize("javascript", [True, False], ids=["js", "nojs"])
@pytest.mark.parametrize("width", WIDTHS)
def test_no_page_scrolls_sideways(
    session: Session, tx_personas: Personas, width: int, javascript: bool
) -> None:
    p = tx_personas
    fleet = small_fleet(p)
    page = session.page(p.admin, width=width, javascript=javascript)
    for url in console_pages(p, fleet):
        page.goto(url)
        assert sideways_overflow(page) == 0, url
    page.goto("/")
    screenshot(page, f"board-small-{width}-{'js' if javascript else 'nojs'}")


@pytest.mark.parametrize("javascript", [True, False], ids=["js", "nojs"])
@pytest.mark.parametrize("width", WIDTHS)
def test_the_longest_names_and_texts_wrap_instead_of_widening_a_page(
    session: Session, tx_personas: Personas, width: int, javascript: bool
) -> None:
    # A 64-character queue made its page 3,844 px too wide at 1440 px, a 500-character title
    # the todo's page 8,688 px: every name and text an agent or operator may give, at its
    # longest with no space in it, stays inside the window.
    p = tx_personas
    fleet = long_fleet(p)
    page = session.page(p.admin, width=width, javascript=javascript)
    for url in long_pages(fleet):
        page.goto(url)
        assert sideways_overflow(page) == 0, url
    page.goto(f"/budgets/{LONG_SLUG}/{LONG_QUEUE}")
    page.get_by_role("button", name="Preview change").click()
    expect(page.get_by_role("heading", name="Preview: what this change does now")).to_be_visible()
    assert sideways_overflow(page) == 0, "the budget preview"
    page.goto(f"/todos/{fleet['failed'].id}")
    screenshot(page, f"todo-longest-{width}-{'js' if javascript else 'nojs'}")


def test_on_a_phone_a_tables_short_words_stay_whole_and_the_table_scrolls_instead(
    session: Session, tx_personas: Personas
) -> None:
    # Long words may break anywhere in the page's text, but not in a table: there that let a
    # 390 px ledger squeeze its columns until each field name of its changes broke over several
    # lines (a page 9,936 px tall). A table too wide scrolls in its own region.
    p = tx_personas
    small_fleet(p)
    page = session.page(p.admin, width=PHONE)
    for url, words in (("/ledger", ".diff-key"), ("/queues", "tbody th a")):
        page.goto(url)
        lines = page.eval_on_selector_all(words, "els => els.map(e => e.getClientRects().length)")
        assert lines and set(lines) == {1}, f"{url} {words}: line boxes {lines}"


@pytest.mark.parametrize("width", WIDTHS)
def test_the_admins_pages_with_the_longest_values_do_not_scroll_sideways(
    session: Session, tx_personas: Personas, width: int
) -> None:
    # The todo's change page was 7,723 px too wide at 1440 px: its title in the breadcrumb,
    # its payload and result read-only, its attempts' claimant in the inline table.
    p = tx_personas
    fleet = long_fleet(p)
    policy = AdmissionPolicy.objects.get(queue=LONG_QUEUE)
    page = session.page(p.admin, width=width)
    for url in (
        "/admin/queues/todo/",
        f"/admin/queues/todo/{fleet['failed'].id}/change/",
        "/admin/queues/endpoint/",
        f"/admin/queues/endpoint/{policy.endpoint_id}/change/",
        "/admin/admission/admissionpolicy/",
        f"/admin/admission/admissionpolicy/{policy.pk}/change/",
        f"/admin/admission/admissionpolicy/{policy.pk}/delete/",
        "/admin/queues/queuepause/",
        f"/admin/queues/queuepause/{LONG_QUEUE}/change/",
        "/admin/queues/attempt/",
        "/admin/ledger/ledgerentry/",
    ):
        response = page.goto(url)
        assert response is not None and response.status == 200, url
        assert sideways_overflow(page) == 0, url


@pytest.mark.parametrize("javascript", [True, False], ids=["js", "nojs"])
def test_on_a_phone_the_top_bar_folds_into_a_menu(
    session: Session, tx_personas: Personas, javascript: bool
) -> None:
    page = session.page(tx_personas.admin, width=PHONE, javascript=javascript)
    page.goto("/")
    nav = page.get_by_role("navigation", name="Console")
    expect(nav).to_be_hidden()
    page.get_by_text("Menu", exact=True).click()
    expect(nav).to_be_visible()
    nav.get_by_role("link", name="Ledger").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("Ledger")
    expect(page.get_by_role("button", name="Sign out")).to_be_hidden()
    page.get_by_text("Menu", exact=True).click()
    expect(page.get_by_role("button", name="Sign out")).to_be_visible()
    # Everything in the open menu stays on the bar, inside the window.
    box = page.locator(".topbar").bounding_box()
    assert box is not None and box["width"] <= PHONE
    screenshot(page, f"menu-open-{PHONE}-{'js' if javascript else 'nojs'}")


def test_on_a_laptop_the_top_bar_shows_everything_without_a_menu(
    session: Session, tx_personas: Personas
) -> None:
    page = session.page(tx_personas.admin, width=DESKTOP)
    page.goto("/")
    expect(page.get_by_text("Menu", exact=True)).to_be_hidden()
    expect(page.get_by_role("navigation", name="Console")).to_be_visible()
    expect(page.get_by_role("button", name="Sign out")).to_be_visible()
    box = page.locator(".topbar").bounding_box()
    assert box is not None and box["height"] < 60  # one line


def test_on_a_phone_the_drawer_is_a_full_screen_sheet(
    session: Session, tx_personas: Personas
) -> None:
    p = tx_personas
    small_fleet(p)
    page = session.page(p.owner, width=PHONE)
    page.goto("/?queue=inbox")
    page.locator(".card-title").first.click()
    drawer = page.locator("#drawer")
    expect(drawer.get_by_role("heading", level=2)).to_be_visible()
    box = drawer.bounding_box()
    assert box is not None
    assert (box["x"], box["y"], box["width"]) == (0, 0, PHONE)
    assert sideways_overflow(page) == 0
    screenshot(page, f"drawer-{PHONE}")
    drawer.get_by_role("link", name="Close").click()
    expect(drawer).to_be_empty()
