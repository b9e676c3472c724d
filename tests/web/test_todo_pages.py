"""The todo drawer (/todos/<id>: a page, or a fragment for htmx) and the operator actions."""

from __future__ import annotations

import json
import re
import uuid
from zoneinfo import ZoneInfo

from django.db import connection
from django.utils.html import escape

from queues import pauses, services
from queues.models import TodoState
from switchboard.core import validation
from switchboard.ledger import chain as ledger
from switchboard.ledger.models import LedgerEntry, LedgerKind
from tests.conftest import Personas, push
from tests.limits.conftest import pool
from tests.web.conftest import HTMX, budget, signed_in


def test_the_todo_page_shows_payload_attempts_and_admission(personas: Personas) -> None:
    p = personas
    first, second = push(p, 2, payload={"ticket": 42})
    budget(p, max_claims_per_window=1)
    services.claim(actor=p.as_human(), todo_id=first.id)
    html = signed_in(p.owner).get(f"/todos/{second.id}?next=/%3Fqueue%3Dinbox").content.decode()
    assert "&quot;ticket&quot;: 42" in html
    assert "Deferred · window used up · eligible" in html
    assert "Never claimed." in html
    assert 'href="/?queue=inbox"' in html  # back to where the viewer came from
    claimed = signed_in(p.owner).get(f"/todos/{first.id}").content.decode()
    assert "operator:olive" in claimed and "board" in claimed and "in flight" in claimed


def test_htmx_gets_the_drawer_fragment_from_the_same_url(personas: Personas) -> None:
    p = personas
    (todo,) = push(p, 1)
    response = signed_in(p.owner).get(f"/todos/{todo.id}", headers={**HTMX, "HX-Target": "drawer"})
    html = response.content.decode()
    assert html.lstrip().startswith('<article class="todo"') and "<html" not in html
    assert "data-close-drawer" in html


def test_a_foreign_or_unknown_todo_is_not_found(personas: Personas) -> None:
    p = personas
    (foreign,) = push(p, 1, endpoint=p.foreign)
    client = signed_in(p.owner)
    assert client.get(f"/todos/{foreign.id}").status_code == 404
    assert client.get(f"/todos/{uuid.uuid4()}").status_code == 404
    assert client.post(f"/todos/{foreign.id}/claim").status_code == 404


def test_an_operator_claims_completes_fails_releases_and_retries_through_the_services(
    personas: Personas,
) -> None:
    p = personas
    a, b = push(p, 2, max_attempts=1)
    client = signed_in(p.owner)
    back = f"/todos/{a.id}?next=/"
    response = client.post(f"/todos/{a.id}/claim", {"next": back})
    assert response.status_code == 302 and response["Location"] == back
    a.refresh_from_db()
    assert a.state == TodoState.CLAIMED and a.owner == "operator:olive"
    assert a.claim_via == "board" and not a.attempts.exists()  # its row: when it ends
    client.post(
        f"/todos/{a.id}/complete",
        {"summary": "by hand", "result": '{"ok": true}', "attempt": "1"},
    )
    a.refresh_from_db()
    assert (a.state, a.result) == (TodoState.DONE, {"ok": True})
    assert a.attempts.get().via == "board"

    client.post(f"/todos/{b.id}/claim")
    client.post(f"/todos/{b.id}/release", {"attempt": "1"})
    b.refresh_from_db()
    assert b.state == TodoState.FAILED and b.dead_letter  # its only attempt was released
    client.post(f"/todos/{b.id}/retry")
    b.refresh_from_db()
    # A fresh round: the attempt number goes on, so the page of attempt 1 ends nothing now.
    assert (b.state, b.attempt, b.max_attempts) == (TodoState.PENDING, 1, 2)
    client.post(f"/todos/{b.id}/claim")
    stale = client.post(f"/todos/{b.id}/fail", {"error": "old page", "attempt": "1"}, follow=True)
    assert "this attempt was superseded: the todo was claimed again since" in stale.content.decode()
    followed = client.post(f"/todos/{b.id}/fail", {"error": "nope", "attempt": "2"}, follow=True)
    assert "Failed: dead-lettered." in followed.content.decode()
    b.refresh_from_db()
    assert b.result == {"error": "nope"}


def test_a_refused_action_comes_back_as_a_message(personas: Personas) -> None:
    p = personas
    (todo,) = push(p, 1)
    client = signed_in(p.owner)
    response = client.post(f"/todos/{todo.id}/complete", {"attempt": "1"}, follow=True)
    assert "todo is pending, not claimed" in response.content.decode()
    budget(p, max_in_flight=0)
    refused = client.post(f"/todos/{todo.id}/claim", follow=True)
    assert "is deferred" in refused.content.decode()
    todo.refresh_from_db()
    assert todo.state == TodoState.PENDING


def test_with_htmx_an_action_answers_the_refreshed_drawer(personas: Personas) -> None:
    p = personas
    (todo,) = push(p, 1)
    response = signed_in(p.owner).post(
        f"/todos/{todo.id}/claim",
        {"next": f"/todos/{todo.id}?next=/"},
        headers={**HTMX, "HX-Target": "drawer"},
        follow=True,
    )
    html = response.content.decode()
    assert html.lstrip().startswith('<article class="todo"')
    assert "Claimed" in html and "Complete" in html


