"""The admin's pages (admission, queues, the ledger, people and groups) in Chromium at 1440 and
390 px: axe finds nothing at any impact, and nothing scrolls sideways on the page itself. The
window list shows one row per shard of a window (admission migration 0007) beside its policy;
a person is granted pause_queue through the two-list picker at phone width."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from admission.models import AdmissionWindow
from queues import services
from queues.models import Attempt
from switchboard.ledger.models import LedgerEntry
from tests.browser.conftest import PHONE, WIDTHS, Session
from tests.browser.helpers import budget, findings, sideways_overflow
from tests.conftest import Personas, push


@pytest.mark.parametrize("javascript", [True, False], ids=["js", "nojs"])
@pytest.mark.parametrize("width", WIDTHS)
def test_the_admin_pages_have_no_findings_and_the_window_list_sums_shards(
    session: Session, tx_personas: Personas, width: int, javascript: bool
) -> None:
    p = tx_personas
    policy = budget(p, "inbox", max_in_flight=5, max_claims_per_window=100)
    for todo in push(p, 3):
        services.claim(actor=p.as_agent(), todo_id=todo.id, claimant="worker-3")
    window = AdmissionWindow.objects.filter(policy=policy).first()
    assert window is not None
    page = session.page(p.admin, width=width)
    if not javascript:  # axe still runs: it is injected, not fetched as a script
        page.route("**/*.js", lambda route: route.abort())
    found = {}
    for url in [
        "/admin/",
        "/admin/admission/admissionpolicy/",
        f"/admin/admission/admissionpolicy/{policy.pk}/change/",
        "/admin/admission/admissionwindow/",
        f"/admin/admission/admissionwindow/{window.pk}/change/",
        "/admin/queues/todo/",
        "/admin/ledger/ledgerentry/",
        f"/admin/queues/endpoint/{p.agent.pk}/change/",
    ]:
        response = page.goto(url)
        assert response is not None and response.status == 200, url
        found[url] = findings(page)
        overflow = sideways_overflow(page)
        if overflow > 0:
            found[url].append(f"scrolls sideways by {overflow} px")
    # A refusal shown on the form (the service's, beside its field).
    page.goto(f"/admin/queues/endpoint/{p.agent.pk}/change/")
    page.locator('[name="notify_url"]').fill("https://10.1.2.3/")
    page.locator('input[name="_save"]').click()
    expect(page.locator(".errorlist")).to_have_text(
        "notify_url is refused: the host 10.1.2.3 is a private address (10.1.2.3)"
    )
    found["endpoint change, refused"] = findings(page)
    assert {url: f for url, f in found.items() if f} == {}
    # The window list names the shard of each row and counts the claims in the rows' sum.
    page.goto("/admin/admission/admissionwindow/")
    expect(page.locator("#result_list th.column-shard")).to_have_text("Shard")
    used = page.locator("#result_list td.field-used").all_inner_texts()
    assert sum(int(u) for u in used) == 3


@pytest.mark.parametrize("width", WIDTHS)
def test_the_endpoint_revoke_asks_first_and_its_page_has_no_findings(
    session: Session, tx_personas: Personas, width: int
) -> None:
    p = tx_personas
    push(p, 2)
    page = session.page(p.admin, width=width)

    def ask() -> None:
        page.goto("/admin/queues/endpoint/")
        page.locator(f'input[name="_selected_action"][value="{p.agent.pk}"]').check()
        page.locator('select[name="action"]').select_option("revoke")
        page.locator('button[name="index"]').click()
        expect(page.locator("h1")).to_have_text("Revoke these endpoints?")

    ask()
    expect(page.locator("#content tbody tr td").nth(2)).to_have_text("2")
    assert findings(page) == []
    # Taking it back changes nothing; confirming revokes.
    page.get_by_role("link", name="No, take me back").click()
    expect(page).to_have_url(re.compile(r"/admin/queues/endpoint/$"))
    p.agent.refresh_from_db()
    assert p.agent.state == "active"
    ask()
    page.get_by_role("button", name="Yes, revoke 1 endpoint").click()
    expect(page.locator(".messagelist")).to_contain_text(
        "1 endpoint(s) revoked; 2 live todo(s) dead-lettered."
    )
    p.agent.refresh_from_db()
    assert p.agent.state == "revoked"


@pytest.mark.parametrize("width", WIDTHS)
def test_every_other_admin_page_has_no_findings(
    session: Session, tx_personas: Personas, width: int
) -> None:
    # The pages the test above leaves out, Django's own among them (people, groups, passwords):
    # the admin is where an operator grants pause_queue, so its forms are read aloud too.
    p = tx_personas
    policy = budget(p, "inbox", max_in_flight=5)
    todos = push(p, 2)
    for todo in todos:
        services.claim(actor=p.as_agent(), todo_id=todo.id, claimant="worker-3")
    services.fail(actor=p.as_agent(), todo_id=todos[0].id)
    token, _ = services.human_token_create(user=p.admin, name="t", actor=p.as_human(p.admin))
    attempt = Attempt.objects.get()
    entry = LedgerEntry.objects.order_by("seq").first()
    assert entry is not None
    page = session.page(p.admin, width=width)
    found = {}
    for url in [
        "/admin/queues/",
        "/admin/queues/endpoint/",
        "/admin/queues/endpoint/add/",
        f"/admin/queues/todo/{todos[0].pk}/change/",
        "/admin/queues/todo/?state__exact=failed",
        "/admin/queues/attempt/",
        f"/admin/queues/attempt/{attempt.pk}/change/",
        "/admin/queues/queuepause/",
        "/admin/queues/humantoken/",
        "/admin/queues/humantoken/add/",
        f"/admin/queues/humantoken/{token.pk}/change/",
        f"/admin/ledger/ledgerentry/{entry.pk}/change/",
        "/admin/ledger/ledgerhead/",
        f"/admin/admission/admissionpolicy/{policy.pk}/delete/",
        "/admin/auth/user/",
        "/admin/auth/user/?q=ol",
        "/admin/auth/user/add/",
        f"/admin/auth/user/{p.owner.pk}/change/",
        f"/admin/auth/user/{p.owner.pk}/password/",
        "/admin/auth/group/",
        "/admin/auth/group/add/",
        "/admin/password_change/",
    ]:
        response = page.goto(url)
        assert response is not None and response.status == 200, url
        if url.endswith((f"/user/{p.owner.pk}/change/", "/group/add/")):
            # The two-list pickers are built (on load) and their filter icons named as images.
            expect(page.locator(".selector .search-label-icon").first).to_have_attribute(
                "role", "img"
            )
        found[url] = findings(page)
        overflow = sideways_overflow(page)
        if overflow > 0:
            found[url].append(f"scrolls sideways by {overflow} px")
    assert {url: f for url, f in found.items() if f} == {}


def test_a_person_is_granted_pause_queue_through_the_picker_at_phone_width(
    session: Session, tx_personas: Personas
) -> None:
    # The user page as queues.admin.UserAdmin changed it: its sign-in and join times shown, not
    # inputs (so the form saves without them), and the picker's icons named by static/js/admin.js.
    p = tx_personas
    assert not p.owner.has_perm("queues.pause_queue")
    joined = p.owner.date_joined
    page = session.page(p.admin, width=PHONE)
    page.goto(f"/admin/auth/user/{p.owner.pk}/change/")
    page.locator("#id_user_permissions_input").fill("pause and resume")
    option = page.locator("#id_user_permissions_from option", has_text="Can pause and resume")
    expect(option).to_have_count(1)
    page.locator("#id_user_permissions_from").select_option(option.get_attribute("value"))
    page.locator("#id_user_permissions_add").click()
    expect(page.locator("#id_user_permissions_to option")).to_have_count(1)
    assert findings(page) == []
    assert sideways_overflow(page) == 0
    page.locator('input[name="_save"]').click()
    expect(page.locator(".messagelist")).to_contain_text("was changed successfully")
    owner = type(p.owner).objects.get(pk=p.owner.pk)
    assert owner.has_perm("queues.pause_queue")
    assert owner.date_joined == joined and owner.last_login is None
