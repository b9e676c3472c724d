"""The admin (round 8): a todo says what it waits on and when it runs; every time is in the
viewer's zone and the page names it; the pause and budget forms refuse beside the field, in the
service's words; an add that changed nothing says only that; the ledger's scope filter names a
blank scope."""

from __future__ import annotations

import re
import zoneinfo
from datetime import datetime

from django.test import Client
from django.utils import formats, timezone

from admission.models import AdmissionPolicy
from queues import pauses, selectors, services
from queues.models import QueuePause, Todo, TodoState
from switchboard.ledger import chain
from switchboard.ledger.models import LedgerEntry, LedgerKind
from tests.conftest import Personas, push
from tests.limits.conftest import pool
from tests.web.conftest import budget, signed_in

ZONE = "America/New_York"


def as_admin_shows(at: datetime, zone: str) -> str:
    """A time as Django's admin writes it ("Dec. 5, 2026, 10:42 a.m."), in ``zone``."""
    with timezone.override(zoneinfo.ZoneInfo(zone)):
        return formats.localize(timezone.localtime(at))


def in_zone(p: Personas, zone: str | None = ZONE) -> Client:
    client = signed_in(p.admin)
    if zone is not None:
        client.cookies["tz"] = zone
    return client


def row_of(html: str, text: str) -> str:
    """The change list's row (``<tr>…</tr>``) holding ``text``."""
    for row in re.findall(r"<tr>.*?</tr>", html, re.S):
        if text in row:
            return row
    raise AssertionError(f"no row holds {text!r}")


def cell(row: str, column: str) -> str:
    match = re.search(rf'<td class="field-{column}[^"]*">(.*?)</td>', row, re.S)
    assert match, f"no {column} in {row}"
    return match.group(1)


def field_error(html: str, field: str) -> str:
    """The error shown beside ``field`` on an admin form ("" when none)."""
    match = re.search(
        rf'<ul class="errorlist"[^>]*id="id_{field}_error"[^>]*>(.*?)</ul>', html, re.S
    )
    return re.sub(r"<[^>]+>", "", match.group(1)).strip() if match else ""


def form_errors(html: str) -> list[str]:
    """The errors above the form (Django's non-field errors)."""
    found = re.findall(r'<ul class="errorlist nonfield"[^>]*>(.*?)</ul>', html, re.S)
    return [re.sub(r"<[^>]+>", "", f).strip() for f in found]


def test_the_todo_list_says_what_each_todo_waits_on_and_when_it_runs(personas: Personas) -> None:
    p = personas
    first, held = push(p, 2)
    budget(p, max_claims_per_window=1)
    services.claim(actor=p.as_human(), todo_id=first.id)
    [paused] = push(p, 1, queue="outbox")
    pauses.queue_pause(actor=p.as_human(p.admin), queue="outbox", reason="upgrading")
    [free] = push(p, 1, endpoint=p.agent2)
    [retrying] = push(p, 1, endpoint=p.agent2, max_attempts=3)
    services.claim(actor=p.as_agent(p.agent2), todo_id=retrying.id)
    services.fail(actor=p.as_agent(p.agent2), todo_id=retrying.id, error="flaky")
    retrying.refresh_from_db()
    assert retrying.state == TodoState.FAILED and retrying.next_retry_at is not None
    explained = selectors.todo_explain(held)
    assert explained is not None and explained.binding is not None
    reset = explained.binding.next_eligible_at
    assert reset is not None and explained.binding.exact

    html = in_zone(p).get("/admin/queues/todo/").content.decode()
    assert '<th scope="col" class="column-waiting_on">' in html
    assert '<th scope="col" class="column-runs_at">' in html
    # Held by the budget until its window resets, in the viewer's zone.
    row = row_of(html, f"/admin/queues/todo/{held.pk}/change/")
    assert cell(row, "waiting_on") == "budget (window exhausted)"
    assert cell(row, "runs_at") == as_admin_shows(reset, ZONE)
    row = row_of(html, f"/admin/queues/todo/{paused.pk}/change/")
    assert cell(row, "waiting_on") == "pause (paused)"
    assert cell(row, "runs_at") == "when an operator acts"
    row = row_of(html, f"/admin/queues/todo/{free.pk}/change/")
    assert cell(row, "waiting_on") == "nothing: a claim would pass now"
    assert cell(row, "runs_at") == "now"
    row = row_of(html, f"/admin/queues/todo/{retrying.pk}/change/")
    assert cell(row, "waiting_on") == "its retry delay"
    assert cell(row, "runs_at") == as_admin_shows(retrying.next_retry_at, ZONE)
    row = row_of(html, f"/admin/queues/todo/{first.pk}/change/")  # claimed: not waiting
    assert cell(row, "waiting_on") == "—" and cell(row, "runs_at") == "—"


