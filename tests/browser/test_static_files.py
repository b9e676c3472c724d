"""Static files through WhiteNoise: the admin arrives styled, at both widths, JS on and off."""

from __future__ import annotations

import pytest
from playwright.sync_api import Response, expect

from tests.browser.conftest import WIDTHS, Session, screenshot
from tests.conftest import Personas


@pytest.mark.parametrize("javascript", [True, False], ids=["js", "nojs"])
@pytest.mark.parametrize("width", WIDTHS)
def test_the_admin_loads_its_stylesheets_and_is_styled(
    session: Session, tx_personas: Personas, width: int, javascript: bool
) -> None:
    page = session.page(tx_personas.admin, width=width, javascript=javascript)
    static: list[Response] = []
    page.on("response", lambda r: static.append(r) if "/static/" in r.url else None)
    page.goto("/admin/")
    expect(page.get_by_role("heading", name="Site administration")).to_be_visible()

    stylesheets = [r for r in static if r.url.endswith(".css")]
    assert any(r.url.endswith("/static/admin/css/base.css") for r in stylesheets)
    assert [r.url for r in static if r.status != 200] == []
    # The stylesheet is applied, not only fetched: the admin's header has its coloured bar.
    header = page.locator("#header")
    background = header.evaluate("el => getComputedStyle(el).backgroundColor")
    assert background not in ("rgba(0, 0, 0, 0)", "transparent")
    screenshot(page, f"admin-{width}-{'js' if javascript else 'nojs'}")
