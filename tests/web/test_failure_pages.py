"""Failures on the console: the todo page shows every attempt's error (JSON indented, a
traceback as code), dead letters read dead, discard from the page, and bulk retry or discard of
the board's selection through a confirmation page that changes nothing until confirmed."""

from __future__ import annotations

import html as htmllib
import re
from typing import Any
from zoneinfo import ZoneInfo

from django.test import Client

from queues import services, tasks
from queues.models import Todo, TodoState
from switchboard.ledger.models import LedgerEntry, LedgerKind
from tests.conftest import Personas, audit_rows, lapse, make_retry_due, push
from tests.web.conftest import budget, signed_in


def fail(p: Personas, todo: Any, error: Any) -> None:
    agent = p.as_agent(todo.endpoint)
    services.claim(actor=agent, todo_id=todo.id, claimant="worker-7")
    services.fail(actor=agent, todo_id=todo.id, error=error)


def dead_letters(p: Personas, n: int, queue: str = "inbox") -> list[Any]:
    todos = push(p, n, queue=queue, max_attempts=1)
    for t in todos:
        fail(p, t, "boom")
    return todos


def token_of(page: str) -> str:
    match = re.search(r'name="selection" value="([0-9a-f]+)"', page)
    assert match, "the page offers no confirmation"
    return match.group(1)


def hidden_fields(page: str) -> dict[str, str]:
    form = page[page.index('<form method="post" action="/todos/bulk/') :]
    form = form[: form.index("</form>")]
    fields = re.findall(r'type="hidden" name="(\w+)" value="([^"]*)"', form)
    return {
        name: htmllib.unescape(value) for name, value in fields if name != "csrfmiddlewaretoken"
    }


def test_the_todo_page_shows_every_attempts_error_and_the_traceback_as_code(
    personas: Personas,
) -> None:
    p = personas
    [todo] = push(p, 1, max_attempts=2)
    fail(p, todo, {"type": "TimeoutError", "traceback": 'File "agent.py", line 3\nTimeoutError'})
    make_retry_due(todo)
    fail(p, todo, {"type": "ValueError", "detail": {"field": "amount"}})

    page = signed_in(p.owner).get(f"/todos/{todo.id}").content.decode()

    assert '<pre class="traceback"' in page
    assert "<code>File &quot;agent.py&quot;, line 3\nTimeoutError</code>" in page
    assert '"type": "TimeoutError"' in htmllib.unescape(page)
    assert '"detail": {\n    "field": "amount"\n  }' in htmllib.unescape(page)
    assert page.count('class="attempt-error"') == 2
    assert "dead letter" in page and "no retry will come" in page
    assert "Held by" not in page and "Last held by" in page


def test_a_dead_letter_is_discarded_from_its_page(personas: Personas) -> None:
    p = personas
    [dead] = dead_letters(p, 1)
    client = signed_in(p.owner)
    page = client.get(f"/todos/{dead.id}").content.decode()
    assert f'action="/todos/{dead.id}/discard"' in page
    assert 'name="seen_state" value="failed"' in page

    response = client.post(f"/todos/{dead.id}/discard", {"seen_state": "failed"}, follow=True)

    assert "Discarded" in response.content.decode()
    assert Todo.objects.get(pk=dead.pk).state == TodoState.DISCARDED
    assert LedgerEntry.objects.filter(kind=LedgerKind.TODO_DISCARD).count() == 1


