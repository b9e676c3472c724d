"""Pause and resume from the board and the queue page, for holders of queues.pause_queue."""

from __future__ import annotations

import re

from queues.models import QueuePause
from tests.conftest import Personas, push
from tests.web.conftest import HTMX, budget, signed_in


def test_a_pauser_pauses_and_resumes_and_is_sent_back_where_they_were(personas: Personas) -> None:
    p = personas
    push(p, 1)
    client = signed_in(p.pauser)
    response = client.post("/queues/inbox/pause", {"reason": "upgrade", "next": "/queues"})
    assert response.status_code == 302 and response["Location"] == "/queues"
    pause = QueuePause.objects.get()
    assert (pause.queue, pause.reason, pause.paused_by) == ("inbox", "upgrade", p.pauser)
    again = client.post("/queues/inbox/pause", {"reason": "twice"}, follow=True)
    assert "already paused by paul" in again.content.decode()
    response = client.post("/queues/inbox/resume", {"next": "/"})
    assert response.status_code == 302 and not QueuePause.objects.exists()
    not_paused = client.post("/queues/inbox/resume", follow=True)
    assert "inbox was not paused" in not_paused.content.decode()


def test_a_blank_reason_is_refused_beside_the_field_keeping_what_was_typed(
    personas: Personas,
) -> None:
    p = personas
    push(p, 1)
    client = signed_in(p.pauser)
    response = client.post("/queues/inbox/pause", {"reason": "   ", "next": "/?queue=inbox"})
    # To the queue page (post/redirect/get): the browser is not left on a URL taking only posts.
    assert response.status_code == 302
    assert response["Location"] == "/queues/inbox?next=%2F%3Fqueue%3Dinbox"
    html = client.get(response["Location"]).content.decode()
    assert 'id="pause-queue-error"' in html and "a reason is required" in html
    assert 'value="   "' in html
    assert 'value="/?queue=inbox"' in html  # the way back survives the error
    assert not QueuePause.objects.exists()
    again = client.get(response["Location"]).content.decode()  # a reload: said once
    assert "a reason is required" not in again and 'value="/?queue=inbox"' in again
    too_long = client.post("/queues/inbox/pause", {"reason": "x" * 501}, follow=True)
    assert too_long.redirect_chain == [("/queues/inbox", 302)]
    assert 'value="' + "x" * 501 + '"' in too_long.content.decode()


def test_a_reason_too_long_is_refused_in_one_message_with_or_without_htmx(
    personas: Personas,
) -> None:
    # The form's own length check and the service's both spoke: "Ensure this value has at most
    # 500 characters (it has 501). reason is at most 500 characters".
    p = personas
    push(p, 1)
    client = signed_in(p.admin)
    plain = client.post("/queues/inbox/pause", {"reason": "x" * 501}, follow=True)
    swapped = client.post(
        "/queues/inbox/pause",
        {"reason": "x" * 501, "form_id": "pause-agent--inbox", "next": "/"},
        headers={**HTMX, "HX-Target": "sections"},
    )
    for html in (plain.content.decode(), swapped.content.decode()):
        error = re.search(r'<p id="pause-[^"]*-error"[^>]*>(.*?)</p>', html, re.S)
        assert error is not None
        assert error.group(1).strip() == "reason is at most 500 characters"
        assert "Ensure this value" not in html
    assert not QueuePause.objects.exists()


def test_a_refusal_that_is_not_the_reasons_fault_is_the_pages_message(
    personas: Personas,
) -> None:
    client = signed_in(personas.admin)
    refused = client.post("/queues/quarantine/pause", {"reason": "x"}, follow=True)
    assert refused.redirect_chain == [("/queues/quarantine", 302)]
    html = refused.content.decode()
    assert 'class="msg error"' in html and "never delivered" in html
    assert not QueuePause.objects.exists()


