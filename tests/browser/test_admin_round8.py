"""The admin (round 8) in Chromium: a todo's list and page say what it waits on and when it runs,
in the viewer's zone, which the page names (the browser's own on a first visit); the pause and
budget forms refuse beside the field; pausing a paused queue says only that; the ledger's scope
filter names a blank scope. axe finds nothing, at any impact, on any of them."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from queues import pauses, services
from queues.models import QueuePause
from switchboard.ledger import chain
from switchboard.ledger.models import LedgerEntry, LedgerKind
from tests.browser.conftest import VIEWER_ZONE, WIDTHS, Session, screenshot
from tests.browser.helpers import budget, findings
from tests.conftest import Personas, push


@pytest.mark.parametrize("width", WIDTHS)
def test_the_todo_list_and_page_say_what_a_todo_waits_on_and_when(
    session: Session, tx_personas: Personas, width: int
) -> None:
    p = tx_personas
    first, held = push(p, 2)
    budget(p, "inbox", max_claims_per_window=1)
    services.claim(actor=p.as_human(), todo_id=first.id)
    [paused] = push(p, 1, queue="outbox")
    pauses.queue_pause(actor=p.as_human(p.admin), queue="outbox", reason="upgrading")
    page = session.page(p.admin, width=width)
    page.goto("/admin/queues/todo/")
    expect(page.locator("#user-tools .tzlink")).to_have_text(f"Times in {VIEWER_ZONE}")
    expect(page.locator("#result_list thead")).to_contain_text("Waiting on")
    expect(page.locator("#result_list thead")).to_contain_text("Runs at")
    row = page.locator("#result_list tbody tr", has=page.locator(f'a[href*="{held.pk}"]'))
    expect(row.locator("td.field-waiting_on")).to_have_text("budget (window exhausted)")
    # The window resets at midnight in Los Angeles: 03:00 in New York.
    expect(row.locator("td.field-runs_at")).to_contain_text("3 a.m.")
    row = page.locator("#result_list tbody tr", has=page.locator(f'a[href*="{paused.pk}"]'))
    expect(row.locator("td.field-waiting_on")).to_have_text("pause (paused)")
    expect(row.locator("td.field-runs_at")).to_have_text("when an operator acts")
    assert findings(page) == []
    page.goto(f"/admin/queues/todo/{held.pk}/change/")
    expect(page.locator(".field-waiting_on .readonly")).to_have_text("budget (window exhausted)")
    gates = page.locator(".field-gates .gate")
    expect(gates).to_have_count(2)
    expect(gates.nth(0)).to_contain_text("pause: admits — inbox is not paused")
    expect(gates.nth(1)).to_contain_text("budget: holds (window exhausted), eligible")
    screenshot(page, f"admin-round8-todo-{width}")
    assert findings(page) == []


def test_the_admin_takes_the_browsers_zone_on_a_first_visit(
    session: Session, tx_personas: Personas
) -> None:
    context = session.context(tx_personas.admin, tz=None, timezone_id="Asia/Tokyo")
    page = context.new_page()
    page.goto("/admin/queues/todo/")
    expect(page.locator("#user-tools .tzlink")).to_have_text("Times in Asia/Tokyo")
    (cookie,) = [c for c in context.cookies() if c["name"] == "tz"]
    assert cookie["value"] == "Asia/Tokyo"


@pytest.mark.parametrize("width", WIDTHS)
def test_the_pause_form_refuses_beside_each_field_and_a_second_pause_says_only_that(
    session: Session, tx_personas: Personas, width: int
) -> None:
    p = tx_personas
    push(p, 1)
    page = session.page(p.admin, width=width)

    def pause(queue: str, reason: str) -> None:
        page.goto("/admin/queues/queuepause/add/")
        page.locator("#id_queue").fill(queue)
        page.locator("#id_reason").fill(reason)
        page.locator('input[name="_save"]').click()

    pause("bad name", "x")
    expect(page.locator(".field-queue .errorlist")).to_have_text(
        "queue must be 1-64 letters, digits, '.', '_', ':' or '-', starting with a letter or digit"
    )
    expect(page.locator(".errorlist.nonfield")).to_have_count(0)
    assert findings(page) == []
    pause("inbox", "r" * 501)
    expect(page.locator(".field-reason .errorlist")).to_have_text(
        "reason is at most 500 characters"
    )
    expect(page.locator(".errorlist.nonfield")).to_have_count(0)
    pause("typo", "x")
    expect(page.locator(".field-queue .errorlist")).to_have_text(
        "no queue named 'typo' is known; to pause it anyway, tick “Create”"
    )
    expect(page.locator(".errorlist.nonfield")).to_have_count(0)
    # The box the message names is there, by that name.
    expect(page.get_by_label("Create")).not_to_be_checked()
    assert not QueuePause.objects.exists()
    pause("inbox", "upgrade")
    expect(page.locator(".messagelist li")).to_have_text(
        ["The queue pause “inbox (paused)” was added successfully."]
    )
    pause("inbox", "again")
    expect(page.locator(".messagelist li")).to_have_text(
        ["Queue inbox was already paused; nothing changed."]
    )
    assert QueuePause.objects.get().reason == "upgrade"


def test_the_budget_add_form_offers_only_active_endpoints(
    session: Session, tx_personas: Personas
) -> None:
    p = tx_personas
    services.endpoint_revoke(actor=p.as_human(), endpoint=p.agent2)
    page = session.page(p.admin)
    page.goto("/admin/admission/admissionpolicy/add/")
    offered = page.locator("#id_endpoint option").evaluate_all("os => os.map(o => o.value)")
    assert str(p.agent.pk) in offered and str(p.foreign.pk) in offered
    assert str(p.agent2.pk) not in offered
    assert findings(page) == []


@pytest.mark.parametrize("width", WIDTHS)
def test_the_ledgers_scope_filter_names_a_blank_scope(
    session: Session, tx_personas: Personas, width: int
) -> None:
    p = tx_personas
    push(p, 1)
    chain.append(kind=LedgerKind.QUEUE_PAUSE, actor=chain.Actor(human_name="h"), queue="q")
    [blank] = LedgerEntry.objects.filter(scope="")
    page = session.page(p.admin, width=width)
    page.goto("/admin/ledger/ledgerentry/")
    if width < 1024:  # Django's filter sits behind its toggle on a narrow screen
        toggle = page.locator("#changelist-filter-toggle, .changelist-filter-toggle")
        if toggle.count() and toggle.first.is_visible():
            toggle.first.click()
    assert findings(page) == []
    page.locator("#changelist-filter").get_by_role("link", name="(none)").click()
    expect(page).to_have_url(re.compile(r"\?scope=$"))
    expect(page.locator("#result_list tbody tr")).to_have_count(1)
    expect(page.locator("#result_list tbody tr th a")).to_have_text(str(blank.seq))