def test_a_retry_the_service_would_refuse_is_not_offered_and_the_page_says_why(
    personas: Personas,
) -> None:
    p = personas
    [dead] = dead_letters(p, 1)
    client = signed_in(p.owner)
    page = client.get(f"/todos/{dead.id}").content.decode()
    assert f'action="/todos/{dead.id}/retry"' in page and "Retry it or discard it." in page

    services.endpoint_revoke(actor=p.as_human(), endpoint=p.agent)
    page = client.get(f"/todos/{dead.id}").content.decode()
    assert f'action="/todos/{dead.id}/retry"' not in page
    assert f'action="/todos/{dead.id}/discard"' in page
    assert "Retry is not offered" in page and "agent is revoked" in page
    # The board's bulk retry leaves it out, and its confirmation says so.
    bulk = client.get("/todos/bulk/retry?state=dead_letter").content.decode()
    assert "Nothing to retry" in bulk and "1 failed todo of the selection is left out" in bulk
    # A retry posted anyway (a page open from before the revoke) is refused, and says why.
    response = client.post(f"/todos/{dead.id}/retry", follow=True)
    assert "agent is revoked" in response.content.decode()
    assert Todo.objects.get(pk=dead.pk).state == TodoState.FAILED


def test_the_board_offers_bulk_actions_on_a_filtered_selection(personas: Personas) -> None:
    p = personas
    dead_letters(p, 2)
    client = signed_in(p.owner)
    assert "Retry the failed ones" not in client.get("/").content.decode()
    board = client.get("/?state=dead_letter").content.decode()
    assert 'href="/todos/bulk/retry?state=dead_letter"' in board
    assert 'href="/todos/bulk/discard?state=dead_letter"' in board
    # Filtered by anything but state, the retry takes the failed ones of the selection: under
    # the default live filter it went to a page with nothing to retry.
    for url in ("/queues/inbox", "/?queue=inbox", "/?queue=inbox&state=pending"):
        page = client.get(url).content.decode()
        assert 'href="/todos/bulk/retry?queue=inbox&amp;state=failed"' in page, url
        assert 'href="/todos/bulk/discard?queue=inbox' in page, url
    assert (
        "Retry 2 todos?"
        in client.get("/todos/bulk/retry?queue=inbox&state=failed").content.decode()
    )
    auditor = signed_in(p.auditor).get("/?state=dead_letter").content.decode()
    assert "/todos/bulk/" not in auditor


def test_a_bulk_retry_shows_count_and_sample_and_changes_nothing_until_confirmed(
    personas: Personas,
) -> None:
    p = personas
    dead = dead_letters(p, 12)
    dead_letters(p, 1, queue="outbox")
    client = signed_in(p.owner)

    page = client.get("/todos/bulk/retry?state=dead_letter&queue=inbox").content.decode()

    assert "Retry 12 todos?" in page
    assert "The first 10 of 12" in page
    assert page.count('<li><a href="/todos/') == 10
    assert Todo.objects.filter(state=TodoState.FAILED).count() == 13
    assert hidden_fields(page) == {
        "selection": token_of(page),
        "queue": "inbox",
        "state": "dead_letter",
    }

    response = client.post("/todos/bulk/retry", hidden_fields(page), follow=True)

    assert response.redirect_chain[0][0] == "/?queue=inbox&state=dead_letter"
    assert "Retried 12 todos." in response.content.decode()
    assert set(
        Todo.objects.filter(pk__in=[t.id for t in dead]).values_list("state", flat=True)
    ) == {TodoState.PENDING}
    assert Todo.objects.get(queue="outbox").state == TodoState.FAILED
    # The same confirmation again (a double click): done already, and the page says so, where it
    # said "the selection changed since you looked ... Nothing was changed".
    rows = audit_rows().filter(kind="todo.retry").count()
    again = client.post("/todos/bulk/retry", hidden_fields(page), follow=True)
    assert again.redirect_chain[0][0] == "/?queue=inbox&state=dead_letter"
    shown = [str(m) for m in again.context["messages"]]
    assert len(shown) == 1
    assert shown[0].startswith("Already retried: your confirmation retried these 12 todos at ")
    assert shown[0].endswith(". Nothing more was changed.")
    assert audit_rows().filter(kind="todo.retry").count() == rows


