"""Stacked windows in Chromium: the budget editor's second window row added, a bad zone in it
refused beside that row's field, then saved; and the board's strip with three windows at 1440
and 390 px."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from admission.models import AdmissionPolicy
from queues import services
from tests.admission.test_stacked_windows import day, stacked, week
from tests.browser.conftest import WIDTHS, Session
from tests.browser.helpers import findings, sideways_overflow
from tests.conftest import Personas, push


def test_an_owner_adds_a_second_window_and_a_bad_zone_in_it_is_named_on_that_row(
    session: Session, tx_personas: Personas, relaxed_policy_writes: Any
) -> None:
    p = tx_personas
    page = session.page(p.owner)
    page.goto("/budgets/agent/inbox")
    page.fill("#id_max_claims_per_window", "100")
    page.select_option("#id_window_period", "hour")
    page.fill("#id_window_tz", "Europe/Berlin")
    page.get_by_role("button", name="Add a window").click()
    expect(page.locator("#window-row-2")).to_contain_text("Window 2")
    expect(page.locator("#id_more-0-limit")).to_be_focused()
    expect(page.locator("#id_max_claims_per_window")).to_have_value("100")

    page.fill("#id_more-0-limit", "1000")
    page.select_option("#id_more-0-period", "day")
    page.fill("#id_more-0-tz", "Mars/Olympus_Mons")
    page.get_by_role("button", name="Preview change").click()
    expect(page.locator("#id_more-0-tz-error")).to_contain_text("not a known IANA time zone")
    expect(page.locator("#id_more-0-tz")).to_have_attribute("aria-invalid", "true")
    expect(page.locator(".error-summary")).to_contain_text("Window 2 · Zone")
    expect(page.locator("#id_window_tz-error")).to_have_count(0)
    assert not AdmissionPolicy.objects.exists()

    page.fill("#id_more-0-tz", "Europe/Berlin")
    page.get_by_role("button", name="Preview change").click()
    expect(page.locator(".preview")).to_contain_text("0 of 1000")
    page.get_by_role("button", name="Save budget").click()
    expect(page).to_have_url(re.compile(r"/#edit-agent--inbox$"))
    policy = AdmissionPolicy.objects.get(endpoint=p.agent, queue="inbox")
    assert (policy.max_claims_per_window, policy.window_period) == (100, "hour")
    assert policy.extra_windows == [
        {"limit": 1000, "period": "day", "tz": "Europe/Berlin", "start": "00:00", "weekday": None}
    ]

    page.goto("/budgets/agent/inbox")
    expect(page.locator("#id_more-0-limit")).to_have_value("1000")


@pytest.mark.parametrize("width", WIDTHS)
def test_the_board_shows_every_stacked_window_within_a_phone_and_passes_axe(
    session: Session, tx_personas: Personas, relaxed_policy_writes: Any, width: int
) -> None:
    """Three windows, one in a long zone name, the binding one marked: each has its gauge on the
    board's strip, nothing scrolls sideways at 390 px, and axe finds nothing."""
    p = tx_personas
    stacked(p, day(5), week(2), {**day(9), "tz": "America/Argentina/Buenos_Aires"})
    push(p, 3)
    agent = p.as_agent()
    for _ in range(2):
        assert services.claim_next(actor=agent, claimant="worker-1") is not None
    page = session.page(p.owner, width=width)
    page.goto("/?queue=inbox")
    gauges = page.locator(".gauge").filter(has_text=re.compile(r"window \d"))
    expect(gauges).to_have_count(3)
    expect(gauges.nth(0)).to_contain_text("2 of 5")
    expect(gauges.nth(1)).to_contain_text("2 of 2")
    expect(gauges.nth(1).locator(".binding-mark")).to_have_text("binding")
    expect(page.locator(".binding-mark")).to_have_count(1)
    expect(gauges.nth(2)).to_contain_text("2 of 9")
    for i in range(3):
        box = gauges.nth(i).bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width, (i, box)
    assert sideways_overflow(page) == 0
    assert findings(page) == []
