"""An auditor in the browser: reads everything, sees no write control, filters and exports."""

from __future__ import annotations

import csv
import io
import re

from playwright.sync_api import Page, expect

from queues import pauses, services
from switchboard.ledger.models import LedgerEntry
from tests.browser.conftest import Session, screenshot
from tests.browser.helpers import budget
from tests.conftest import Personas, push


def _write_forms(page: Page) -> int:
    """State-changing forms on the page (signing out is not a change to the system)."""
    return page.locator("form[method=post]:not(.logout)").count()


def test_an_auditor_sees_every_page_without_a_single_write_control(
    session: Session, tx_personas: Personas
) -> None:
    p = tx_personas
    (todo,) = push(p, 1)
    services.claim(actor=p.as_human(), todo_id=todo.id)
    budget(p, max_in_flight=3)
    pauses.queue_pause(actor=p.as_human(p.admin), queue="outbox", reason="maintenance")
    for javascript in (True, False):
        page = session.page(p.auditor, javascript=javascript)
        page.goto("/")
        expect(page.locator("#head-agent--inbox")).to_be_visible()
        expect(page.locator("#head-foreign--inbox")).to_be_visible()  # the whole fleet
        assert _write_forms(page) == 0
        expect(page.get_by_role("link", name="Edit budget")).to_have_count(0)
        expect(page.get_by_role("link", name="Set a budget")).to_have_count(0)
        for url in ["/queues", "/queues/outbox", f"/todos/{todo.id}", "/budgets/agent/inbox"]:
            page.goto(url)
            expect(page.locator("main")).to_be_visible()
            assert _write_forms(page) == 0, url
            expect(page.get_by_role("button", name="Resume outbox")).to_have_count(0)
        expect(page.locator("#id_max_in_flight")).to_have_count(0)


def test_an_auditor_filters_the_ledger_and_exports_the_filtered_rows(
    session: Session, tx_personas: Personas
) -> None:
    p = tx_personas
    set_up = LedgerEntry.objects.count()  # the personas' endpoints, vended by system:fixture
    budget(p, max_in_flight=3)
    budget(p, max_in_flight=4)
    pauses.queue_pause(actor=p.as_human(p.admin), queue="outbox", reason="maintenance")
    pauses.queue_resume(actor=p.as_human(p.admin), queue="outbox")
    page = session.page(p.auditor)
    page.goto("/ledger")
    expect(page.locator(".chain-badge")).to_contain_text(f"Chain verified · {set_up + 4} rows")
    expect(page.locator("table.ledger tbody tr")).to_have_count(set_up + 4)
    screenshot(page, "ledger")

    page.select_option("#l-action", "policy.update")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"action=policy.update"))
    rows = page.locator("table.ledger tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("max_in_flight")
    expect(rows.first).to_contain_text("3")
    expect(rows.first).to_contain_text("4")

    page.fill("#l-actor", "ada")
    page.select_option("#l-action", "")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("table.ledger tbody tr")).to_have_count(2)
    with page.expect_download() as info:
        page.get_by_role("link", name="Export CSV").click()
    download = info.value
    assert download.suggested_filename.startswith("ledger-")
    with open(download.path(), encoding="utf-8") as handle:
        exported = list(csv.DictReader(io.StringIO(handle.read())))
    assert [r["action"] for r in exported] == ["queue.resume", "queue.pause"]
    assert {r["actor_human"] for r in exported} == {"ada"}
    assert exported[1]["queue"] == "outbox"
    assert "maintenance" in exported[1]["changes"]
