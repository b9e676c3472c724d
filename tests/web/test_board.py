"""The board at /: who sees which sections, filters, the budget strip, chips, fragments."""

from __future__ import annotations

import re

from django.db import connection
from django.test import Client

from queues import pauses, services
from tests.conftest import Personas, push
from tests.web.conftest import HTMX, budget, signed_in


def test_the_board_sends_a_visitor_to_sign_in(personas: Personas) -> None:
    response = Client().get("/?queue=inbox")
    assert response.status_code == 302
    assert response["Location"] == "/login/?next=/%3Fqueue%3Dinbox"


def test_an_owner_who_is_not_staff_signs_in_on_the_console_login(personas: Personas) -> None:
    client = Client()
    page = client.get("/login/")
    assert page.status_code == 200
    response = client.post(
        "/login/", {"username": "olive", "password": "pw-olive-123", "next": "/"}
    )
    assert response.status_code == 302 and response["Location"] == "/"
    assert client.get("/").status_code == 200


def test_an_owner_sees_only_the_sections_of_their_own_endpoints(personas: Personas) -> None:
    p = personas
    push(p, 1)
    push(p, 1, endpoint=p.foreign)
    html = signed_in(p.owner).get("/").content.decode()
    for key in ("agent--inbox", "agent--outbox", "agent--quarantine", "agent-two--inbox"):
        assert f'id="head-{key}"' in html
    assert "foreign--inbox" not in html


def test_auditors_and_superusers_see_the_whole_fleet(personas: Personas) -> None:
    p = personas
    for user in (p.auditor, p.admin):
        html = signed_in(user).get("/").content.decode()
        assert 'id="head-foreign--inbox"' in html and 'id="head-agent--inbox"' in html


def test_filters_live_in_the_query_string(personas: Personas) -> None:
    p = personas
    push(p, 2)
    push(p, 1, queue="outbox")
    client = signed_in(p.owner)
    html = client.get("/?endpoint=agent&queue=outbox").content.decode()
    assert 'id="head-agent--outbox"' in html
    assert 'id="head-agent--inbox"' not in html and 'id="head-agent-two--inbox"' not in html
    done = push(p, 1)[0]
    services.claim(actor=p.as_human(), todo_id=done.id)
    services.complete(actor=p.as_human(), todo_id=done.id)
    html = client.get("/?endpoint=agent&queue=inbox&state=done").content.decode()
    assert "todo 0" in html and 'class="card state-done"' in html
    assert 'class="card state-pending"' not in html


def test_an_unknown_state_filter_is_refused_not_read_as_live_work(personas: Personas) -> None:
    # It was read as the default, "live": a typo showed (and a bulk action took) every live todo.
    p = personas
    push(p, 1)
    response = signed_in(p.owner).get("/?state=nonsense")
    assert response.status_code == 400
    page = response.content.decode()
    assert "state must be one of pending, claimed" in page and "card state-pending" not in page


def test_htmx_gets_only_the_sections_fragment_from_the_same_url(personas: Personas) -> None:
    p = personas
    push(p, 1)
    response = signed_in(p.owner).get("/?queue=inbox", headers={**HTMX, "HX-Target": "sections"})
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="sections"')
    assert "<html" not in html and 'id="head-agent--inbox"' in html


def test_the_budget_strip_shows_usage_status_posture_and_resets_in_both_zones(
    personas: Personas,
) -> None:
    p = personas
    push(p, 3)
    budget(p, max_in_flight=5, max_claims_per_window=1, tz="America/Los_Angeles")
    services.claim_next(actor=p.as_agent())
    client = signed_in(p.owner)
    client.cookies["tz"] = "Asia/Tokyo"
    html = client.get("/?endpoint=agent&queue=inbox").content.decode()
    assert "Deferred · window used up" in html
    assert "1 of 1" in html and "1 of 5" in html
    assert "(America/Los_Angeles)" in html and ("PST" in html or "PDT" in html)
    assert "JST" in html  # the viewer's zone from the tz cookie
    assert "Deferred · window used up · eligible" in html
    assert "enforce" in html


def test_a_bad_zone_cookie_falls_back_to_utc(personas: Personas) -> None:
    client = signed_in(personas.owner)
    client.cookies["tz"] = "Not/AZone"
    assert "Times in UTC" in client.get("/").content.decode()


def test_a_paused_queue_shows_who_why_since_and_drain_progress(personas: Personas) -> None:
    p = personas
    push(p, 2)
    services.claim_next(actor=p.as_agent())
    pauses.queue_pause(actor=p.as_human(p.pauser), queue="inbox", reason="upgrading")
    client = signed_in(p.owner)
    html = client.get("/?endpoint=agent&queue=inbox").content.decode()
    assert 'class="badge tone-paused"' in html and "by paul" in html and "upgrading" in html
    assert "1 in flight" in html
    assert "paused · waits for resume" in html
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE queues_todo SET state = 'done', lease_expires_at = NULL, finished_at = now() WHERE state = 'claimed'"
        )
    html = client.get("/?endpoint=agent&queue=inbox").content.decode()
    assert "Drain: drained" in html


