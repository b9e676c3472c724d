"""The same flows with JavaScript off: every action completes by full-page posts and redirects."""

from __future__ import annotations

import re
from typing import Any

from playwright.sync_api import Request, expect

from admission.models import AdmissionPolicy
from queues.models import QueuePause, TodoState
from switchboard.ledger.models import LedgerEntry
from tests.browser.conftest import Session
from tests.browser.helpers import budget
from tests.conftest import Personas, push


def test_without_javascript_an_owner_edits_a_budget_by_full_page_posts(
    session: Session, tx_personas: Personas, relaxed_policy_writes: Any
) -> None:
    p = tx_personas
    budget(p, max_in_flight=5)
    page = session.page(p.owner, javascript=False)
    page.goto("/")
    expect(page.locator("[data-live]")).to_have_count(0)  # live.js never ran
    expect(page.get_by_text("Updates live.")).to_be_hidden()  # so the page does not say it does
    page.get_by_role("link", name="Edit budget").first.click()
    expect(page).to_have_url(re.compile(r"/budgets/agent/inbox$"))
    expect(page.locator("#id_max_in_flight")).to_have_value("5")

    page.fill("#id_max_claims_per_window", "10")
    page.fill("#id_window_tz", "Not/AZone")
    page.get_by_role("button", name="Preview change").click()
    expect(page.locator("#id_window_tz-error")).to_contain_text("not a known IANA time zone")
    expect(page.locator("#id_window_tz")).to_have_value("Not/AZone")
    expect(page.locator("#id_max_claims_per_window")).to_have_value("10")

    page.fill("#id_window_tz", "Asia/Tokyo")
    page.fill("#id_max_in_flight", "1")
    page.get_by_role("button", name="Preview change").click()
    expect(page.locator(".preview")).to_contain_text("0 of 10")
    expect(page.locator(".preview table")).to_contain_text("Asia/Tokyo")
    page.get_by_role("button", name="Save budget").click()
    expect(page).to_have_url(re.compile(r"/#edit-agent--inbox$"))
    expect(page.locator(".messages")).to_contain_text("Budget saved")
    expect(page.locator("#head-agent--inbox")).to_contain_text("0 of 10")
    policy = AdmissionPolicy.objects.get()
    assert (policy.max_in_flight, policy.max_claims_per_window, policy.window_tz) == (
        1,
        10,
        "Asia/Tokyo",
    )
    assert LedgerEntry.objects.filter(kind="policy.update").count() == 1

    page.get_by_role("link", name="Edit budget").first.click()
    page.get_by_role("link", name="Clear budget…").click()
    page.get_by_role("button", name="Clear budget").click()
    expect(page).to_have_url(re.compile(r"/#edit-agent--inbox$"))
    assert not AdmissionPolicy.objects.exists()


def test_without_javascript_a_superuser_pauses_and_resumes_from_the_board(
    session: Session, tx_personas: Personas
) -> None:
    p = tx_personas
    push(p, 1)
    page = session.page(p.admin, javascript=False)
    page.goto("/?endpoint=agent&queue=inbox")
    page.fill("#pause-agent--inbox-reason", "incident triage")
    page.get_by_role("button", name="Pause").click()
    expect(page).to_have_url(re.compile(r"/\?endpoint=agent&queue=inbox$"))
    expect(page.locator(".messages")).to_contain_text("Paused inbox")
    expect(page.locator("#head-agent--inbox .badge")).to_have_text("Paused")
    expect(page.locator("#head-agent--inbox")).to_contain_text("incident triage")
    assert QueuePause.objects.filter(queue="inbox").exists()
    page.get_by_role("button", name="Resume inbox").click()
    expect(page.locator(".messages")).to_contain_text("Resumed inbox")
    expect(page.locator("#head-agent--inbox .badge")).to_have_text("Healthy")
    assert not QueuePause.objects.exists()


def test_without_javascript_a_blank_pause_reason_is_refused_on_the_queue_page(
    session: Session, tx_personas: Personas
) -> None:
    p = tx_personas
    push(p, 1)
    page = session.page(p.admin, javascript=False)
    page.goto("/?endpoint=agent&queue=inbox")
    page.fill("#pause-agent--inbox-reason", "  ")
    page.get_by_role("button", name="Pause").click()
    # On the queue page, not the pause URL (a reload there posted the refused pause again).
    expect(page).to_have_url(re.compile(r"/queues/inbox\?next="))
    expect(page.locator("#pause-queue-error")).to_contain_text("a reason is required")
    posts: list[str] = []

    def posted(request: Request) -> None:
        if request.method == "POST":
            posts.append(request.url)

    page.on("request", posted)
    page.reload()
    expect(page.locator(".queue-pause")).to_contain_text("Healthy")
    expect(page.locator("#pause-queue-error")).to_have_count(0)  # said once
    assert posts == []
    page.fill("#pause-queue-reason", "for real now")
    page.locator("#pause-queue").get_by_role("button", name="Pause").click()
    expect(page).to_have_url(re.compile(r"/\?endpoint=agent&queue=inbox$"))
    assert QueuePause.objects.get().reason == "for real now"


def test_without_javascript_an_operator_works_a_todo_on_its_own_page(
    session: Session, tx_personas: Personas
) -> None:
    p = tx_personas
    (todo,) = push(p, 1, payload={"n": 1})
    page = session.page(p.owner, javascript=False)
    page.goto("/?endpoint=agent&queue=inbox")
    page.get_by_role("link", name="todo 0").click()
    expect(page).to_have_url(re.compile(rf"/todos/{todo.id}\?next="))
    page.get_by_role("button", name="Claim as operator:olive").click()
    expect(page.locator(".messages")).to_contain_text("Claimed")
    page.fill("#fail-error", "upstream said no")
    page.get_by_role("button", name="Fail").click()
    expect(page.locator(".messages")).to_contain_text("retry scheduled")
    page.get_by_role("button", name="Retry").click()
    expect(page.locator(".todo-head .state-label")).to_have_text("pending")
    page.get_by_role("link", name="Back to the board").click()
    expect(page).to_have_url(re.compile(r"/\?endpoint=agent&queue=inbox$"))
    todo.refresh_from_db()
    # A fresh round: the attempt number goes on (1 of 6 for a todo pushed with 5).
    assert (todo.state, todo.attempt, todo.max_attempts) == (TodoState.PENDING, 1, 6)