def test_todos_of_one_queue_naming_other_limits_wait_on_their_own_gates(
    personas: Personas,
) -> None:
    # The list reads the gates once per group of todos alike in what they read: a todo naming a
    # full pool waits on it, its neighbour on the same queue naming none does not.
    p = personas
    pool("gpu", slots=1)
    running, waiting = push(p, 2, endpoint=p.agent2, pool="gpu")
    [free] = push(p, 1, endpoint=p.agent2)
    services.claim(actor=p.as_agent(p.agent2), todo_id=running.id)
    explained = selectors.todo_explain(waiting)
    assert explained is not None and explained.binding is not None
    lease_end = explained.binding.next_eligible_at
    assert lease_end is not None and not explained.binding.exact
    html = in_zone(p).get("/admin/queues/todo/").content.decode()
    row = row_of(html, f"/admin/queues/todo/{waiting.pk}/change/")
    assert cell(row, "waiting_on") == "pool (pool full)"
    assert cell(row, "runs_at") == f"≈ {as_admin_shows(lease_end, ZONE)}"
    row = row_of(html, f"/admin/queues/todo/{free.pk}/change/")
    assert cell(row, "waiting_on") == "nothing: a claim would pass now"


def test_the_todo_page_lists_every_gate_as_the_console_does(personas: Personas) -> None:
    p = personas
    first, held = push(p, 2)
    budget(p, max_claims_per_window=1)
    services.claim(actor=p.as_human(), todo_id=first.id)
    pauses.queue_pause(actor=p.as_human(p.admin), queue="inbox", reason="upgrading")
    explained = selectors.todo_explain(held)
    assert explained is not None
    pause, gate = explained.gates  # the pause binds: until an operator acts
    assert gate.next_eligible_at is not None
    html = in_zone(p).get(f"/admin/queues/todo/{held.pk}/change/").content.decode()
    assert re.search(r"<label>Waiting on:</label>\s*<div class=\"readonly\">pause \(paused\)", html)
    assert re.search(r'<label>Runs at:</label>\s*<div class="readonly">when an operator acts', html)
    gates = html.split("<label>Gates:</label>")[1].split("<label>")[0]
    items = re.findall(r'<div class="gate">(.*?)</div>', gates)
    assert items == [
        f"pause: holds (paused), eligible when an operator acts — {pause.detail}",
        "budget: holds (window exhausted), eligible "
        f"{as_admin_shows(gate.next_eligible_at, ZONE)} — {gate.detail}",
    ]
    # A todo that is not pending waits on nothing.
    html = in_zone(p).get(f"/admin/queues/todo/{first.pk}/change/").content.decode()
    assert re.search(r'<label>Gates:</label>\s*<div class="readonly">—</div>', html)


def test_admin_times_are_in_the_viewers_zone_and_the_page_names_it(personas: Personas) -> None:
    p = personas
    [todo] = push(p, 1)
    Todo.objects.filter(pk=todo.pk).update(
        created_at=datetime(2026, 12, 5, 15, 42, tzinfo=zoneinfo.ZoneInfo("UTC"))
    )
    pauses.queue_pause(actor=p.as_human(p.admin), queue="inbox", reason="upgrading")
    paused_at = QueuePause.objects.get().paused_at
    entry = LedgerEntry.objects.order_by("-seq").first()
    assert entry is not None
    pages = {
        "/admin/queues/todo/": "Dec. 5, 2026, 10:42 a.m.",  # 15:42 UTC
        f"/admin/queues/todo/{todo.pk}/change/": "Dec. 5, 2026, 10:42 a.m.",
        "/admin/queues/queuepause/": as_admin_shows(paused_at, ZONE),
        f"/admin/ledger/ledgerentry/{entry.pk}/change/": as_admin_shows(entry.at, ZONE),
    }
    p.owner.last_login = datetime(2026, 12, 5, 15, 42, tzinfo=zoneinfo.ZoneInfo("UTC"))
    p.owner.save()
    # Shown, not an input (queues.admin.UserAdmin): the server records it.
    pages[f"/admin/auth/user/{p.owner.pk}/change/"] = "Dec. 5, 2026, 10:42 a.m."
    client = in_zone(p)
    for url, shown in pages.items():
        html = client.get(url).content.decode()
        assert shown in html, url
        assert zone_named(html) == ZONE, url
    # Without the cookie: UTC, and the page says so.
    html = in_zone(p, None).get("/admin/queues/todo/").content.decode()
    assert "Dec. 5, 2026, 3:42 p.m." in html
    assert zone_named(html) == "UTC"


def zone_named(html: str) -> str:
    """The zone the page says its times are in (the link to the console's zone page)."""
    match = re.search(
        r'<a class="tzlink" href="/prefs/tz\?next=[^"]*"[^>]*>Times in ([^<]+)</a>', html
    )
    assert match, "the page names no zone"
    return match.group(1)