def test_a_paused_queues_budget_gives_no_time_it_will_not_keep(personas: Personas) -> None:
    """The budget's status read "Paused · eligible ≈ <the lease's end>": a paused queue's work
    waits for a resume whatever its budget says (README: no time)."""
    p = personas
    budget(p, max_in_flight=1)
    push(p, 2)
    services.claim_next(actor=p.as_agent())
    client = signed_in(p.owner)
    status = re.compile(r"<dt>status</dt><dd>([^<]*)</dd>")
    (running,) = status.findall(client.get("/?endpoint=agent&queue=inbox").content.decode())
    assert running.startswith("At cap") and "· eligible" in running, running
    pauses.queue_pause(actor=p.as_human(p.pauser), queue="inbox", reason="upgrading")
    for url in ("/?endpoint=agent&queue=inbox", "/queues/inbox"):
        (paused,) = status.findall(client.get(url).content.decode())
        assert paused == "Paused · waits for resume", (url, paused)


def test_a_budget_that_cannot_be_evaluated_shows_as_unavailable(personas: Personas) -> None:
    p = personas
    policy = budget(p, max_claims_per_window=3)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE admission_admissionpolicy SET window_tz = 'Gone/Zone' WHERE id = %s",
            [policy.id],
        )
    push(p, 1)
    html = signed_in(p.owner).get("/?endpoint=agent&queue=inbox").content.decode()
    assert "Deferred · admission unavailable" in html and "tone-unavailable" in html
    assert "Deferred · admission unavailable" in html


def test_a_zero_limit_holds_the_queue_and_says_so(personas: Personas) -> None:
    p = personas
    budget(p, max_in_flight=0)
    html = signed_in(p.owner).get("/?endpoint=agent&queue=inbox").content.decode()
    assert "Deferred · held by a zero limit" in html


def test_a_large_queue_shows_a_page_of_cards_with_a_way_to_the_rest(personas: Personas) -> None:
    p = personas
    push(p, 23)
    client = signed_in(p.owner)
    html = client.get("/").content.decode()
    assert "Showing 20 of 23." in html and "Show only this queue" in html
    html = client.get("/?endpoint=agent&queue=inbox&state=pending").content.decode()
    assert html.count('class="card state-pending"') == 23


def test_owners_see_edit_controls_only_for_their_budgets_and_no_pause_without_permission(
    personas: Personas,
) -> None:
    p = personas
    html = signed_in(p.owner).get("/").content.decode()
    assert 'id="edit-agent--inbox"' in html and "/budgets/agent/inbox" in html
    assert 'id="edit-agent--quarantine"' not in html
    assert "/pause" not in html
    admin_html = signed_in(p.admin).get("/").content.decode()
    assert 'id="pause-foreign--inbox"' in admin_html
    assert 'id="pause-agent--quarantine"' not in admin_html


def test_the_queue_list_and_queue_page_show_counts_and_pauses(personas: Personas) -> None:
    p = personas
    push(p, 2)
    pauses.queue_pause(actor=p.as_human(p.pauser), queue="outbox", reason="maint")
    client = signed_in(p.pauser)
    html = client.get("/queues").content.decode()
    assert ">inbox</a>" in html and ">outbox</a>" in html and "maint" in html
    page = client.get("/queues/outbox")
    assert page.status_code == 200 and "Resume outbox" in page.content.decode()
    assert "Resume" not in signed_in(p.owner).get("/queues/outbox").content.decode()
    fragment = client.get("/queues/inbox", headers={**HTMX, "HX-Target": "sections"})
    assert fragment.content.decode().lstrip().startswith('<div id="sections"')


def test_a_queue_page_for_a_name_nobody_uses_is_not_found_for_an_owner(personas: Personas) -> None:
    client = signed_in(personas.owner)
    assert client.get("/queues/nothing-here").status_code == 404
    assert client.get("/queues/bad%20name").status_code == 404


def test_the_quarantine_queue_page_offers_no_pause(personas: Personas) -> None:
    html = signed_in(personas.admin).get("/queues/quarantine").content.decode()
    assert "cannot be paused" in html and 'id="pause-queue"' not in html


def test_the_zone_preference_sets_a_cookie_and_refuses_an_unknown_zone(personas: Personas) -> None:
    client = signed_in(personas.owner)
    assert client.get("/prefs/tz").status_code == 200
    refused = client.post("/prefs/tz", {"tz": "Nowhere/Land", "next": "/ledger"})
    assert refused.status_code == 400 and "not a known IANA time zone" in refused.content.decode()
    near = client.post("/prefs/tz", {"tz": "america/new york", "next": "/ledger"})
    assert (
        near.status_code == 400
        and "did you mean &#x27;America/New_York&#x27;?" in near.content.decode()
    )
    response = client.post("/prefs/tz", {"tz": "Europe/Paris", "next": "/ledger"})
    assert response.status_code == 302 and response["Location"] == "/ledger"
    assert response.cookies["tz"].value == "Europe/Paris"
    offsite = client.post("/prefs/tz", {"tz": "UTC", "next": "https://evil.example/"})
    assert offsite["Location"] == "/"


def test_a_url_encoded_zone_cookie_from_an_older_script_still_counts(personas: Personas) -> None:
    client = signed_in(personas.owner)
    client.cookies["tz"] = "Europe%2FParis"
    assert "Times in Europe/Paris" in client.get("/").content.decode()


def test_a_cards_title_and_the_page_it_returns_to_are_escaped(personas: Personas) -> None:
    p = personas
    services.todo_create(
        actor=p.as_agent(p.agent),
        endpoint=p.agent,
        queue="inbox",
        title='<img src=x onerror="alert(1)"> & co',
    )
    html = signed_in(p.owner).get("/?q=<img&state=pending").content.decode()
    assert "<img src=x" not in html
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt; &amp; co</bdi></a>" in html
    # The card links back to the board as filtered, the query quoted inside the attribute.
    assert "?next=/%3Fq%3D%253Cimg%26state%3Dpending" in html
