"""The budget editor: preview before save, inline errors, clear with confirmation, history."""

from __future__ import annotations

import re
from html import unescape
from typing import Any

import pytest
from django.db import connection

from admission import selectors as admission_selectors
from admission import services as admission_services
from admission.models import AdmissionPolicy
from admission.policy import PolicySpec
from admission.views import preview
from queues import services
from queues.models import EndpointState
from switchboard.core.errors import InvalidArgument
from tests.conftest import FIXTURE, Personas, audit_rows, push, run_threads
from tests.web.conftest import budget, hidden_version, policy_form, previewed, signed_in


def test_the_editor_starts_on_the_first_field_with_sensible_defaults(personas: Personas) -> None:
    client = signed_in(personas.owner)
    client.cookies["tz"] = "Europe/Berlin"
    html = client.get("/budgets/agent/inbox").content.decode()
    assert 'id="id_max_in_flight" name="max_in_flight" value=""' in html
    assert "autofocus" in html.split('id="id_max_in_flight"')[1].split(">")[0]
    assert 'value="Europe/Berlin"' in html  # the viewer's zone as the default window zone
    assert '<datalist id="zones">' in html and '<option value="America/Los_Angeles">' in html
    assert 'href="/#edit-agent--inbox"' in html  # cancel goes back to the edit control


def test_saving_takes_a_preview_first_and_lands_in_the_ledger(personas: Personas) -> None:
    p = personas
    client = signed_in(p.owner)
    first = client.post("/budgets/agent/inbox", policy_form())
    html = first.content.decode()
    assert first.status_code == 200 and "Preview: what this change does now" in html
    assert "0 of 5" in html and "0 of 2" in html
    assert not AdmissionPolicy.objects.exists()
    # A save whose values differ from the preview's is previewed again, not saved.
    changed = client.post(
        "/budgets/agent/inbox",
        policy_form(max_in_flight="3", action="save", **previewed(html)),
    )
    assert changed.status_code == 200 and not AdmissionPolicy.objects.exists()
    saved = client.post(
        "/budgets/agent/inbox",
        policy_form(max_in_flight="3", action="save", **previewed(changed.content.decode())),
    )
    assert saved.status_code == 302 and saved["Location"] == "/#edit-agent--inbox"
    policy = AdmissionPolicy.objects.get()
    assert (policy.max_in_flight, policy.max_claims_per_window, policy.window_tz) == (
        3,
        5,
        "Europe/Paris",
    )
    row = audit_rows().get()
    assert (row.kind, row.actor_human_name, row.scope) == (
        "policy.create",
        "olive",
        "endpoint:agent",
    )


def test_errors_show_beside_the_field_they_name_and_keep_what_was_typed(personas: Personas) -> None:
    client = signed_in(personas.owner)
    cases = {
        "window_tz": policy_form(window_tz="Mars/Base"),
        "window_start": policy_form(window_start="25:99"),
        "window_weekday": policy_form(window_period="week", window_weekday=""),
        "max_claims_per_window": policy_form(max_claims_per_window="-4"),
        "max_in_flight": policy_form(max_in_flight="", max_claims_per_window=""),
        "window_period": policy_form(window_period=""),
    }
    for field, form in cases.items():
        response = client.post("/budgets/agent/inbox", form)
        html = response.content.decode()
        assert response.status_code == 400, field
        assert f'id="id_{field}-error"' in html, field
        tag = html.split(f'id="id_{field}"')[1].split(">")[0]
        assert 'aria-invalid="true"' in tag and "autofocus" in tag, field
    typed = client.post("/budgets/agent/inbox", policy_form(window_tz="Mars/Base")).content.decode()
    assert 'value="Mars/Base"' in typed and 'value="5"' in typed
    assert "is not a known IANA time zone" in typed
    assert not AdmissionPolicy.objects.exists()


