"""The viewer's zone comes from the browser unless chosen on /prefs/tz; colours follow the
browser's light or dark preference."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import WIDTHS, Session
from tests.conftest import Personas


@pytest.mark.parametrize("width", WIDTHS)
def test_the_browsers_own_zone_is_used_on_the_first_visit(
    session: Session, tx_personas: Personas, width: int
) -> None:
    context = session.context(tx_personas.owner, width=width, tz=None, timezone_id="Europe/Paris")
    page = context.new_page()
    page.goto("/")
    expect(page.locator(".tzlink")).to_have_text("Times in Europe/Paris")
    (cookie,) = [c for c in context.cookies() if c["name"] == "tz"]
    assert cookie["value"] == "Europe/Paris"


def test_a_zone_chosen_on_the_preferences_page_wins_over_the_browsers(
    session: Session, tx_personas: Personas
) -> None:
    page = session.page(tx_personas.owner, tz=None, timezone_id="Europe/Paris")
    page.goto("/")
    expect(page.locator(".tzlink")).to_have_text("Times in Europe/Paris")
    page.locator(".tzlink").click()
    page.fill("#id_tz", "Asia/Tokyo")
    page.get_by_role("button", name="Use this zone").click()
    expect(page).to_have_url(re.compile(r"/$"))
    expect(page.locator(".tzlink")).to_have_text("Times in Asia/Tokyo")
    page.reload()
    expect(page.locator(".tzlink")).to_have_text("Times in Asia/Tokyo")


def test_without_javascript_times_are_in_utc_until_a_zone_is_chosen(
    session: Session, tx_personas: Personas
) -> None:
    page = session.page(tx_personas.owner, javascript=False, tz=None, timezone_id="Europe/Paris")
    page.goto("/")
    expect(page.locator(".tzlink")).to_have_text("Times in UTC")


@pytest.mark.parametrize("javascript", [True, False], ids=["js", "nojs"])
@pytest.mark.parametrize("width", WIDTHS)
def test_the_console_turns_dark_when_the_browser_prefers_dark(
    session: Session, tx_personas: Personas, width: int, javascript: bool
) -> None:
    def background(scheme: str) -> tuple[int, ...]:
        page = session.page(
            tx_personas.owner, width=width, javascript=javascript, color_scheme=scheme
        )
        page.goto("/")
        colour = page.evaluate("getComputedStyle(document.documentElement).backgroundColor")
        return tuple(int(n) for n in re.findall(r"\d+", colour)[:3])

    light, dark = background("light"), background("dark")
    assert sum(light) > 600, light
    assert sum(dark) < 150, dark