def test_a_stale_confirmation_shows_the_selection_again_and_changes_nothing(
    personas: Personas,
) -> None:
    p = personas
    dead = dead_letters(p, 3)
    client = signed_in(p.owner)
    page = client.get("/todos/bulk/discard?state=failed").content.decode()
    services.todo_retry(actor=p.as_human(p.admin), todo_id=dead[0].id)  # meanwhile

    response = client.post("/todos/bulk/discard", hidden_fields(page))

    again = response.content.decode()
    assert response.status_code == 409
    assert "The selection changed since you looked" in again
    assert "Discard 2 todos?" in again
    assert token_of(again) != token_of(page)
    assert not Todo.objects.filter(state=TodoState.DISCARDED).exists()
    client.post("/todos/bulk/discard", hidden_fields(again))
    assert Todo.objects.filter(state=TodoState.DISCARDED).count() == 2


def test_a_condition_filter_narrows_the_selection_to_its_queues(personas: Personas) -> None:
    p = personas
    dead_letters(p, 2)
    push(p, 3, queue="outbox")
    client = signed_in(p.owner)
    page = client.get("/todos/bulk/discard?condition=dead_letters&state=failed").content.decode()
    assert "Discard 2 todos?" in page
    assert "in queues now “Dead letters”" in page
    everything = client.get("/todos/bulk/discard?state=live").content.decode()
    assert "Discard 3 todos?" in everything  # pending outbox; claimed work is left alone
    # The selection ends its sentence: no stray space before the full stop.
    assert "of every endpoint you may change. Pending and failed todos" in everything


BAD_FILTERS = [
    ("state", "faild", "state must be one of pending, claimed"),
    ("queue", "In Box", "queue is not a queue name"),
    ("condition", "bogus", "condition must be one of "),
    ("endpoint", "e" * 64, "endpoint is at most 63 characters"),
    ("q", "x" * 201, "q is at most 200 characters"),
]


def test_a_filter_the_board_cannot_read_is_refused_never_widened(personas: Personas) -> None:
    # A typed or stale link's filter was dropped: "state=faild" selected every live todo, and
    # a bulk discard's confirmation discarded them. Each is refused naming it, nothing changed
    # (the board's live stream too: tests/web/test_live.py).
    p = personas
    pending = push(p, 2)
    dead = dead_letters(p, 1)
    client = signed_in(p.owner)
    for name, value, words in BAD_FILTERS:
        query = {"endpoint": "agent", name: value}
        for url in ("/", "/todos/bulk/discard", "/todos/bulk/retry"):
            page = client.get(url, query)
            assert page.status_code == 400, (url, name)
            assert words in htmllib.unescape(page.content.decode()), (url, name)
            assert 'name="selection"' not in page.content.decode()
        good = client.get("/todos/bulk/discard", {"endpoint": "agent"}).content.decode()
        posted = client.post("/todos/bulk/discard", {**hidden_fields(good), **query})
        assert posted.status_code == 400, name
        assert words in htmllib.unescape(posted.content.decode()), name
    states = {t.id: Todo.objects.get(pk=t.id).state for t in [*pending, *dead]}
    assert set(states.values()) == {TodoState.PENDING, TodoState.FAILED}
    assert not audit_rows().filter(kind__in=["todo.discard", "todo.retry"]).exists()
    # The same filters spelled right still work.
    assert client.get("/", {"endpoint": "agent", "state": "failed"}).status_code == 200


def test_nothing_to_act_on_says_so_and_offers_no_form(personas: Personas) -> None:
    p = personas
    push(p, 2)
    page = signed_in(p.owner).get("/todos/bulk/retry?state=pending").content.decode()
    assert "Nothing to retry" in page and "No todo in this selection can be retried" in page
    assert 'name="selection"' not in page


def test_auditors_and_unknown_actions_are_refused(personas: Personas, client: Client) -> None:
    p = personas
    dead_letters(p, 1)
    auditor = signed_in(p.auditor)
    assert auditor.get("/todos/bulk/retry?state=failed").status_code == 403
    assert auditor.post("/todos/bulk/retry", {"selection": "x"}).status_code == 403
    assert signed_in(p.owner).get("/todos/bulk/explode").status_code == 404
    assert client.get("/todos/bulk/retry").status_code == 302  # signed out: to the sign-in