def test_the_preview_shows_usage_against_the_new_limit_and_the_window_it_would_count(
    personas: Personas,
) -> None:
    p = personas
    push(p, 3)
    budget(p, max_claims_per_window=10, tz="UTC")
    services.claim_next(actor=p.as_agent())
    services.claim_next(actor=p.as_agent())
    client = signed_in(p.owner)
    same_window = client.post(
        "/budgets/agent/inbox", policy_form(max_claims_per_window="2", window_tz="UTC")
    ).content.decode()
    assert "2 of 2" in same_window and "(now: 2 of 10)" in same_window
    assert "Deferred · window used up" in same_window  # the lower limit exhausts the window now
    assert "starts a new window" not in same_window
    other_zone = client.post(
        "/budgets/agent/inbox",
        policy_form(max_claims_per_window="2", window_tz="Pacific/Kiritimati"),
    ).content.decode()
    assert "0 of 2" in other_zone and "starts a new window" in other_zone


def _after_saving(html: str) -> str:
    match = re.search(r'<dt>After saving</dt><dd><span class="badge[^"]*">([^<]*)</span>', html)
    assert match, "the page shows no preview"
    return unescape(match.group(1))


def test_the_preview_of_a_redefined_window_shows_the_count_its_save_gives(
    personas: Personas,
) -> None:
    """Each window definition keeps its own count: a save that redefines the first window
    moves the counters. The preview read the old definition's wherever the new window started
    at the same instant ("UTC" and "Etc/GMT" always do), so it said "window used up" of a save
    that admitted, and 0 used of one that brought 3 back."""
    p = personas
    push(p, 5)
    budget(p, max_claims_per_window=3, tz="UTC")
    for _ in range(3):
        services.claim_next(actor=p.as_agent())
    client = signed_in(p.owner)
    url = "/budgets/agent/inbox"
    other = policy_form(max_in_flight="", max_claims_per_window="3", window_tz="Etc/GMT")
    html = client.post(url, other).content.decode()
    assert "<strong>0 of 3</strong>" in html and "(now: 3 of 3)" in html, html
    assert "starts a new window" in html and _after_saving(html) == "Admitted"
    assert client.post(url, {**other, "action": "save", **previewed(html)}).status_code == 302
    now = admission_selectors.identity_status(p.agent.id, "inbox")
    assert now is not None and now.used == 0 and now.admits
    services.claim_next(actor=p.as_agent())
    back = policy_form(max_in_flight="", max_claims_per_window="3", window_tz="UTC")
    html = client.post(url, back).content.decode()
    assert "<strong>3 of 3</strong>" in html and "(now: 1 of 3)" in html, html
    assert _after_saving(html).startswith("Deferred · window used up")
    assert client.post(url, {**back, "action": "save", **previewed(html)}).status_code == 302
    now = admission_selectors.identity_status(p.agent.id, "inbox")
    assert now is not None and now.used == 3 and not now.admits


def test_every_redefinition_s_preview_reads_the_counts_its_save_gives(personas: Personas) -> None:
    # Stacked windows too: the old first window moved behind a new one keeps its count (merged
    # with what its definition counted there before), and a definition coming back to the front
    # brings its own. "UTC" and "Etc/GMT" start every day at the same instant.
    p = personas
    push(p, 8)
    utc = {"period": "day", "tz": "UTC", "start": "00:00"}
    gmt = {**utc, "tz": "Etc/GMT"}
    steps = [[utc], [gmt, utc], [utc, gmt], [gmt], [utc, gmt], [utc]]
    seen = []
    for windows in steps:
        services.claim_next(actor=p.as_agent())
        rows = [{"limit": 9, **w} for w in windows]
        policy = AdmissionPolicy.objects.filter(endpoint=p.agent, queue="inbox").first()
        spec = PolicySpec.clean(
            queue="inbox", max_in_flight=None, max_claims_per_window=None, window=None, windows=rows
        )
        shown = preview(p.agent, "inbox", policy, spec)["proposed"]
        admission_services.policy_set(
            actor=p.as_human(),
            endpoint=p.agent,
            queue="inbox",
            max_in_flight=None,
            max_claims_per_window=None,
            window=None,
            windows=rows,
        )
        saved = admission_selectors.identity_status(p.agent.id, "inbox")
        assert saved is not None
        counts = [(w.tz, w.used) for w in saved.windows]
        assert [(w.tz, w.used) for w in shown.windows] == counts, (windows, counts)
        seen.append(counts)
    # The first claim came before any budget; each one after counts under every window in
    # force, and a definition's count is the claims charged while it was in force.
    assert seen == [
        [("UTC", 0)],
        [("Etc/GMT", 0), ("UTC", 1)],
        [("UTC", 2), ("Etc/GMT", 1)],
        [("Etc/GMT", 2)],
        [("UTC", 3), ("Etc/GMT", 3)],
        [("UTC", 4)],
    ]


