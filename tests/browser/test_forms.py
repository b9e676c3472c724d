"""Forms in Chromium at both widths, JavaScript on and off: one submit names every wrong field by
its label, each error sits beside its field, and the zone is a searchable list of zones."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from admission import services as admission_services
from admission.models import AdmissionPolicy
from tests.browser.conftest import WIDTHS, Session, screenshot
from tests.browser.helpers import budget, findings
from tests.conftest import Personas


@pytest.mark.parametrize("javascript", [True, False], ids=["js", "nojs"])
@pytest.mark.parametrize("width", WIDTHS)
def test_one_submit_names_every_wrong_field_and_the_zone_is_a_searchable_list(
    session: Session,
    tx_personas: Personas,
    relaxed_policy_writes: Any,
    width: int,
    javascript: bool,
) -> None:
    # JS off is the page with every script refused: axe (a script itself) still runs on it.
    page = session.page(tx_personas.owner, width=width)
    if not javascript:
        page.route("**/*.js", lambda route: route.abort())
    page.goto("/budgets/agent/inbox")
    zone = page.get_by_label("Zone", exact=True)
    # A text field bound to the list of every IANA zone: typing narrows it, any zone can be typed.
    expect(zone).to_have_attribute("list", "zones")
    expect(page.locator('#zones option[value="Europe/Paris"]')).to_have_count(1)
    assert page.locator("#zones option").count() > 300

    page.get_by_label("Max in flight", exact=True).fill("-3")
    page.get_by_label("Max claims per window", exact=True).fill("5")
    zone.fill("Mars/Olympus_Mons")
    page.get_by_label("Start", exact=True).fill("25:99")
    page.get_by_role("button", name="Preview change").click()

    summary = page.locator(".error-summary")
    expect(summary).to_contain_text("3 fields to correct")
    for label in ("Max in flight", "Zone", "Start"):
        expect(summary.get_by_role("link", name=label, exact=True)).to_be_visible()
    expect(page.locator("#id_max_in_flight-error")).to_be_visible()
    expect(page.locator("#id_window_tz-error")).to_contain_text("not a known IANA time zone")
    expect(page.locator("#id_window_start-error")).to_contain_text("HH:MM")
    for field in ("#id_max_in_flight", "#id_window_tz", "#id_window_start"):
        expect(page.locator(field)).to_have_attribute("aria-invalid", "true")
    expect(zone).to_have_value("Mars/Olympus_Mons")  # what was typed is kept
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    assert findings(page) == []
    screenshot(page, f"budget-errors-{width}-{'js' if javascript else 'nojs'}")
    assert not AdmissionPolicy.objects.exists()


@pytest.mark.parametrize("javascript", [True, False], ids=["js", "nojs"])
@pytest.mark.parametrize("width", WIDTHS)
def test_a_save_over_a_budget_changed_since_its_preview_says_so_and_previews_again(
    session: Session,
    tx_personas: Personas,
    relaxed_policy_writes: Any,
    width: int,
    javascript: bool,
) -> None:
    p = tx_personas
    budget(p, max_in_flight=2)
    page = session.page(p.owner, width=width)
    if not javascript:
        page.route("**/*.js", lambda route: route.abort())
    page.goto("/budgets/agent/inbox")
    page.get_by_label("Max in flight", exact=True).fill("3")
    page.get_by_role("button", name="Preview change").click()
    expect(page.locator(".diff")).to_contain_text("2")
    # Someone else changes the budget while the preview is on screen.
    admission_services.policy_set(
        actor=p.as_human(p.admin),
        endpoint=p.agent,
        queue="inbox",
        max_in_flight=5,
        max_claims_per_window=None,
        window=None,
    )
    page.get_by_role("button", name="Save budget").click()
    notice = page.locator("#changed-since-preview")
    expect(notice).to_have_attribute("role", "alert")
    expect(notice).to_contain_text("Not saved. ada changed this budget at")
    old = page.locator(".diff td.old").first
    expect(old).to_have_text("5")  # the preview now compares with the budget as it is
    expect(page.get_by_role("button", name="Save budget")).to_be_focused()
    assert AdmissionPolicy.objects.get().max_in_flight == 5
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    assert findings(page) == []
    screenshot(page, f"budget-changed-since-preview-{width}-{'js' if javascript else 'nojs'}")
    page.get_by_role("button", name="Save budget").click()
    expect(page).to_have_url(re.compile(r"/#edit-agent--inbox$"))
    assert AdmissionPolicy.objects.get().max_in_flight == 3