def test_the_pause_form_refuses_beside_the_field_in_the_services_words(
    personas: Personas,
) -> None:
    p = personas
    push(p, 1)
    client = signed_in(p.admin)
    url = "/admin/queues/queuepause/add/"
    html = client.post(url, {"queue": "bad name", "reason": "x"}).content.decode()
    assert form_errors(html) == []
    assert field_error(html, "queue") == (
        "queue must be 1-64 letters, digits, &#x27;.&#x27;, &#x27;_&#x27;, &#x27;:&#x27; or "
        "&#x27;-&#x27;, starting with a letter or digit"
    )
    html = client.post(url, {"queue": "inbox", "reason": "r" * 501}).content.decode()
    assert form_errors(html) == []
    assert field_error(html, "reason") == "reason is at most 500 characters"
    html = client.post(url, {"queue": "quarantine", "reason": "x"}).content.decode()
    assert field_error(html, "queue") == (
        "the quarantine queue is never delivered, so it cannot be paused"
    )
    # A name nothing has used: the form's own box, not the API's or the CLI's flag.
    html = client.post(url, {"queue": "typo", "reason": "x"}).content.decode()
    assert form_errors(html) == []
    assert field_error(html, "queue") == (
        "no queue named &#x27;typo&#x27; is known; to pause it anyway, tick “Create”"
    )
    assert "--create" not in html and "Constraint" not in html
    assert not QueuePause.objects.exists()
    response = client.post(url, {"queue": "typo", "reason": "x", "create": "on"})
    assert response.status_code == 302
    assert QueuePause.objects.get().queue == "typo"


def test_pausing_a_paused_queue_in_the_admin_says_only_that_nothing_changed(
    personas: Personas,
) -> None:
    p = personas
    push(p, 1)
    client = signed_in(p.admin)
    url = "/admin/queues/queuepause/add/"
    first = client.post(url, {"queue": "inbox", "reason": "upgrade"}, follow=True)
    assert [str(m) for m in first.context["messages"]] == [
        "The queue pause “inbox (paused)” was added successfully."
    ]
    for button in ("_save", "_addanother", "_continue"):
        again = client.post(url, {"queue": "inbox", "reason": "again", button: "1"}, follow=True)
        assert again.status_code == 200
        assert [str(m) for m in again.context["messages"]] == [
            "Queue inbox was already paused; nothing changed."
        ], button
    assert QueuePause.objects.get().reason == "upgrade"


def test_the_budget_add_form_offers_no_revoked_endpoint_and_refuses_one_beside_it(
    personas: Personas,
) -> None:
    p = personas
    services.endpoint_revoke(actor=p.as_human(), endpoint=p.agent2)
    client = signed_in(p.admin)
    url = "/admin/admission/admissionpolicy/add/"
    html = client.get(url).content.decode()
    assert f'<option value="{p.agent.pk}">' in html
    assert f'value="{p.agent2.pk}"' not in html
    # One revoked after the page opened: beside the field, and no budget.
    form = {"endpoint": str(p.agent2.pk), "queue": "inbox", "max_in_flight": "3"}
    html = client.post(url, {**form, "posture": "enforce", "version": ""}).content.decode()
    assert form_errors(html) == []
    assert field_error(html, "endpoint") == (
        "Select one of the endpoints offered: a revoked endpoint&#x27;s budgets can only be "
        "cleared."
    )
    assert not AdmissionPolicy.objects.exists()


def test_a_budgets_change_form_keeps_its_revoked_endpoint(personas: Personas) -> None:
    p = personas
    policy = budget(p, max_in_flight=2)
    services.endpoint_revoke(actor=p.as_human(), endpoint=p.agent)
    html = signed_in(p.admin).get(f"/admin/admission/admissionpolicy/{policy.pk}/change/")
    assert html.status_code == 200
    assert p.agent.slug in html.content.decode()


def test_the_ledgers_scope_filter_names_a_blank_scope(personas: Personas) -> None:
    p = personas
    push(p, 1)
    # A row with no scope (as a grant chain's limits.end is).
    chain.append(kind=LedgerKind.QUEUE_PAUSE, actor=chain.Actor(human_name="h"), queue="q")
    blank = LedgerEntry.objects.filter(scope="")
    assert blank.count() == 1
    client = signed_in(p.admin)
    html = client.get("/admin/ledger/ledgerentry/").content.decode()
    assert '<a href="?scope="></a>' not in html
    assert re.search(r'<a href="\?scope=">\(none\)</a>', html)
    # Picking it lists the rows with no scope, and only those.
    html = client.get("/admin/ledger/ledgerentry/?scope=").content.decode()
    shown = set(re.findall(r'href="/admin/ledger/ledgerentry/(\d+)/change/', html))
    assert shown == {str(pk) for pk in blank.values_list("pk", flat=True)}
    # With facets, the count follows the name.
    html = client.get("/admin/ledger/ledgerentry/?_facets=True").content.decode()
    assert re.search(rf'<a href="\?_facets=True&amp;scope=">\(none\) \({blank.count()}\)</a>', html)