def test_a_revoked_endpoint_refuses_a_new_budget_as_a_form_error(personas: Personas) -> None:
    p = personas
    services.endpoint_revoke(actor=FIXTURE, endpoint=p.agent)
    assert p.agent.state == EndpointState.REVOKED
    client = signed_in(p.owner)
    html = client.post("/budgets/agent/inbox", policy_form()).content.decode()
    refused = client.post("/budgets/agent/inbox", policy_form(action="save", **previewed(html)))
    assert refused.status_code == 400 and "revoked" in refused.content.decode()


def test_clearing_asks_first_then_goes_through_the_service(personas: Personas) -> None:
    p = personas
    budget(p, max_in_flight=2)
    client = signed_in(p.owner)
    confirm = client.get("/budgets/agent/inbox/clear")
    assert (
        confirm.status_code == 200
        and "Clear the budget of inbox on agent?" in confirm.content.decode()
    )
    assert AdmissionPolicy.objects.exists()
    response = client.post(
        "/budgets/agent/inbox/clear", {"version": hidden_version(confirm.content.decode())}
    )
    assert response.status_code == 302 and response["Location"] == "/#edit-agent--inbox"
    assert not AdmissionPolicy.objects.exists()
    assert audit_rows().filter(kind="policy.delete").count() == 1
    assert client.get("/budgets/agent/inbox/clear").status_code == 404
    # The same confirmation again (a double click): cleared already, so back to the board.
    again = client.post(
        "/budgets/agent/inbox/clear",
        {"version": hidden_version(confirm.content.decode())},
        follow=True,
    )
    assert again.redirect_chain == [("/#edit-agent--inbox", 302)]
    shown = [str(m) for m in again.context["messages"]]
    assert shown == ["inbox on agent has no budget now: it is cleared."]
    assert audit_rows().filter(kind="policy.delete").count() == 1


def test_another_owners_budget_is_not_found_and_an_auditor_reads_without_a_form(
    personas: Personas,
) -> None:
    p = personas
    budget(p, max_in_flight=2)
    other = signed_in(p.other_owner)
    assert other.get("/budgets/agent/inbox").status_code == 404
    assert other.post("/budgets/agent/inbox", policy_form()).status_code == 404
    assert other.post("/budgets/agent/inbox/clear").status_code == 404
    auditor = signed_in(p.auditor)
    html = auditor.get("/budgets/agent/inbox").content.decode()
    assert "The budget" in html and '<form method="post" action="/budgets' not in html
    assert signed_in(p.owner).get("/budgets/nobody/inbox").status_code == 404


def test_the_quarantine_queue_takes_no_budget_in_the_editor(personas: Personas) -> None:
    client = signed_in(personas.owner)
    assert 'name="max_in_flight"' not in client.get("/budgets/agent/quarantine").content.decode()
    assert client.post("/budgets/agent/quarantine", policy_form()).status_code == 403


def test_the_usage_history_is_an_inline_svg_of_used_refused_and_the_limit(
    personas: Personas,
) -> None:
    p = personas
    policy = budget(p, max_claims_per_window=4, tz="UTC")
    with connection.cursor() as cursor:
        for days, used, refused, limit in ((3, 4, 2, 4), (2, 1, 0, 5), (1, 3, 0, 4)):
            cursor.execute(
                "INSERT INTO admission_admissionwindow (policy_id, window_start, used, refused, "
                "claims_limit, updated_at) VALUES (%s, date_trunc('day', now()) - make_interval("
                "days => %s), %s, %s, %s, now())",
                [policy.id, days, used, refused, limit],
            )
    html = signed_in(p.owner).get("/budgets/agent/inbox").content.decode()
    svg = html.split("<svg")[1].split("</svg>")[0]
    assert 'role="img"' in svg
    assert svg.count('class="used"') == 3 and svg.count('class="refused"') == 1
    assert svg.count('class="limit"') == 3
    assert "4 used, 2 refused, limit 4" in svg
    assert "2 refusals in all" in svg
    assert "<script" not in html.split("<main")[1].split("</main>")[0]


