"""Security headers and CSRF on every page, auditors refused on every write, and the admin."""

from __future__ import annotations

import re
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission
from django.test import Client

from admission import selectors
from admission.models import AdmissionPolicy, AdmissionWindow
from queues import pauses, services
from queues.models import QueuePause, Todo, TodoState
from switchboard.core.versions import ABSENT as NO_BUDGET
from tests.conftest import Personas, audit_rows, push
from tests.web.conftest import HTMX, budget, hidden_version, policy_form, signed_in


def _pages(p: Personas) -> list[str]:
    (todo,) = push(p, 1)
    budget(p, max_in_flight=2)
    return [
        "/",
        "/queues",
        "/queues/inbox",
        f"/todos/{todo.id}",
        "/budgets/agent/inbox",
        "/budgets/agent/inbox/clear",
        "/ledger",
        "/ledger.csv",
        "/prefs/tz",
        "/login/",
    ]


def _every_page(p: Personas) -> list[str]:
    """``_pages`` and the pages reached from the top bar and the bulk actions."""
    return [*_pages(p), "/throughput", "/agents", "/limits/occupancy", "/todos/bulk/discard"]


def test_every_page_carries_the_security_headers(personas: Personas) -> None:
    client = signed_in(personas.owner)
    for url in _pages(personas):
        response = client.get(url)
        assert response.status_code == 200, url
        csp = response["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp, url
        assert response["X-Frame-Options"] == "DENY", url
        assert response["X-Content-Type-Options"] == "nosniff", url
        assert response["Referrer-Policy"] == "same-origin", url


def test_no_template_comment_spans_lines() -> None:
    # Django's {# #} comment ends on the line it opens; one carried over lines is not a comment
    # but text, and the page shows it (the todo page showed _explain.html's note to its readers).
    templates = Path(settings.BASE_DIR) / "templates"
    spans = [
        f"{path.relative_to(templates)}:{number}"
        for path in sorted(templates.rglob("*.html"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\{#(?!.*#\})", line)
    ]
    assert len(list(templates.rglob("*.html"))) > 20
    assert spans == []


def test_no_page_shows_template_syntax(personas: Personas) -> None:
    p = personas
    client = signed_in(p.owner)
    (pending,) = push(p, 1)
    bodies = {
        url: client.get(url).content.decode() for url in _every_page(p) if url != "/ledger.csv"
    }
    # The todo's drawer on the board, and its page: each with its gates (_explain.html).
    drawer = {**HTMX, "HX-Target": "drawer"}
    bodies["drawer"] = client.get(f"/todos/{pending.id}", headers=drawer).content.decode()
    bodies["page"] = client.get(f"/todos/{pending.id}").content.decode()
    assert 'id="explain-title"' in bodies["drawer"] and 'id="explain-title"' in bodies["page"]
    assert "<h1" not in bodies["drawer"] and "<h1" in bodies["page"]
    for url, body in bodies.items():
        shown = [mark for mark in ("{#", "#}", "{%", "%}", "{{", "}}") if mark in body]
        assert shown == [], (url, shown)


def test_every_page_answers_head_as_its_get_without_a_body(personas: Personas) -> None:
    # Uptime checks and link checkers ask HEAD; require_GET answered them 405. The CSV export
    # (a streamed read of the whole ledger) stays GET-only.
    p = personas
    client = signed_in(p.owner)
    for url in _every_page(p):
        got = client.get(url)
        head = client.head(url)
        if url == "/ledger.csv":
            assert head.status_code == 405 and head["Allow"] == "GET", url
            continue
        assert (got.status_code, head.status_code) == (200, 200), url
        assert head.content == b"" and head["Content-Type"] == got["Content-Type"], url
    # HEAD of the bulk page is the page, never the action (its view acted on what is not GET).
    pending = Todo.objects.filter(state=TodoState.PENDING).count()
    assert pending and client.head("/todos/bulk/discard?state=pending").status_code == 200
    assert Todo.objects.filter(state=TodoState.PENDING).count() == pending


def test_pages_load_no_inline_script_and_no_inline_style(personas: Personas) -> None:
    client = signed_in(personas.admin)
    for url in _pages(personas):
        if url.endswith(".csv"):
            continue
        html = client.get(url).content.decode()
        assert "<script>" not in html and " style=" not in html and "<style" not in html, url
        assert not re.search(r"<[^>]*\son[a-z]+=", html), url  # no inline event handlers
        for tag in html.split("<script")[1:]:
            assert 'src="/static/' in tag.split(">")[0], url
    htmx = Client().get("/static/vendor/htmx-2.0.11.min.js")
    htmx.close()  # a file response: closing closes its file
    assert htmx.status_code == 200


def test_every_state_changing_form_needs_its_csrf_token(personas: Personas) -> None:
    p = personas
    (todo,) = push(p, 1)
    budget(p, max_in_flight=2)
    writes = {
        "/queues/inbox/pause": {"reason": "x"},
        "/queues/inbox/resume": {},
        f"/todos/{todo.id}/claim": {},
        "/budgets/agent/inbox": policy_form(),
        "/budgets/agent/inbox/clear": {},
        "/prefs/tz": {"tz": "UTC"},
        "/logout/": {},
    }
    client = signed_in(p.admin, enforce_csrf_checks=True)
    for url, data in writes.items():
        assert client.post(url, data).status_code == 403, url
    assert not QueuePause.objects.exists() and AdmissionPolicy.objects.exists()
    todo.refresh_from_db()
    assert todo.state == TodoState.PENDING
    page = client.get("/?queue=inbox").content.decode()
    assert page.count('name="csrfmiddlewaretoken"') >= page.count('method="post"') > 0


def test_a_fragment_request_without_a_session_loads_the_sign_in_page_whole(
    personas: Personas,
) -> None:
    # htmx follows a redirect inside its request and swaps what it gets: the whole sign-in page
    # in the drawer. It is told to load the sign-in page instead, back to the page it was on.
    (todo,) = push(personas, 1)
    client = Client()
    board = {"HX-Request": "true", "HX-Current-URL": "http://testserver/?queue=inbox&state=all"}
    for method, url in (("get", f"/todos/{todo.id}"), ("post", f"/todos/{todo.id}/claim")):
        response = getattr(client, method)(url, headers=board)
        assert response.status_code == 200 and response.content == b"", url
        assert response["HX-Redirect"] == "/login/?next=/%3Fqueue%3Dinbox%26state%3Dall", url
        assert "Location" not in response
    # A page elsewhere is no place to come back to: the fragment's own URL is.
    elsewhere = {"HX-Request": "true", "HX-Current-URL": "https://elsewhere.example/?queue=inbox"}
    response = client.get(f"/todos/{todo.id}", headers=elsewhere)
    assert response["HX-Redirect"] == f"/login/?next=/todos/{todo.id}"
    # A page (no htmx) is redirected as before.
    response = client.get("/?queue=inbox")
    assert response.status_code == 302 and response["Location"] == "/login/?next=/%3Fqueue%3Dinbox"
    todo.refresh_from_db()
    assert todo.state == TodoState.PENDING


def test_a_write_an_auditor_forges_by_hand_is_refused_and_changes_nothing(
    personas: Personas,
) -> None:
    p = personas
    (pending,) = push(p, 1)
    (claimed,) = push(p, 1)
    services.claim(actor=p.as_human(), todo_id=claimed.id)
    budget(p, max_in_flight=2)
    p.auditor.user_permissions.add(Permission.objects.get(codename="pause_queue"))
    QueuePause.objects.create(
        queue="outbox", reason="kept", paused_by=p.admin, paused_at="2026-01-01T00:00Z"
    )
    ledger_rows = audit_rows().count()
    writes = [
        ("/queues/inbox/pause", {"reason": "forged"}),
        ("/queues/outbox/resume", {}),
        (f"/todos/{pending.id}/claim", {}),
        (f"/todos/{claimed.id}/complete", {}),
        (f"/todos/{claimed.id}/fail", {"error": "x"}),
        (f"/todos/{claimed.id}/release", {}),
        (f"/todos/{pending.id}/retry", {}),
        ("/budgets/agent/inbox", policy_form(action="preview")),
        ("/budgets/agent/inbox", policy_form(action="save", previewed="x")),
        ("/budgets/agent/inbox/clear", {}),
        ("/budgets/agent/outbox", policy_form()),
    ]
    client = signed_in(p.auditor)
    for url, data in writes:
        assert client.post(url, data).status_code == 403, url
    assert client.get("/budgets/agent/inbox/clear").status_code == 403
    assert audit_rows().count() == ledger_rows
    assert list(QueuePause.objects.values_list("queue", flat=True)) == ["outbox"]
    pending.refresh_from_db()
    claimed.refresh_from_db()
    assert (pending.state, claimed.state) == (TodoState.PENDING, TodoState.CLAIMED)
    assert AdmissionPolicy.objects.get().max_in_flight == 2


@pytest.mark.parametrize("who", ["auditor", "owner"])
def test_every_admin_link_a_viewer_is_shown_opens(personas: Personas, who: str) -> None:
    """A read-only foreign key (an endpoint's owner, a pause's author, a budget's last editor)
    linked to the user's change page, which an auditor (reading) or an owner (changing their
    budget) may not open: a 403 one click from a page they may read. Every admin page each opens
    from the index, lists and change pages alike, and every admin link on each, in turn."""
    p = personas
    viewer = getattr(p, who)
    viewer.user_permissions.add(
        *Permission.objects.filter(codename__in=["change_admissionpolicy", "view_admissionpolicy"])
    )
    (todo,) = push(p, 1)
    services.claim(actor=p.as_agent(), todo_id=todo.id)
    budget(p, max_in_flight=2)
    pauses.queue_pause(actor=p.as_human(p.pauser), queue="outbox", reason="draining")
    viewer.is_staff = True  # as seed_demo makes the demo's auditor: the admin's doors open
    viewer.save()
    client = signed_in(viewer)
    link = re.compile(r'href="(/admin/[^"#?]*)"')
    seen: set[str] = set()
    pending = ["/admin/"]
    refused = []
    while pending:
        url = pending.pop()
        if url in seen or url.startswith(("/admin/logout", "/admin/password_change")):
            continue
        seen.add(url)
        response = client.get(url)
        if response.status_code != 200:
            refused.append((url, response.status_code))
            continue
        if "text/html" in response["Content-Type"]:
            pending += link.findall(response.content.decode())
    assert not refused, refused
    assert any(re.fullmatch(r"/admin/admission/admissionpolicy/[^/]+/change/", u) for u in seen)
    if who == "auditor":
        assert any(re.fullmatch(r"/admin/queues/endpoint/[^/]+/change/", u) for u in seen), seen
        assert any(u.startswith("/admin/queues/queuepause/outbox") for u in seen), seen
    policy = AdmissionPolicy.objects.get()
    page = client.get(f"/admin/admission/admissionpolicy/{policy.pk}/change/").content.decode()
    assert re.search(r'class="[^"]*field-updated_by[^"]*"', page) and "olive" in page


def test_the_ledger_is_read_only_in_the_admin_even_for_a_superuser(personas: Personas) -> None:
    p = personas
    budget(p, max_in_flight=2)
    entry = audit_rows().get()
    client = signed_in(p.admin)
    assert client.get("/admin/ledger/ledgerentry/").status_code == 200
    assert client.get(f"/admin/ledger/ledgerentry/{entry.seq}/change/").status_code == 200
    assert client.get("/admin/ledger/ledgerentry/add/").status_code == 403
    assert client.post(f"/admin/ledger/ledgerentry/{entry.seq}/change/", {}).status_code == 403
    assert (
        client.post(f"/admin/ledger/ledgerentry/{entry.seq}/delete/", {"post": "yes"}).status_code
        == 403
    )
    assert client.get("/admin/admission/admissionwindow/add/").status_code == 403
    assert client.get("/admin/ledger/ledgerhead/add/").status_code == 403
    assert audit_rows().count() == 1


def admin_budget_form(p: Personas) -> dict[str, str]:
    """The admin's add form for a budget of 3 in flight on the agent's inbox."""
    return {
        "version": NO_BUDGET,  # what the add page carries: it showed no budget
        "endpoint": str(p.agent.id),
        "queue": "inbox",
        "max_in_flight": "3",
        "max_claims_per_window": "",
        "window_period": "",
        "window_tz": "",
        "window_start": "",
        "window_weekday": "",
        "posture": "enforce",
    }


def admin_change_form(
    client: Client, policy: AdmissionPolicy, add: dict[str, str]
) -> dict[str, str]:
    """``add``'s values as the change page posts them: no identity, the version it showed."""
    page = client.get(f"/admin/admission/admissionpolicy/{policy.pk}/change/").content.decode()
    kept = {k: v for k, v in add.items() if k not in ("endpoint", "queue")}
    return {**kept, "version": hidden_version(page)}


def test_budgets_changed_in_the_admin_go_through_the_service_and_the_ledger(
    personas: Personas,
) -> None:
    p = personas
    client = signed_in(p.admin)
    form = admin_budget_form(p)
    bad = client.post(
        "/admin/admission/admissionpolicy/add/",
        {
            **form,
            "max_claims_per_window": "5",
            "window_period": "day",
            "window_tz": "Moon/Base",
            "window_start": "00:00",
        },
    )
    assert bad.status_code == 200 and "is not a known IANA time zone" in bad.content.decode()
    response = client.post("/admin/admission/admissionpolicy/add/", form)
    assert response.status_code == 302
    policy = AdmissionPolicy.objects.get()
    assert policy.max_in_flight == 3
    assert audit_rows().get().kind == "policy.create"
    assert audit_rows().get().actor_human_name == "ada"
    change = admin_change_form(client, policy, form)
    response = client.post(
        f"/admin/admission/admissionpolicy/{policy.pk}/change/", {**change, "max_in_flight": "4"}
    )
    assert response.status_code == 302
    policy.refresh_from_db()
    assert policy.max_in_flight == 4
    listing = client.get("/admin/admission/admissionpolicy/").content.decode()
    assert "inbox" in listing and "enforce" in listing
    response = client.post(f"/admin/admission/admissionpolicy/{policy.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302 and not AdmissionPolicy.objects.exists()
    kinds = list(audit_rows().values_list("kind", flat=True))
    assert kinds == ["policy.create", "policy.update", "policy.delete"]
    assert not AdmissionWindow.objects.exists()


def test_the_admin_reads_stacked_windows_as_a_client_s_json(personas: Personas) -> None:
    # Django's json.loads: a number past the digit limit and a lone surrogate (shown again in
    # the refused form) were server errors, a name given twice kept its last value; and a
    # limit written 3.0 was refused where the API reads it as 3.
    p = personas
    client = signed_in(p.admin)
    add = "/admin/admission/admissionpolicy/add/"
    base = {
        **admin_budget_form(p),
        "max_claims_per_window": "100",
        "window_period": "day",
        "window_tz": "UTC",
        "window_start": "00:00",
    }
    window = '"period": "hour", "tz": "UTC"}]'
    refused = [
        ('[{"limit": ' + "9" * 5000 + ", " + window, "a number has more than 4300 digits"),
        ('[{"limit": 3, "period": "hour", "tz": "\\ud800"}]', "lone surrogate"),
        ('[{"limit": 3, "limit": 4, ' + window, 'gives the name "limit" twice'),
        ('[{"limit": NaN, ' + window, "extra_windows.0.limit: must be a finite number"),
    ]
    for typed, words in refused:
        response = client.post(add, {**base, "extra_windows": typed})
        html = unescape(response.content.decode())
        assert response.status_code == 200 and words in html, words
        assert typed[:60] in html, words  # shown again as typed
        assert not AdmissionPolicy.objects.exists()
    assert not audit_rows().exists()
    saved = client.post(add, {**base, "extra_windows": '[{"limit": 3.0, ' + window})
    assert saved.status_code == 302, saved.content.decode()[:2000]
    [stacked] = AdmissionPolicy.objects.get().extra_windows
    assert stacked["limit"] == 3 and type(stacked["limit"]) is int


def test_the_admin_takes_a_blank_window_start_as_midnight_and_names_a_missing_weekday(
    personas: Personas,
) -> None:
    # A blank start, accepted by every other surface, was refused with "Constraint
    # “policy_window_complete” is violated." above the form, naming no field; a week without a
    # weekday showed that line above the weekday's own error.
    p = personas
    client = signed_in(p.admin)
    window = {"max_claims_per_window": "4", "window_period": "day", "window_tz": "Asia/Kathmandu"}
    week = client.post(
        "/admin/admission/admissionpolicy/add/",
        {**admin_budget_form(p), **window, "window_period": "week"},
    )
    html = week.content.decode()
    assert week.status_code == 200 and "policy_window_complete" not in html
    # One error, beside the weekday field.
    assert re.findall(r'<ul class="errorlist[^"]*"[^>]*>(.*?)</ul>', html, re.S) == [
        "<li>a week window needs window.weekday, one of Mon, Tue, Wed, Thu, Fri, Sat, Sun</li>"
    ]
    assert 'id="id_window_weekday_error"' in html
    assert not AdmissionPolicy.objects.exists()
    response = client.post(
        "/admin/admission/admissionpolicy/add/", {**admin_budget_form(p), **window}
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    policy = AdmissionPolicy.objects.get()
    assert (policy.window_period, policy.window_tz, str(policy.window_start)[:5]) == (
        "day",
        "Asia/Kathmandu",
        "00:00",
    )


def test_an_admin_save_over_a_budget_changed_since_the_page_opened_is_refused(
    personas: Personas,
) -> None:
    p = personas
    client = signed_in(p.admin)
    form = admin_budget_form(p)
    add_page = client.get("/admin/admission/admissionpolicy/add/").content.decode()
    assert hidden_version(add_page) == NO_BUDGET
    budget(p, max_in_flight=5)  # olive sets one while the add page is open
    response = client.post("/admin/admission/admissionpolicy/add/", form)
    assert response.status_code == 200
    # The model's unique check says so first; the service's version check stands behind it.
    assert "with this Endpoint and Queue already exists" in response.content.decode()
    policy = AdmissionPolicy.objects.get()
    assert policy.max_in_flight == 5  # the add did not replace it
    change = admin_change_form(client, policy, form)
    budget(p, max_in_flight=6)  # and changes it while the change page is open
    rows = audit_rows().count()
    response = client.post(
        f"/admin/admission/admissionpolicy/{policy.pk}/change/", {**change, "max_in_flight": "4"}
    )
    assert response.status_code == 200
    assert "changed since it was read (last changed by olive at " in response.content.decode()
    assert AdmissionPolicy.objects.get().max_in_flight == 6 and audit_rows().count() == rows
    response = client.post(
        f"/admin/admission/admissionpolicy/{policy.pk}/change/",
        {**admin_change_form(client, policy, form), "max_in_flight": "4"},
    )
    assert response.status_code == 302 and AdmissionPolicy.objects.get().max_in_flight == 4


def test_an_admin_delete_confirmed_over_a_budget_changed_since_is_refused(
    personas: Personas,
) -> None:
    # The delete confirmation cleared whatever budget was there when "Yes, I'm sure" came, not
    # the one the page showed.
    p = personas
    policy = budget(p, max_in_flight=5)
    client = signed_in(p.admin)
    page = client.get(f"/admin/admission/admissionpolicy/{policy.pk}/delete/").content.decode()
    shown = hidden_version(page)
    assert shown == selectors.policy_version(policy)
    budget(p, max_in_flight=6)  # olive changes it while the confirmation is open
    rows = audit_rows().count()
    confirm = {"post": "yes", "version": shown}
    response = client.post(f"/admin/admission/admissionpolicy/{policy.pk}/delete/", confirm)
    assert response.status_code == 302
    assert response["Location"] == f"/admin/admission/admissionpolicy/{policy.pk}/change/"
    notice = client.get(response["Location"]).content.decode()
    assert "Not cleared: " in notice and "changed since it was read" in notice
    assert AdmissionPolicy.objects.get().max_in_flight == 6 and audit_rows().count() == rows
    again = client.get(f"/admin/admission/admissionpolicy/{policy.pk}/delete/").content.decode()
    confirm = {"post": "yes", "version": hidden_version(again)}
    response = client.post(f"/admin/admission/admissionpolicy/{policy.pk}/delete/", confirm)
    assert response.status_code == 302 and not AdmissionPolicy.objects.exists()


def test_a_budget_write_the_service_refuses_is_shown_and_nothing_changes(
    personas: Personas, settings: Any
) -> None:
    # A rate-limited write used to say both "Not saved" and "was added successfully" (linking a
    # budget that did not exist), a rate-limited delete was a 500, and "delete selected" counted
    # what it asked for. Now the refusal is the form's error, the delete page's message, and the
    # clear action's count.
    p = personas
    client = signed_in(p.admin)
    form = {**admin_budget_form(p), "extra_windows": "[]"}
    for odd in ("5", '{"limit": 5}', '"day"'):
        response = client.post(
            "/admin/admission/admissionpolicy/add/", {**form, "extra_windows": odd}
        )
        assert response.status_code == 200, odd
        assert "extra_windows must be a JSON list of windows" in response.content.decode(), odd
    assert not AdmissionPolicy.objects.exists()

    settings.POLICY_WRITE_RATE_LIMIT = (0.001, 1)  # one write, then refused for ~17 minutes
    saved = client.post("/admin/admission/admissionpolicy/add/", form, follow=True)
    assert saved.redirect_chain and "added successfully" in saved.content.decode()
    assert (
        "budget on endpoint:agent/inbox" in saved.content.decode()
    )  # named as the ledger names it
    policy = AdmissionPolicy.objects.get()
    response = client.post("/admin/admission/admissionpolicy/add/", {**form, "queue": "outbox"})
    assert response.status_code == 200
    assert "too many budget changes" in response.content.decode()
    assert "added successfully" not in response.content.decode()
    change = admin_change_form(client, policy, form)
    response = client.post(
        f"/admin/admission/admissionpolicy/{policy.pk}/change/", {**change, "max_in_flight": "9"}
    )
    assert response.status_code == 200 and "too many budget changes" in response.content.decode()
    response = client.post(
        f"/admin/admission/admissionpolicy/{policy.pk}/delete/", {"post": "yes"}, follow=True
    )
    assert response.redirect_chain[0][0] == f"/admin/admission/admissionpolicy/{policy.pk}/change/"
    shown = [str(m) for m in response.context["messages"]]
    assert len(shown) == 1 and shown[0].startswith("Not cleared: too many budget changes")
    response = client.post(
        "/admin/admission/admissionpolicy/",
        {"action": "clear", "_selected_action": [str(policy.pk)]},
        follow=True,
    )
    shown = [str(m) for m in response.context["messages"]]
    assert any("too many budget changes" in m for m in shown) and "0 budget(s) cleared." in shown
    policy.refresh_from_db()
    assert policy.max_in_flight == 3 and AdmissionPolicy.objects.count() == 1
    assert list(audit_rows().values_list("kind", flat=True)) == ["policy.create"]
    actions = client.get("/admin/admission/admissionpolicy/").content.decode()
    assert 'value="clear"' in actions and 'value="delete_selected"' not in actions

    settings.POLICY_WRITE_RATE_LIMIT = (0, 0)
    response = client.post(
        "/admin/admission/admissionpolicy/",
        {"action": "clear", "_selected_action": [str(policy.pk)]},
        follow=True,
    )
    assert "1 budget(s) cleared." in [str(m) for m in response.context["messages"]]
    assert not AdmissionPolicy.objects.exists()
    assert list(audit_rows().values_list("kind", flat=True)) == ["policy.create", "policy.delete"]


def test_the_admins_static_files_are_served_without_collectstatic(settings: Any, db: None) -> None:
    # ``db``: closing the response sends request_finished, whose receiver checks the database
    # connection an earlier test of this process may have left open (blocked without it).
    settings.DEBUG = False  # production: nothing but WhiteNoise serves /static/
    css = Client().get("/static/admin/css/base.css")
    assert css.status_code == 200
    assert css["Content-Type"].startswith("text/css")
    assert b"".join(css.streaming_content) if css.streaming else css.content  # type: ignore[attr-defined]
    css.close()
    assert Client().get("/static/admin/css/no-such-file.css").status_code == 404
