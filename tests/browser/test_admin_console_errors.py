"""The admin's pages load without an error in the browser's console: nothing they ask for is
refused (every admin page used to ask for /favicon.ico and get a 404)."""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import Page, Request, Route

from tests.browser.conftest import Session
from tests.browser.helpers import LIVE
from tests.conftest import Personas, push

# s: how long the page must ask for nothing before it counts as loaded (Playwright's networkidle).
QUIET = 0.5


class _Watched:
    """What goes wrong as the page loads from now on (refused requests, console errors), and
    which of its requests are still in flight."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.troubles: list[str] = []
        self.in_flight: set[Request] = set()
        page.on("request", self._asked)
        page.on("requestfinished", self._answered)
        page.on("requestfailed", self._answered)
        page.on(
            "response",
            lambda r: self.troubles.append(f"{r.status} {r.url}") if r.status >= 400 else None,
        )
        page.on("console", lambda m: self.troubles.append(m.text) if m.type == "error" else None)

    def _asked(self, request: Request) -> None:
        self.in_flight.add(request)

    def _answered(self, request: Request) -> None:
        self.in_flight.discard(request)

    def settled(self, bound_ms: float = LIVE) -> None:
        """Wait until the page has asked for nothing for QUIET seconds, at most ``bound_ms``.

        Playwright's networkidle did this within the page's 10 s default, and once ran out of it
        on a loaded machine without saying what the page was still waiting for; this names it.
        """
        deadline = time.monotonic() + bound_ms / 1000
        quiet_since: float | None = None
        while True:
            now = time.monotonic()
            if self.in_flight:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= QUIET:
                return
            assert now < deadline, (
                f"{self.page.url}: still loading after {bound_ms / 1000:.0f} s: "
                f"{sorted(r.url for r in self.in_flight)}"
            )
            self.page.wait_for_timeout(50)  # Playwright delivers the page's events meanwhile


def test_the_admin_pages_ask_for_nothing_that_is_not_there(
    session: Session, tx_personas: Personas
) -> None:
    p = tx_personas
    push(p, 1)
    page = session.page(p.admin)
    watched = _Watched(page)
    for url in [
        "/admin/",
        "/admin/queues/endpoint/",
        f"/admin/queues/endpoint/{p.agent.pk}/change/",
        "/admin/queues/todo/",
        "/admin/ledger/ledgerentry/",
    ]:
        response = page.goto(url)
        assert response is not None and response.status == 200, url
        watched.settled()
    assert watched.troubles == []
    # The page names its icon (none), so the browser does not go looking for one.
    assert page.locator('link[rel="icon"]').get_attribute("href") == "data:,"


def test_a_page_still_loading_is_named_not_taken_as_loaded(
    session: Session, tx_personas: Personas
) -> None:
    # The wait above cannot end while a request is unanswered: the admin's stylesheet is held.
    page = session.page(tx_personas.admin)
    held: list[Route] = []

    def hold(route: Route) -> None:
        held.append(route)

    page.route("**/admin/css/base.css", hold)
    watched = _Watched(page)
    page.goto("/admin/", wait_until="commit")
    with pytest.raises(AssertionError, match=r"still loading after 2 s: \[.*/admin/css/base\.css"):
        watched.settled(bound_ms=2000)
    for route in held:
        route.continue_()
    watched.settled()
    assert watched.troubles == []