def test_every_wrong_field_is_named_in_one_submit_by_its_label(personas: Personas) -> None:
    client = signed_in(personas.owner)
    form = policy_form(max_in_flight="-3", window_tz="Mars/Olympus_Mons", window_start="25:99")
    response = client.post("/budgets/agent/inbox", form)
    html = response.content.decode()
    assert response.status_code == 400
    assert "3 fields to correct" in html
    assert '<a href="#id_max_in_flight">Max in flight</a>:' in html
    assert '<a href="#id_window_tz">Zone</a>: &#x27;Mars/Olympus_Mons&#x27; is not a known' in html
    assert '<a href="#id_window_start">Start</a>: must be HH:MM' in html
    assert "window.tz" not in html and "max_in_flight must" not in html
    assert 'id="id_window_tz-error"' in html and 'id="id_window_start-error"' in html
    assert not AdmissionPolicy.objects.exists()


def test_a_week_budget_s_wrong_field_is_the_only_one_named(personas: Personas) -> None:
    # The period's trial held no weekday, so on a week budget every refusal also said "a week
    # window needs Weekday" beside the Weekday chosen.
    client = signed_in(personas.owner)
    week = {"window_period": "week", "window_weekday": "Tue"}
    for field, wrong in (("window_start", "24:00"), ("window_tz", "Mars/Olympus_Mons")):
        html = client.post("/budgets/agent/inbox", policy_form(**week, **{field: wrong}))
        assert html.status_code == 400, field
        page = html.content.decode()
        assert "1 field to correct" in page, field
        assert f'id="id_{field}-error"' in page and 'id="id_window_weekday-error"' not in page
    html = client.post("/budgets/agent/inbox", policy_form(**{**week, "window_weekday": "Montag"}))
    page = html.content.decode()
    assert html.status_code == 400 and 'id="id_window_weekday-error"' in page
    assert not AdmissionPolicy.objects.exists()


def test_a_number_that_is_not_one_and_a_bad_zone_are_both_named(personas: Personas) -> None:
    client = signed_in(personas.owner)
    html = client.post(
        "/budgets/agent/inbox", policy_form(max_in_flight="two", window_tz="Nowhere")
    ).content.decode()
    assert '<a href="#id_max_in_flight">Max in flight</a>: Enter a whole number.' in html
    assert '<a href="#id_window_tz">Zone</a>:' in html
    assert 'list="zones"' in html and '<datalist id="zones">' in html


# --- a save applies what its preview showed, or nothing ------------------------------------------


def someone_else_sets(p: Personas, max_in_flight: int) -> AdmissionPolicy:
    return admission_services.policy_set(
        actor=p.as_human(p.admin),
        endpoint=p.agent,
        queue="inbox",
        max_in_flight=max_in_flight,
        max_claims_per_window=None,
        window=None,
    )


def diff_row(html: str, field: str) -> tuple[str, str]:
    """The preview's "Now" and "After" cells of one changed field."""
    match = re.search(
        rf'<th scope="row">{field}</th><td class="old">([^<]*)</td><td class="new">([^<]*)</td>',
        html,
    )
    assert match, f"the preview shows no change of {field}"
    return match.group(1), match.group(2)


