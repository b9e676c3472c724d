"""Pause and resume from the board and the queue page, for holders of queues.pause_queue."""

from __future__ import annotations

from queues.models import QueuePause
from tests.conftest import Personas, push
from tests.web.conftest import HTMX, signed_in


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
    html = response.content.decode()
    assert response.status_code == 400
    assert 'id="pause-queue-error"' in html and "a reason is required" in html
    assert 'value="/?queue=inbox"' in html  # the way back survives the error
    assert not QueuePause.objects.exists()
    too_long = client.post("/queues/inbox/pause", {"reason": "x" * 501})
    assert too_long.status_code == 400 and 'value="' + "x" * 501 + '"' in too_long.content.decode()


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
    refused = client.post("/queues/quarantine/pause", {"reason": "x"})
    assert refused.status_code == 400 and "never delivered" in refused.content.decode()
    assert not QueuePause.objects.exists()


def test_pause_views_take_only_posts(personas: Personas) -> None:
    client = signed_in(personas.admin)
    assert client.get("/queues/inbox/pause").status_code == 405
    assert client.get("/queues/inbox/resume").status_code == 405
