"""The admin's pages load without an error in the browser's console: nothing they ask for is
refused (every admin page used to ask for /favicon.ico and get a 404)."""

from __future__ import annotations

from playwright.sync_api import Page

from tests.browser.conftest import Session
from tests.conftest import Personas, push


def _troubles(page: Page) -> list[str]:
    """What goes wrong as the page loads from now on: refused requests, console errors."""
    seen: list[str] = []
    page.on("response", lambda r: seen.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    page.on("console", lambda m: seen.append(m.text) if m.type == "error" else None)
    return seen


def test_the_admin_pages_ask_for_nothing_that_is_not_there(
    session: Session, tx_personas: Personas
) -> None:
    p = tx_personas
    push(p, 1)
    page = session.page(p.admin)
    troubles = _troubles(page)
    for url in [
        "/admin/",
        "/admin/queues/endpoint/",
        f"/admin/queues/endpoint/{p.agent.pk}/change/",
        "/admin/queues/todo/",
        "/admin/ledger/ledgerentry/",
    ]:
        response = page.goto(url)
        assert response is not None and response.status == 200, url
        page.wait_for_load_state("networkidle")
    assert troubles == []
    # The page names its icon (none), so the browser does not go looking for one.
    assert page.locator('link[rel="icon"]').get_attribute("href") == "data:,"
