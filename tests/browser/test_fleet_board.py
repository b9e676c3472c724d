"""A large fleet's board in Chromium (100 identities, 10,000 todos): the summary on top, trouble
first, healthy queues one line each, a summary link that filters; at both widths, JS on and off.
The screenshots land in tests/artifacts/."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from bench.fleet import seed
from tests.browser.conftest import WIDTHS, Session, screenshot
from tests.browser.helpers import findings


@pytest.fixture
def fleet(transactional_db: None, relaxed_policy_writes: Any) -> Any:
    return seed(identities=100, todos=10_000, ledger_rows=0, prefix="fleet")


@pytest.mark.parametrize("javascript", [True, False], ids=["js", "nojs"])
@pytest.mark.parametrize("width", WIDTHS)
def test_the_large_fleets_board_puts_the_summary_and_trouble_first(
    session: Session, fleet: Any, width: int, javascript: bool
) -> None:
    page = session.page(fleet.owner, width=width, javascript=javascript)
    page.goto("/")
    summary = page.get_by_role("navigation", name="Fleet summary")
    expect(summary).to_contain_text("100 queue identities")
    expect(summary).to_contain_text("85 Healthy")
    # Whole on the first screen, by a check that retries: the live stream may replace the summary
    # at any moment (it re-sends it with the list), and a box read once from an element swapped
    # out under it is None (CI saw that once).
    expect(summary).to_be_in_viewport(ratio=1)
    first = page.locator("section.qsection").first
    expect(first.locator(".badge").first).to_have_text(re.compile("^Paused"))
    expect(page.locator(".qline")).to_have_count(85)
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    if javascript:  # axe runs as a script; tests/browser/test_accessibility.py covers JS off
        assert findings(page) == []  # the folded lines and the summary at scale
    name = f"board-large-{width}-{'js' if javascript else 'nojs'}"
    screenshot(page, name)
    screenshot(page, f"{name}-first-screen", full_page=False)

    summary.get_by_role("link", name=re.compile("Dead letters")).click()
    expect(page).to_have_url(re.compile(r"state=dead_letter&condition=dead_letters"))
    expect(page.locator("section.qsection")).to_have_count(len(fleet.trouble["dead_letters"]))
    expect(page.locator(".card .state-label").first).to_have_text("dead letter")


def test_searching_the_fleet_finds_a_todo_by_its_payload(session: Session, fleet: Any) -> None:
    page = session.page(fleet.owner)
    page.goto("/")
    page.get_by_label("Search").fill("INV-4242")
    page.get_by_role("button", name="Filter").click()
    # The filtered board replaces the whole one, then its address is pushed (htmx): wait for
    # that under the session's timeout, not expect's 5 s (a CI host stealing a third of the CPU
    # took longer to render a 700-todo board twice).
    page.wait_for_url(re.compile(r"[?&]q=INV-4242"))
    expect(page.locator(".card-title")).to_have_text(["Summarise invoice 4242"])
    expect(page.locator("section.qsection")).to_have_count(1)