def test_an_unknown_action_is_not_found_and_actions_take_only_posts(personas: Personas) -> None:
    p = personas
    (todo,) = push(p, 1)
    client = signed_in(p.owner)
    assert client.post(f"/todos/{todo.id}/explode").status_code == 404
    assert client.get(f"/todos/{todo.id}/claim").status_code == 405


def test_owners_do_not_act_on_another_owners_todos_even_with_the_pause_permission(
    personas: Personas,
) -> None:
    p = personas
    (todo,) = push(p, 1)
    assert signed_in(p.pauser).post(f"/todos/{todo.id}/claim").status_code == 404
    todo.refresh_from_db()
    assert todo.state == TodoState.PENDING


def test_a_claims_message_isolates_the_agents_title(personas: Personas) -> None:
    # A flash message is escaped text, not HTML: the title is wrapped in FIRST STRONG ISOLATE and
    # POP DIRECTIONAL ISOLATE, so a right-to-left override in it cannot reorder "(attempt 1)".
    p = personas
    todo = services.todo_create(
        actor=p.as_agent(), endpoint=p.agent, queue="inbox", title="Tricky \u202e"
    ).todo
    response = signed_in(p.owner).post(f"/todos/{todo.id}/claim", follow=True)
    shown = [str(m) for m in response.context["messages"]]
    assert shown == ["Claimed “\u2068Tricky \u202e\u2069” (attempt 1)."]


def test_stored_json_python_cannot_read_shows_as_unreadable_on_every_page(
    personas: Personas,
) -> None:
    # jsonb keeps 1e5000 and writes it out as 5,001 digits, more than Python converts to an int:
    # a payload, result or attempt error written so behind the services' back is shown as
    # unreadable, never a server error.
    p = personas
    pending, done, failed = push(p, 3)
    services.claim(actor=p.as_human(), todo_id=done.id)
    services.complete(actor=p.as_human(), todo_id=done.id, result={"ok": True})
    services.claim(actor=p.as_human(), todo_id=failed.id)
    services.fail(actor=p.as_human(), todo_id=failed.id, error={"why": "first"})
    with connection.cursor() as cursor:
        cursor.execute("UPDATE queues_todo SET payload = %s::jsonb", ['{"n": 1e5000}'])
        cursor.execute(
            "UPDATE queues_todo SET result = %s::jsonb WHERE id = %s", ["[1e5000]", done.id]
        )
        cursor.execute(
            "UPDATE queues_attempt SET error = %s::jsonb WHERE todo_id = %s",
            ['{"n": -1e5000}', failed.id],
        )
    unreadable = escape(json.dumps(validation.UNREADABLE["unreadable"]))
    pages = {
        signed_in(p.owner): [
            "/?queue=inbox",
            f"/todos/{pending.id}",
            f"/todos/{done.id}",
            f"/todos/{failed.id}",
            "/queues/inbox",
            "/agents",
        ],
        signed_in(p.admin): [
            "/admin/queues/todo/",
            f"/admin/queues/todo/{pending.id}/change/",
            f"/admin/queues/todo/{done.id}/change/",
            f"/admin/queues/todo/{failed.id}/change/",
            "/admin/queues/attempt/",
        ],
    }
    for client, urls in pages.items():
        for url in urls:
            response = client.get(url)
            assert response.status_code == 200, url
    client = signed_in(p.owner)
    for todo in (done, failed):  # the payload, and the result or the attempt's error
        assert client.get(f"/todos/{todo.id}").content.decode().count(unreadable) == 2


def _shown_attempt(html: str, action: str) -> str:
    form = html[html.index('action="/todos/') :]
    form = form[form.index(f"/{action}") :]
    form = form[: form.index("</form>")]
    marker = 'name="attempt" value="'
    start = form.index(marker) + len(marker)
    return form[start : form.index('"', start)]