def test_a_save_after_someone_else_changed_the_budget_previews_again_and_writes_nothing(
    personas: Personas,
) -> None:
    p = personas
    budget(p, max_in_flight=2)
    client = signed_in(p.owner)
    client.cookies["tz"] = "Europe/Berlin"
    form = policy_form(max_in_flight="3", max_claims_per_window="", window_period="")
    html = client.post("/budgets/agent/inbox", form).content.decode()
    assert diff_row(html, "max_in_flight") == ("2", "3")
    someone_else_sets(p, 5)
    rows = audit_rows().count()
    stale = client.post("/budgets/agent/inbox", {**form, "action": "save", **previewed(html)})
    page = stale.content.decode()
    assert stale.status_code == 409
    assert "<strong>Not saved.</strong> ada changed this budget at " in page
    assert " CET, after your preview." in page  # in the viewer's zone
    assert diff_row(page, "max_in_flight") == ("5", "3")  # the diff against the budget now
    assert AdmissionPolicy.objects.get().max_in_flight == 5
    assert audit_rows().count() == rows
    saved = client.post("/budgets/agent/inbox", {**form, "action": "save", **previewed(page)})
    assert saved.status_code == 302
    assert AdmissionPolicy.objects.get().max_in_flight == 3
    row = audit_rows().latest("seq")
    assert row.before is not None and row.after is not None
    assert (row.before["max_in_flight"], row.after["max_in_flight"]) == (5, 3)


def test_a_save_after_the_budget_was_cleared_or_set_meanwhile_is_not_applied(
    personas: Personas,
) -> None:
    p = personas
    client = signed_in(p.owner)
    form = policy_form(max_in_flight="3", max_claims_per_window="", window_period="")
    # Previewed over no budget; someone sets one; the save would have replaced it unseen.
    html = client.post("/budgets/agent/inbox", form).content.decode()
    someone_else_sets(p, 5)
    response = client.post("/budgets/agent/inbox", {**form, "action": "save", **previewed(html)})
    assert response.status_code == 409 and "ada set a budget here at " in response.content.decode()
    assert AdmissionPolicy.objects.get().max_in_flight == 5
    # Previewed over that budget; someone clears it; the save would have made a new one unseen.
    html = client.post("/budgets/agent/inbox", form).content.decode()
    admission_services.policy_clear(actor=p.as_human(p.admin), endpoint=p.agent, queue="inbox")
    response = client.post("/budgets/agent/inbox", {**form, "action": "save", **previewed(html)})
    assert response.status_code == 409
    assert "This budget was cleared after your preview." in response.content.decode()
    assert not AdmissionPolicy.objects.exists()
    # A save that carries no version at all is previewed again too.
    html = response.content.decode()
    token = previewed(html)["previewed"]
    bare = client.post("/budgets/agent/inbox", {**form, "action": "save", "previewed": token})
    assert bare.status_code == 409 and not AdmissionPolicy.objects.exists()


def test_a_clear_confirmed_before_someone_changed_the_budget_clears_nothing(
    personas: Personas,
) -> None:
    p = personas
    budget(p, max_in_flight=2)
    client = signed_in(p.owner)
    confirm = client.get("/budgets/agent/inbox/clear").content.decode()
    assert "Today it allows 2 in flight" in confirm
    someone_else_sets(p, 5)
    response = client.post(
        "/budgets/agent/inbox/clear", {"version": hidden_version(confirm)}, follow=True
    )
    assert response.redirect_chain == [("/budgets/agent/inbox/clear", 302)]
    page = response.content.decode()
    assert "Not cleared: the budget changed after this page was opened." in page
    assert "Today it allows 5 in flight" in page  # the page again, as the budget is now
    assert AdmissionPolicy.objects.get().max_in_flight == 5
    assert audit_rows().filter(kind="policy.delete").count() == 0
    cleared = client.post("/budgets/agent/inbox/clear", {"version": hidden_version(page)})
    assert cleared.status_code == 302 and not AdmissionPolicy.objects.exists()


def test_a_double_submitted_save_is_saved_once_and_both_answers_say_saved(
    personas: Personas,
) -> None:
    p = personas
    budget(p, max_in_flight=2)
    client = signed_in(p.owner)
    form = policy_form(max_in_flight="3", max_claims_per_window="", window_period="")
    html = client.post("/budgets/agent/inbox", form).content.decode()
    save = {**form, "action": "save", **previewed(html)}
    first, second = (client.post("/budgets/agent/inbox", save) for _ in range(2))
    assert (first.status_code, second.status_code) == (302, 302)
    assert AdmissionPolicy.objects.get().max_in_flight == 3
    assert audit_rows().filter(kind="policy.update").count() == 1


