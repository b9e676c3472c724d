"""axe-core (bundled by axe-playwright-python, nothing fetched at run time) on every console
page, at 1440 and 390 px, with JavaScript on and off: no findings, whatever their impact."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from switchboard.core import counters, ratelimit
from tests.browser.conftest import PHONE, WIDTHS, Session
from tests.browser.helpers import console_pages, findings, small_fleet
from tests.conftest import Personas


@pytest.mark.parametrize("javascript", [True, False], ids=["js", "nojs"])
@pytest.mark.parametrize("width", WIDTHS)
def test_every_page_has_no_accessibility_findings(
    session: Session, tx_personas: Personas, width: int, javascript: bool
) -> None:
    p = tx_personas
    fleet = small_fleet(p)
    # axe itself needs JavaScript (its run resolves a promise), so "JS off" is the page with
    # none of its own scripts: every script request is refused, leaving the server's HTML as is.
    page = session.page(p.admin, width=width)
    if not javascript:
        page.route("**/*.js", lambda route: route.abort())
    found = {}
    # The refusals a typed or stale link meets: a board filter and a ledger date it cannot read.
    refused = ["/?state=faild", "/todos/bulk/discard?queue=In%20Box", "/ledger?since=07/12/2026"]
    for url in [*console_pages(p, fleet), "/?q=todo", "/?condition=dead_letters", *refused]:
        page.goto(url)
        found[url] = findings(page)
        if url in refused:
            expect(page.get_by_role("alert")).to_contain_text(
                "Enter a date as YYYY-MM-DD." if "since" in url else "Refused"
            )
    if width == PHONE:
        page.goto("/")
        page.get_by_text("Menu", exact=True).click()
        found["/ (menu open)"] = findings(page)
    assert {url: f for url, f in found.items() if f} == {}


def test_the_sign_in_page_has_no_accessibility_findings(
    session: Session, transactional_db: None
) -> None:
    page = session.browser.new_page(base_url=session.base)
    try:
        page.goto("/login/")
        assert findings(page) == []
    finally:
        page.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_the_sign_in_page_refusing_a_throttled_account_has_no_findings(
    session: Session, tx_personas: Personas, settings: Any, width: int
) -> None:
    settings.SIGNIN_RATE_LIMIT = (0.001, 1)  # one attempt, then one every ~17 minutes
    redis = counters.client()
    for key in redis.scan_iter(f"{ratelimit._BUCKET}signin:*"):
        redis.delete(key)
    page = session.browser.new_page(base_url=session.base, viewport={"width": width, "height": 900})
    try:
        for password in ("wrong-guess", "pw-olive-123"):
            page.goto("/login/")
            page.get_by_label("Username").fill("olive")
            page.get_by_label("Password").fill(password)
            page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("alert")).to_contain_text("Too many sign-in attempts")
        assert findings(page) == []
    finally:
        page.close()
        for key in redis.scan_iter(f"{ratelimit._BUCKET}signin:*"):
            redis.delete(key)


@pytest.mark.parametrize("javascript", [True, False], ids=["js", "nojs"])
@pytest.mark.parametrize("width", WIDTHS)
def test_skip_links_take_the_keyboard_past_the_top_bar_and_past_the_queues(
    session: Session, tx_personas: Personas, width: int, javascript: bool
) -> None:
    small_fleet(tx_personas)
    page = session.page(tx_personas.admin, width=width, javascript=javascript)
    page.goto("/")
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
    page.keyboard.press("Enter")
    page.keyboard.press("Tab")
    expect(page.locator("#fleet-summary a").first).to_be_focused()
    skip = page.get_by_role("link", name="Skip past the queues")
    skip.focus()
    page.keyboard.press("Enter")
    expect(page.locator("#drawer-end")).to_be_focused()


# What axe finds on the API docs page that is Swagger UI's own markup, drawn by its script, which
# we do not patch: its operation groups are h3 under its h1.
SWAGGER_UIS_OWN = {"heading-order"}


@pytest.mark.parametrize("width", WIDTHS)
def test_the_api_docs_have_no_findings_but_swagger_uis_own(
    session: Session, tx_personas: Personas, width: int
) -> None:
    # templates/ninja/swagger.html (the page's language, a main landmark), static/css/api-docs.css
    # (the theme's colours at 4.5:1, examples unscrolled), static/js/api-docs.js (the request
    # body's editor named) and no deep links (switchboard/api.py: a link inside each operation's
    # button).
    page = session.page(tx_personas.admin, width=width)
    page.goto("/api/v1/docs")
    expect(page.locator(".opblock").first).to_be_visible()
    found = {"collapsed": findings(page)}
    page.locator(".opblock-summary-control").first.click()
    page.get_by_role("button", name="Try it out").first.click()
    page.locator(".json-schema-2020-12-expand-deep-button").first.click()
    expect(page.get_by_role("button", name="Execute")).to_be_visible()
    # The page was checked whole above; what opening an operation and typing into it change is
    # the operation's block (axe takes 3 to 5 s a run on the whole of Swagger UI's page).
    opened = ".opblock.is-open"
    assert page.locator(opened).count() == 1
    found["an operation open, to try"] = findings(page, within=opened)
    # Typed into, the editor is drawn again by Swagger UI: it keeps its name.
    page.get_by_role("textbox", name="Request body (JSON)").fill('{"title": "typed"}')
    expect(page.get_by_role("textbox", name="Request body (JSON)")).to_have_value(
        '{"title": "typed"}'
    )
    found["its body typed"] = findings(page, within=opened)
    assert {
        state: [f for f in got if f.split(" ")[0] not in SWAGGER_UIS_OWN]
        for state, got in found.items()
    } == {"collapsed": [], "an operation open, to try": [], "its body typed": []}
    assert page.locator(".opblock-summary-control a[href]").count() == 0