def test_an_action_ends_the_claim_the_page_showed_never_a_newer_one(personas: Personas) -> None:
    # The forms carried no attempt: an agent that released and claimed again after the page
    # loaded had its new claim completed (or failed, or released) by the operator's press.
    p = personas
    (todo,) = push(p, 1, max_attempts=5)
    agent = p.as_agent()
    services.claim(actor=agent, todo_id=todo.id)
    client = signed_in(p.owner)
    page = client.get(f"/todos/{todo.id}").content.decode()
    shown = {action: _shown_attempt(page, action) for action in ("complete", "fail", "release")}
    assert shown == {"complete": "1", "fail": "1", "release": "1"}
    services.release(actor=agent, todo_id=todo.id)
    services.claim(actor=agent, todo_id=todo.id)  # attempt 2, after the page loaded
    for action, fields in (
        ("complete", {"summary": "saw attempt 1"}),
        ("fail", {"error": "saw attempt 1"}),
        ("release", {}),
    ):
        answer = client.post(
            f"/todos/{todo.id}/{action}", {**fields, "attempt": shown[action]}, follow=True
        )
        assert "this attempt was superseded" in answer.content.decode(), action
        todo.refresh_from_db()
        assert (todo.state, todo.attempt) == (TodoState.CLAIMED, 2), action
    bad = client.post(f"/todos/{todo.id}/complete", {"attempt": "²"}, follow=True)
    assert "attempt: " in bad.content.decode()
    # A form that does not say (a page from before the field, a script) ends nothing.
    unsaid = client.post(f"/todos/{todo.id}/complete", {"summary": "x"}, follow=True)
    assert "attempt: the form did not say which attempt it ends" in unsaid.content.decode()
    todo.refresh_from_db()
    assert todo.state == TodoState.CLAIMED
    current = _shown_attempt(client.get(f"/todos/{todo.id}").content.decode(), "complete")
    client.post(f"/todos/{todo.id}/complete", {"summary": "saw 2", "attempt": current})
    todo.refresh_from_db()
    assert (todo.state, todo.attempt) == (TodoState.DONE, 2)


def test_the_gates_detail_says_its_times_in_the_viewers_zone(personas: Personas) -> None:
    # The pause gate's detail said "since 2026-12-05T15:42:54.221536Z" a line below the same
    # instant in the viewer's zone.
    p = personas
    (todo,) = push(p, 1)
    pause = pauses.queue_pause(actor=p.as_human(p.admin), queue="inbox", reason="upgrade").pause
    client = signed_in(p.owner)
    client.cookies["tz"] = "Asia/Kolkata"
    html = client.get(f"/todos/{todo.id}").content.decode()
    gates = html[html.index('aria-labelledby="explain-title"') :]
    gates = gates[: gates.index("</section>")]
    local = pause.at.astimezone(ZoneInfo("Asia/Kolkata")).strftime("%Y-%m-%d %H:%M:%S IST")
    assert f"since {local}: upgrade" in gates
    assert not re.search(r"\d{4}-\d{2}-\d{2}T\d{2}:", gates)


def test_a_claim_a_gate_would_refuse_is_not_offered_and_the_page_says_until_when(
    personas: Personas,
) -> None:
    # "Claim as operator" was offered on a todo a budget or a pool held, and then refused.
    p = personas
    (todo,) = push(p, 1)
    client = signed_in(p.owner)
    assert f"/todos/{todo.id}/claim" in client.get(f"/todos/{todo.id}").content.decode()
    budget(p, max_in_flight=0)
    html = client.get(f"/todos/{todo.id}").content.decode()
    assert f"/todos/{todo.id}/claim" not in html
    assert "Claim is not offered: budget holds it until an operator acts" in html
    assert f"/todos/{todo.id}/discard" in html  # the other actions stay


def _admission(html: str) -> str | None:
    """The todo page's Admission section, or None when it has none."""
    if 'aria-label="Admission"' not in html:
        return None
    section = html[html.index('aria-label="Admission"') :]
    return section[: section.index("</section>")]


def test_the_admission_section_says_only_what_is_so(personas: Personas) -> None:
    """A dead letter's page had an Admission heading with nothing under it; a pending todo a
    pool held read "No budget on this queue identity: a claim is admitted." above Gates saying
    the pool held it."""
    p = personas
    client = signed_in(p.owner)
    (free,) = push(p, 1)
    said = _admission(client.get(f"/todos/{free.id}").content.decode())
    assert said is not None and "No budget on this queue identity: a claim is admitted." in said
    pool("gpu", slots=0)
    (held,) = push(p, 1, pool="gpu")
    html = client.get(f"/todos/{held.id}").content.decode()
    said = _admission(html)
    assert said is not None and "No budget on this queue identity." in said, said
    assert "a claim is admitted" not in html and "Claim is not offered: pool holds it" in html
    services.claim(actor=p.as_agent(), todo_id=free.id)
    services.complete(actor=p.as_agent(), todo_id=free.id)
    assert _admission(client.get(f"/todos/{free.id}").content.decode()) is None


def test_an_operators_claim_is_a_ledger_row_naming_who_took_what(personas: Personas) -> None:
    # A human's claim takes work an agent would have had; only its ending was ledgered.
    p = personas
    (todo,) = push(p, 1)
    signed_in(p.owner).post(f"/todos/{todo.id}/claim")
    row = LedgerEntry.objects.get(kind=LedgerKind.TODO_CLAIM)
    assert (row.actor_human_name, row.scope, row.queue) == ("olive", "endpoint:agent", "inbox")
    assert row.before == {"state": "pending", "attempt": 0}
    assert row.after is not None
    assert (row.after["state"], row.after["owner"], row.after["attempt"]) == (
        "claimed",
        "operator:olive",
        1,
    )
    assert row.after["todos"] == [str(todo.id)]
    services.claim(actor=p.as_agent(), todo_id=push(p, 1)[0].id)  # an agent's: no row
    assert LedgerEntry.objects.filter(kind=LedgerKind.TODO_CLAIM).count() == 1
    assert ledger.verify().ok