def test_two_clears_of_one_budget_at_once_both_land_on_the_board(tx_personas: Personas) -> None:
    p = tx_personas
    budget(p, max_in_flight=2)
    confirm = signed_in(p.owner).get("/budgets/agent/inbox/clear").content.decode()
    form = {"version": hidden_version(confirm)}

    def clear(i: int) -> Any:
        return signed_in(p.owner).post("/budgets/agent/inbox/clear", form)

    answers = run_threads(2, clear)
    assert [(a.status_code, a["Location"]) for a in answers] == [(302, "/#edit-agent--inbox")] * 2
    assert not AdmissionPolicy.objects.exists()
    assert audit_rows().filter(kind="policy.delete").count() == 1


def field_errors(html: str) -> dict[str, str]:
    """Each error shown beside a field, by the field's id, as the page reads it."""
    found = re.findall(r'<p id="id_([^"]+)-error" class="error field-error">([^<]*)</p>', html)
    return {name: unescape(text) for name, text in found}


def stacked_form(**row: str) -> dict[str, str]:
    """The policy form with one stacked window (window 2 on the page)."""
    fields = {"limit": "3", "period": "day", "tz": "UTC", "start": "00:00", "weekday": ""}
    fields.update(row)
    return policy_form(
        **{"more-TOTAL_FORMS": "1", "more-INITIAL_FORMS": "0", "more-MAX_NUM_FORMS": "3"},
        **{f"more-0-{k}": v for k, v in fields.items()},
    )


def test_an_error_names_the_fields_by_their_labels_on_the_page(personas: Personas) -> None:
    client = signed_in(personas.owner)
    cases = {
        "window_weekday": (
            policy_form(window_period="week", window_weekday=""),
            "a week window needs Weekday, one of Mon, Tue, Wed, Thu, Fri, Sat, Sun",
        ),
        "max_in_flight": (
            policy_form(max_in_flight="", max_claims_per_window="", window_period=""),
            "a budget needs Max in flight, Max claims per window, or both",
        ),
        "more-0-weekday": (
            stacked_form(period="week"),
            "a week window needs Window 2's weekday, one of Mon, Tue, Wed, Thu, Fri, Sat, Sun",
        ),
        "more-0-period": (
            stacked_form(tz="Europe/Paris"),
            "Window 2 repeats an earlier window (same period, zone, start and weekday; an hour "
            "window starts at its minutes past every hour)",
        ),
        # What was typed is quoted as typed, even where it looks like a field's API name.
        "window_tz": (
            policy_form(window_tz="window.tz"),
            "'window.tz' is not a known IANA time zone",
        ),
    }
    for field, (form, message) in cases.items():
        response = client.post("/budgets/agent/inbox", form)
        assert response.status_code == 400, field
        errors = field_errors(response.content.decode())
        assert errors.get(field) == message, (field, errors)


def test_no_error_on_the_page_speaks_the_apis_field_names(personas: Personas) -> None:
    client = signed_in(personas.owner)
    api_names = re.compile(r"max_in_flight|max_claims_per_window|windows?\[|window\.|\btz\b")
    forms = [
        policy_form(window_period="week", window_weekday=""),
        policy_form(max_in_flight="", max_claims_per_window="", window_period=""),
        policy_form(max_in_flight="-1", max_claims_per_window="-1", window_start="25:00"),
        stacked_form(limit="-3", period="week", tz="Mars/Base", start="99:00"),
        stacked_form(tz="Europe/Paris"),
        stacked_form(limit="", tz="Asia/Tokyo"),
    ]
    for form in forms:
        html = client.post("/budgets/agent/inbox", form).content.decode()
        errors = field_errors(html)
        assert errors, form
        for field, text in errors.items():
            assert not api_names.search(text), (field, text)


def test_the_api_keeps_the_services_own_words(personas: Personas) -> None:
    with pytest.raises(InvalidArgument) as refused:
        PolicySpec.clean(
            queue="inbox",
            max_in_flight=None,
            max_claims_per_window=5,
            window={"period": "week", "tz": "UTC", "start": "00:00"},
        )
    assert refused.value.field == "window.weekday"
    assert "a week window needs window.weekday" in refused.value.message
