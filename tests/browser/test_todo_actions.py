"""The operator actions on a todo, with JavaScript on, wherever the todo is shown: in the board's
drawer, and on its own page (/todos/<id> opened directly, which has no drawer)."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Locator, Page, expect

from queues.models import Todo, TodoState
from switchboard.ledger.models import LedgerEntry
from tests.browser.conftest import Session
from tests.browser.helpers import findings
from tests.conftest import Personas, push


def _open(page: Page, where: str, todo: Todo) -> Locator:
    """The todo, shown ``where``: the element its actions answer in."""
    if where == "page":
        page.goto(f"/todos/{todo.id}")
        return page.locator("main")
    page.goto("/?endpoint=agent&queue=inbox")
    expect(page.locator("[data-live-url]")).to_have_attribute("data-live", "open")
    page.locator(f'#sections a[href^="/todos/{todo.id}"]').click()
    expect(page.locator("#drawer .todo-head")).to_be_visible()
    expect(page.locator(".htmx-settling")).to_have_count(0)
    return page.locator("#drawer")


@pytest.mark.parametrize("where", ["page", "drawer"])
def test_every_action_on_a_todo_is_carried_out_where_it_is_shown(
    session: Session, tx_personas: Personas, where: str
) -> None:
    # On the todo page every button did nothing: each form targeted the board's #drawer, which
    # that page has not, so htmx refused to send it (htmx:targetError).
    p = tx_personas
    (todo,) = push(p, 1, max_attempts=2)
    page = session.page(p.owner)
    shown = _open(page, where, todo)
    state = shown.locator(".todo-head .state-label")
    expect(state).to_have_text("pending")
    url = page.url

    def act(button: str, then: str, said: str) -> None:
        shown.get_by_role("button", name=button).click()
        expect(state).to_have_text(then)
        expect(shown.locator(".messages")).to_contain_text(said)
        # htmx wires the drawer's new forms once the swap settles (one sent before posts as
        # with JavaScript off, and the todo's page comes back instead of the drawer).
        expect(page.locator(".htmx-settling")).to_have_count(0)

    act("Claim as operator:olive", "claimed", "Claimed")
    act("Release", "pending", "Released")
    act("Claim as operator:olive", "claimed", "Claimed")
    shown.get_by_label("Error", exact=True).fill("worker gave up")
    act("Fail", "dead letter", "Failed: dead-lettered.")
    act("Retry", "pending", "Retried")
    act("Claim as operator:olive", "claimed", "Claimed")
    shown.get_by_label("Summary", exact=True).fill("done by hand")
    act("Complete", "done", "Completed.")
    # A said message is a list inside a status region (role="status" on the list itself took
    # its items' list away: axe "listitem", serious).
    assert findings(page) == []
    expect(shown.locator(".attempts")).to_contain_text("done by hand")
    assert urlsplit(page.url).path == urlsplit(url).path  # stayed where it was shown

    (other,) = push(p, 1)
    shown = _open(page, where, other)
    state = shown.locator(".todo-head .state-label")
    act("Discard", "discarded", "Discarded")
    assert dict(Todo.objects.values_list("id", "state")) == {
        todo.id: TodoState.DONE,
        other.id: TodoState.DISCARDED,
    }
    assert LedgerEntry.objects.filter(kind="todo.discard").count() == 1
    # The operator's own endings are decisions the ledger keeps (two releases of a claim,
    # one failure, one completion).
    assert sorted(
        LedgerEntry.objects.filter(
            kind__in=["todo.complete", "todo.fail", "todo.release"]
        ).values_list("kind", flat=True)
    ) == ["todo.complete", "todo.fail", "todo.release"]