def test_with_htmx_a_refused_pause_swaps_only_the_form_that_posted(personas: Personas) -> None:
    p = personas
    push(p, 1)
    response = signed_in(p.admin).post(
        "/queues/inbox/pause",
        {"reason": " ", "form_id": "pause-agent--inbox", "next": "/"},
        headers={**HTMX, "HX-Target": "sections"},
    )
    assert response.status_code == 200
    assert response["HX-Retarget"] == "#pause-agent--inbox"
    assert response["HX-Reswap"] == "outerHTML"
    html = response.content.decode()
    assert html.lstrip().startswith('<form id="pause-agent--inbox"')
    assert "a reason is required" in html


def test_with_htmx_a_pause_redirects_to_the_page_which_answers_its_fragment(
    personas: Personas,
) -> None:
    p = personas
    push(p, 1)
    client = signed_in(p.admin)
    response = client.post(
        "/queues/inbox/pause",
        {"reason": "now", "next": "/?queue=inbox"},
        headers={**HTMX, "HX-Target": "sections"},
        follow=True,
    )
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="sections"')
    assert "Paused inbox" in html  # the message rides in the fragment
    assert "Resume inbox" in html


def test_pausing_needs_the_permission(personas: Personas) -> None:
    p = personas
    push(p, 1)
    response = signed_in(p.owner).post("/queues/inbox/pause", {"reason": "mine"})
    assert response.status_code == 403
    assert not QueuePause.objects.exists()


def test_pausing_an_unknown_queue_or_quarantine_is_refused(personas: Personas) -> None:
    client = signed_in(personas.admin)
    assert client.post("/queues/never-used/pause", {"reason": "x"}).status_code == 404
    refused = client.post("/queues/quarantine/pause", {"reason": "x"}, follow=True)
    assert refused.status_code == 200 and "never delivered" in refused.content.decode()
    assert not QueuePause.objects.exists()


def test_pause_views_take_only_posts(personas: Personas) -> None:
    client = signed_in(personas.admin)
    assert client.get("/queues/inbox/pause").status_code == 405
    assert client.get("/queues/inbox/resume").status_code == 405


def test_with_htmx_the_queue_page_answers_a_pause_with_its_list_and_its_panel(
    personas: Personas,
) -> None:
    # Only the list came back: the panel above it went on saying "Healthy … Pause".
    p = personas
    push(p, 1)
    client = signed_in(p.admin)
    response = client.post(
        "/queues/inbox/pause",
        {"reason": "now", "form_id": "pause-agent--inbox", "next": "/queues/inbox"},
        headers={**HTMX, "HX-Target": "sections"},
        follow=True,
    )
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="sections"')
    panel = html[html.index('<div id="queue-pause"') :]
    assert 'hx-swap-oob="true"' in panel.split(">", 1)[0]
    assert "Paused</strong> by ada" in panel and "Resume inbox" in panel


def test_the_queue_pages_panel_alone_for_the_live_board(personas: Personas) -> None:
    p = personas
    push(p, 1)
    client = signed_in(p.admin)
    client.post("/queues/inbox/pause", {"reason": "now"})
    html = client.get(
        "/queues/inbox", headers={**HTMX, "HX-Target": "queue-pause"}
    ).content.decode()
    assert html.lstrip().startswith('<div id="queue-pause"')
    assert "hx-swap-oob" not in html and 'id="sections"' not in html
    assert "Paused</strong> by ada" in html


def test_a_resume_the_budget_still_holds_says_nothing_is_handed_out_yet(
    personas: Personas,
) -> None:
    # It said "Resumed inbox: its todos are handed out again." while the budget held them all.
    p = personas
    push(p, 2)
    budget(p, "inbox", max_in_flight=0)
    client = signed_in(p.pauser)
    client.post("/queues/inbox/pause", {"reason": "upgrade"})
    page = client.post("/queues/inbox/resume", follow=True).content.decode()
    assert "Resumed inbox, but nothing is handed out yet" in page
    assert f"still held by a budget or a named limit ({p.agent.slug})" in page
    assert "handed out again" not in page
