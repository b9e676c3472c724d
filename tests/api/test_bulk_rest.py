"""The operator API's failure actions: discard one todo, and bulk retry or discard a selection,
previewed first and confirmed by the preview's token; bad input names its field."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from queues import selectors, services
from queues.models import Attempt, Todo, TodoState
from switchboard.ledger.models import LedgerEntry, LedgerKind
from tests.api.conftest import Api, human_token
from tests.conftest import Personas, push, run_threads


def dead_letters(p: Personas, n: int, queue: str = "inbox") -> list[Any]:
    todos = push(p, n, queue=queue, max_attempts=1)
    agent = p.as_agent()
    for t in todos:
        services.claim(actor=agent, todo_id=t.id)
        services.fail(actor=agent, todo_id=t.id, error={"type": "Boom"})
    return todos


@pytest.fixture
def auditor_api(personas: Personas) -> Api:
    return Api(Client(), human_token(personas.auditor))


def test_a_bulk_retry_is_previewed_then_confirmed(personas: Personas, owner_api: Api) -> None:
    dead = dead_letters(personas, 3)
    push(personas, 2)
    body = {"queue": "inbox", "state": "dead_letter"}

    preview = owner_api.post("/api/v1/todos/bulk/retry/preview", body)
    assert preview.status_code == 200, preview.content
    shown = preview.json()
    assert shown["count"] == 3 and shown["action"] == "retry"
    assert {t["id"] for t in shown["sample"]} == {str(t.id) for t in dead}
    assert {t["dead_letter"] for t in shown["sample"]} == {True}
    assert Todo.objects.filter(state=TodoState.FAILED).count() == 3  # a preview changes nothing

    done = owner_api.post("/api/v1/todos/bulk/retry", {**body, "selection": shown["selection"]})
    assert done.status_code == 200, done.content
    assert sorted(done.json()["todos"]) == sorted(str(t.id) for t in dead)
    assert Todo.objects.filter(state=TodoState.PENDING).count() == 5
    assert LedgerEntry.objects.get(kind=LedgerKind.TODO_RETRY).actor_human_name == "olive"


def test_a_stale_selection_is_409_with_the_fresh_count_and_nothing_changes(
    personas: Personas, owner_api: Api
) -> None:
    dead = dead_letters(personas, 2)
    token = owner_api.post("/api/v1/todos/bulk/discard/preview", {"state": "failed"}).json()[
        "selection"
    ]
    owner_api.post(f"/api/v1/todos/{dead[0].id}/retry")

    refused = owner_api.post("/api/v1/todos/bulk/discard", {"state": "failed", "selection": token})

    assert refused.status_code == 409
    assert refused.json()["code"] == "conflict"
    assert refused.json()["reason"] == "stale_selection"
    assert refused.json()["count"] == 1
    assert refused.json()["selection"] != token
    assert not Todo.objects.filter(state=TodoState.DISCARDED).exists()


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/v1/todos/bulk/retry/preview", {"queue": "no spaces"}, "queue"),
        ("/api/v1/todos/bulk/retry/preview", {"state": "lost"}, "state"),
        ("/api/v1/todos/bulk/retry/preview", {"q": "x" * 201}, "q"),
        ("/api/v1/todos/bulk/retry/preview", {"colour": "red"}, "colour"),
        ("/api/v1/todos/bulk/retry", {"state": "failed"}, "selection"),
        ("/api/v1/todos/bulk/retry", {"selection": ""}, "selection"),
        ("/api/v1/todos/bulk/explode/preview", {}, "action"),
    ],
)
def test_bad_bulk_input_names_the_field_and_changes_nothing(
    personas: Personas, owner_api: Api, path: str, body: dict[str, Any], field: str
) -> None:
    dead_letters(personas, 1)
    response = owner_api.post(path, body)
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "invalid_argument"
    assert response.json()["field"] == field, response.json()
    assert Todo.objects.get().state == TodoState.FAILED


def test_an_unknown_endpoint_in_a_selection_is_404_naming_the_field(
    personas: Personas, owner_api: Api
) -> None:
    # A mistyped slug selected nothing: "count": 0, as if there were nothing to retry.
    dead_letters(personas, 1)
    for path, body in [
        ("/api/v1/todos/bulk/retry/preview", {"endpoint": "nope-zz"}),
        ("/api/v1/todos/bulk/retry", {"endpoint": "nope-zz", "selection": "x"}),
        ("/api/v1/todos/bulk/discard/preview", {"endpoint": "foreign"}),  # not the owner's
    ]:
        response = owner_api.post(path, body)
        assert response.status_code == 404, (path, response.content)
        assert (response.json()["code"], response.json()["field"]) == ("not_found", "endpoint")
    assert (
        owner_api.post("/api/v1/todos/bulk/retry/preview", {"endpoint": "agent"}).json()["count"]
        == 1
    )
    assert Todo.objects.get().state == TodoState.FAILED


def test_auditors_preview_and_confirm_nothing(personas: Personas, auditor_api: Api) -> None:
    dead_letters(personas, 1)
    assert auditor_api.post("/api/v1/todos/bulk/retry/preview", {}).status_code == 403
    assert auditor_api.post("/api/v1/todos/bulk/retry", {"selection": "x"}).status_code == 403


def test_another_owners_selection_is_empty(personas: Personas, other_api: Api) -> None:
    dead_letters(personas, 2)
    assert other_api.post("/api/v1/todos/bulk/retry/preview", {}).json()["count"] == 0


def test_discarding_one_todo_keeps_its_history(personas: Personas, owner_api: Api) -> None:
    [dead] = dead_letters(personas, 1)
    response = owner_api.post(f"/api/v1/todos/{dead.id}/discard")
    assert response.status_code == 200, response.content
    assert response.json()["todo"]["state"] == "discarded"
    assert response.json()["todo"]["dead_letter"] is False
    assert Attempt.objects.get(todo=dead).error == {"type": "Boom"}
    again = owner_api.post(f"/api/v1/todos/{dead.id}/discard")
    assert again.status_code == 409
    listed = owner_api.get("/api/v1/todos", state="discarded").json()["todos"]
    assert [t["id"] for t in listed] == [str(dead.id)]


def test_the_same_confirmation_again_answers_the_first_result_and_changes_nothing(
    personas: Personas, owner_api: Api, other_api: Api
) -> None:
    # A double submit, or a retry whose first answer was lost: the selection is already applied.
    # It read as a stale selection, "nothing was changed", though the first request had changed
    # them all.
    dead = dead_letters(personas, 3)
    body = {"state": "failed"}
    token = owner_api.post("/api/v1/todos/bulk/discard/preview", body).json()["selection"]
    first = owner_api.post("/api/v1/todos/bulk/discard", {**body, "selection": token})
    assert first.status_code == 200 and first.json()["applied_at"] is None
    rows = LedgerEntry.objects.filter(kind=LedgerKind.TODO_DISCARD).count()
    again = owner_api.post("/api/v1/todos/bulk/discard", {**body, "selection": token})
    assert again.status_code == 200, again.content
    assert again.json()["applied_at"] is not None
    assert sorted(again.json()["todos"]) == sorted(str(t.id) for t in dead)
    assert again.json()["count"] == 3
    assert LedgerEntry.objects.filter(kind=LedgerKind.TODO_DISCARD).count() == rows
    # Another human's confirmation of the same token is theirs: stale, as it always was.
    theirs = other_api.post("/api/v1/todos/bulk/discard", {**body, "selection": token})
    assert theirs.status_code == 409 and theirs.json()["reason"] == "stale_selection"
    # A retry of the discarded todos is another action: its own token, its own answer.
    retried = owner_api.post("/api/v1/todos/bulk/retry", {**body, "selection": token})
    assert retried.status_code == 409


def test_two_submits_of_one_confirmation_at_once_change_it_once(tx_personas: Personas) -> None:
    p = tx_personas
    dead_letters(p, 4)
    actor = p.as_human()
    selection = selectors.Selection(state="failed")
    token = selectors.bulk_preview(actor=actor, action="discard", selection=selection).token

    def submit(i: int) -> Any:
        return services.todos_bulk(actor=actor, action="discard", selection=selection, token=token)

    results = run_threads(2, submit)
    assert sorted(r.applied_at is None for r in results) == [False, True]
    assert {r.count for r in results} == {4}
    assert LedgerEntry.objects.filter(kind=LedgerKind.TODO_DISCARD).count() == 1
    assert Todo.objects.filter(state=TodoState.DISCARDED).count() == 4