def test_a_lapsed_lease_reads_lapsed_and_offers_only_its_release(personas: Personas) -> None:
    """It read "Attempt 1 · in flight" and "Lease until" a past time, and offered Complete and
    Fail, which the service refuses (lease_lapsed)."""
    p = personas
    [todo] = push(p, 1, max_attempts=2)
    services.claim(actor=p.as_agent(), todo_id=todo.id, claimant="worker-7")
    client = signed_in(p.owner)
    page = client.get(f"/todos/{todo.id}").content.decode()
    assert "Lease until" in page and "in flight" in page
    assert f'action="/todos/{todo.id}/complete"' in page
    lapse(todo)
    page = client.get(f"/todos/{todo.id}").content.decode()
    assert "Lease lapsed" in page and "the next claim takes it over" in page
    assert "Lease until" not in page and "· lapsed" in page and "in flight" not in page
    assert f'action="/todos/{todo.id}/release"' in page
    for refused in ("complete", "fail"):
        assert f'action="/todos/{todo.id}/{refused}"' not in page
    client.post(f"/todos/{todo.id}/release", {"attempt": "1"})
    assert Todo.objects.get(pk=todo.pk).state == TodoState.PENDING


def test_a_complete_whose_result_is_refused_changes_nothing_and_says_why(
    personas: Personas,
) -> None:
    """It completed the todo and dropped the result the edge refused ({"answer": NaN})."""
    p = personas
    [todo] = push(p, 1)
    services.claim(actor=p.as_human(), todo_id=todo.id)
    client = signed_in(p.owner)
    page = client.post(
        f"/todos/{todo.id}/complete", {"result": '{"answer": NaN}', "attempt": "1"}, follow=True
    ).content.decode()
    assert "Not completed: result:" in page and "Nothing was changed" in page
    assert Todo.objects.get(pk=todo.pk).state == TodoState.CLAIMED
    done = client.post(
        f"/todos/{todo.id}/complete", {"result": '{"answer": 42}', "attempt": "1"}, follow=True
    )
    assert "Completed." in done.content.decode()
    assert Todo.objects.get(pk=todo.pk).result == {"answer": 42}


def _field(page: str, name: str) -> tuple[str, str]:
    """What a todo form's field holds and the error beside it, as the page shows them."""
    tag = re.search(rf'<(input|textarea) id="{name}"[^>]*>', page)
    assert tag is not None, name
    if tag.group(1) == "input":
        found = re.search(r'value="([^"]*)"', tag.group(0))
        value = found.group(1) if found else ""
    else:
        value = page[tag.end() : page.index("</textarea>", tag.end())]
    error = re.search(rf'<p class="error field-error" id="{name}-error">([^<]*)</p>', page)
    return htmllib.unescape(value), htmllib.unescape(error.group(1)) if error else ""


def test_a_refused_complete_or_fail_gives_back_what_was_typed(personas: Personas) -> None:
    """The message named the field, but the page came back with every field empty: a long
    summary or result typed by hand was lost. Refused by the form (a result that is not storable
    JSON) or by the service (a summary too long, an error too large), the text comes back in
    its field, the refusal beside it, once; nothing is changed."""
    p = personas
    [todo] = push(p, 1)
    services.claim(actor=p.as_human(), todo_id=todo.id)
    client = signed_in(p.owner)
    url = f"/todos/{todo.id}"
    long_summary = "s" * 10_001
    big_error = "e" * 300_000
    cases = [
        ("complete", {"summary": "kept <b>", "result": '{"a": 1e309}'}, "complete-result"),
        # JSON past the digit limit ("is not valid JSON" too) was kept as text, where the API
        # refuses it; text that is no JSON at all is kept as a string (below).
        ("complete", {"summary": "", "result": '{"n": ' + "1" * 4301 + "}"}, "complete-result"),
        ("complete", {"summary": long_summary, "result": "[1, 2]"}, "complete-summary"),
        ("fail", {"error": big_error}, "fail-error"),
    ]
    for action, typed, refused in cases:
        page = client.post(
            f"{url}/{action}", {**typed, "attempt": "1", "next": url}, follow=True
        ).content.decode()
        assert "Nothing was changed" in page, action
        for name, text in typed.items():
            value, error = _field(page, f"{action}-{name}")
            assert value == text, (action, name, len(value))
            assert bool(error) == (f"{action}-{name}" == refused), (action, name, error)
        assert re.search(rf'id="{refused}"[^>]*autofocus', page), refused  # where to fix it
        # Shown once: the page loaded again has empty forms.
        assert _field(client.get(url).content.decode(), refused) == ("", "")
    assert Todo.objects.get(pk=todo.pk).state == TodoState.CLAIMED
    assert not audit_rows().filter(kind__in=[LedgerKind.TODO_COMPLETE, LedgerKind.TODO_FAIL])
    client.post(f"{url}/complete", {"result": "all {done", "attempt": "1", "next": url})
    done = Todo.objects.get(pk=todo.pk)
    assert done.state == TodoState.DONE and done.result == "all {done"


