"""The budget editor's stacked windows in Chromium: a second window row added, a bad zone in it
refused beside that row's field, then saved."""

from __future__ import annotations

import re
from typing import Any

from playwright.sync_api import expect

from admission.models import AdmissionPolicy
from tests.browser.conftest import Session
from tests.conftest import Personas


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