def test_releasing_a_last_attempt_says_it_is_a_dead_letter_now(personas: Personas) -> None:
    """A release of the last attempt dead-letters it; the page said "back to pending"."""
    p = personas
    [last, spare] = push(p, 2, max_attempts=1)
    spare.max_attempts = 2
    Todo.objects.filter(pk=spare.pk).update(max_attempts=2)
    client = signed_in(p.owner)
    for todo in (last, spare):
        services.claim(actor=p.as_human(), todo_id=todo.id)
    page = client.post(f"/todos/{last.id}/release", {"attempt": "1"}, follow=True).content.decode()
    assert "it was its last attempt, so it is a dead letter now" in page
    assert Todo.objects.get(pk=last.pk).dead_letter
    page = client.post(f"/todos/{spare.id}/release", {"attempt": "1"}, follow=True).content.decode()
    assert "Released: back to pending." in page


def test_a_claim_on_a_paused_queue_is_not_offered_and_the_page_says_why(
    personas: Personas,
) -> None:
    from queues import pauses

    p = personas
    [todo] = push(p, 1)
    client = signed_in(p.owner)
    assert f'action="/todos/{todo.id}/claim"' in client.get(f"/todos/{todo.id}").content.decode()
    pauses.queue_pause(actor=p.as_human(p.admin), queue="inbox", reason="upgrade")
    page = client.get(f"/todos/{todo.id}").content.decode()
    assert f'action="/todos/{todo.id}/claim"' not in page
    assert "Claim is not offered: inbox is paused" in page
    assert f'action="/todos/{todo.id}/discard"' in page


def test_the_boards_card_of_a_lapsed_lease_says_lapsed(personas: Personas) -> None:
    p = personas
    [todo] = push(p, 1)
    services.claim(actor=p.as_agent(), todo_id=todo.id, claimant="worker-7")
    client = signed_in(p.owner)
    assert "lease until" in client.get("/?state=claimed").content.decode()
    assert "lease until" in client.get("/agents").content.decode()
    lapse(todo)
    board = client.get("/?state=claimed").content.decode()
    assert "lease lapsed at" in board and "lease until" not in board
    agents = client.get("/agents").content.decode()
    assert "lease lapsed at" in agents and "lease until" not in agents


def test_the_todo_page_has_one_level_one_heading_and_the_drawer_none(personas: Personas) -> None:
    p = personas
    [todo] = push(p, 1)
    client = signed_in(p.owner)
    page = client.get(f"/todos/{todo.id}").content.decode()
    assert page.count("<h1") == 1 and '<h1 id="todo-title">' in page
    drawer = client.get(
        f"/todos/{todo.id}", headers={"HX-Request": "true", "HX-Target": "drawer"}
    ).content.decode()
    assert "<h1" not in drawer and '<h2 id="todo-title">' in drawer


# An estimated instant in the viewer's zone: the time, with the day first when it falls on
# another day than the viewer's today (a run just before midnight: ci108's "≈ Sun 6 Dec 00:08").
ESTIMATE_AT = r"≈ (?:[A-Z][a-z]{2} \d{1,2} [A-Z][a-z]{2} )?\d\d:\d\d UTC"


def test_a_claim_the_budget_defers_says_when_in_the_viewers_zone(personas: Personas) -> None:
    # The console showed the machine's instant: "eligible at 2026-12-05T10:21:26.968595Z".
    p = personas
    first, second = push(p, 2)
    budget(p, max_in_flight=1)
    services.claim(actor=p.as_agent(), todo_id=first.id, lease_ttl_seconds=600)
    client = signed_in(p.owner)
    page = htmllib.unescape(client.post(f"/todos/{second.id}/claim", follow=True).content.decode())
    said = re.search(r"queue 'inbox' is deferred: in_flight_full; eligible at ([^<]*)", page)
    assert said is not None, page[:3000]
    assert re.fullmatch(ESTIMATE_AT, said.group(1).strip()), said.group(0)


def test_a_claim_refused_for_a_held_todo_says_its_lease_in_the_viewers_zone(
    personas: Personas,
) -> None:
    # "todo is claimed (attempt 1) by agent, its lease until 2026-12-05T22:41:07.512806Z".
    p = personas
    (todo,) = push(p, 1)
    services.claim(actor=p.as_agent(), todo_id=todo.id, lease_ttl_seconds=600)
    client = signed_in(p.owner)
    client.cookies["tz"] = "Asia/Kolkata"
    page = htmllib.unescape(client.post(f"/todos/{todo.id}/claim", follow=True).content.decode())
    said = re.search(r"todo is claimed \(attempt 1\) by agent, its lease until ([^<]*)", page)
    assert said is not None, page[:3000]
    todo.refresh_from_db()
    assert todo.lease_expires_at is not None
    local = todo.lease_expires_at.astimezone(ZoneInfo("Asia/Kolkata"))
    assert local.strftime("%H:%M") in said.group(1) and "IST" in said.group(1), said.group(0)
    assert not re.search(r"\d{4}-\d{2}-\d{2}T\d{2}:", said.group(0))
    assert "≈" not in said.group(0)  # a lease's end is a fact, not an estimate


def test_the_todo_pages_gate_table_marks_an_estimate_and_not_a_reset(personas: Personas) -> None:
    # "Held by budget until 10:21 UTC" for a lease's lapse, which may come sooner: the board
    # wrote "≈", the todo page did not.
    p = personas
    first, second = push(p, 2)
    budget(p, max_claims_per_window=1)
    services.claim(actor=p.as_agent(), todo_id=first.id, lease_ttl_seconds=600)
    held = re.compile(r"Held by <strong>budget</strong> until ([^<.]*)\.")
    page = htmllib.unescape(signed_in(p.owner).get(f"/todos/{second.id}").content.decode())
    window = held.search(page)
    assert window is not None and not window.group(1).startswith("≈"), page[:4000]
    budget(p, max_in_flight=1)  # now the cap holds it: until a lease lapses, an estimate
    page = htmllib.unescape(signed_in(p.owner).get(f"/todos/{second.id}").content.decode())
    lease = held.search(page)
    assert lease is not None and re.fullmatch(ESTIMATE_AT, lease.group(1)), page[:4000]


def test_an_attempt_the_reaper_ended_names_its_claimant_as_the_claimant(personas: Personas) -> None:
    # "expired · requeued by worker-7 via api" read as if the agent had ended it.
    p = personas
    (todo,) = push(p, 1)
    services.claim(actor=p.as_agent(), todo_id=todo.id, claimant="worker-7")
    lapse(todo)
    tasks.reap_expired()
    page = signed_in(p.owner).get(f"/todos/{todo.id}").content.decode()
    head = page.split('<p class="attempt-head">')[1].split("</p>")[0]
    assert "<strong>Attempt 1</strong> · expired" in head, head
    assert "claimed by <bdi>worker-7</bdi> via api" in head, head
