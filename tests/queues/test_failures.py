"""Failures an operator can act on: every attempt keeps its error, discard is a terminal state
written through a service and the ledger, and a bulk retry or discard changes exactly the
selection its confirmation showed, or nothing."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from queues import selectors, services
from queues.models import Attempt, Todo, TodoState
from queues.selectors import Selection
from queues.services import NothingClaimable
from switchboard.core.errors import Conflict, Forbidden, InvalidArgument, NotFound
from switchboard.ledger import chain
from switchboard.ledger.models import LedgerEntry, LedgerKind
from tests.conftest import Personas, make_retry_due, push


def fail_once(p: Personas, todo: Any, error: Any) -> Todo:
    agent = p.as_agent(todo.endpoint)
    services.claim(actor=agent, todo_id=todo.id, claimant="worker")
    return services.fail(actor=agent, todo_id=todo.id, error=error)


def dead_letters(p: Personas, n: int, queue: str = "inbox", **kw: Any) -> list[Todo]:
    todos = push(p, n, queue=queue, max_attempts=1, **kw)
    for t in todos:
        fail_once(p, t, {"type": "Boom", "n": str(t.id)})
    return todos


def test_every_attempt_keeps_its_own_error(personas: Personas) -> None:
    p = personas
    [todo] = push(p, 1, max_attempts=3)
    fail_once(p, todo, {"type": "TimeoutError", "traceback": "line 1\nline 2"})
    make_retry_due(todo)
    fail_once(p, todo, "connection reset")
    make_retry_due(todo)
    agent = p.as_agent()
    services.claim(actor=agent, todo_id=todo.id)
    services.complete(actor=agent, todo_id=todo.id, result={"ok": True})

    errors = list(Attempt.objects.filter(todo=todo).order_by("number").values_list("error"))
    assert errors == [
        ({"type": "TimeoutError", "traceback": "line 1\nline 2"},),
        ("connection reset",),
        (None,),
    ]


def test_discard_is_terminal_and_lands_in_the_ledger(personas: Personas) -> None:
    p = personas
    [pending] = push(p, 1)
    [dead] = dead_letters(p, 1)

    for todo in (pending, dead):
        gone = services.todo_discard(actor=p.as_human(), todo_id=todo.id)
        assert gone.state == TodoState.DISCARDED and gone.finished_at is not None

    rows = list(LedgerEntry.objects.filter(kind=LedgerKind.TODO_DISCARD).order_by("seq"))
    assert [(r.after or {})["todos"] for r in rows] == [[str(pending.id)], [str(dead.id)]]
    assert [r.before for r in rows] == [{"states": {"pending": 1}}, {"states": {"failed": 1}}]
    assert {r.actor_human_name for r in rows} == {"olive"}
    assert {(r.scope, r.queue) for r in rows} == {("endpoint:agent", "inbox")}
    assert chain.verify().ok

    # Nothing takes a discarded todo back: not a claim, not a retry, not a second discard.
    assert isinstance(services.claim_next(actor=p.as_agent(), queue="inbox"), NothingClaimable)
    with pytest.raises(Conflict):
        services.claim(actor=p.as_agent(), todo_id=pending.id)
    with pytest.raises(Conflict, match="only a failed todo can be retried"):
        services.todo_retry(actor=p.as_human(), todo_id=dead.id)
    with pytest.raises(Conflict, match="only a pending or failed todo can be discarded"):
        services.todo_discard(actor=p.as_human(), todo_id=dead.id)


def test_discard_frees_the_idempotency_key(personas: Personas) -> None:
    p = personas
    [todo] = push(p, 1, idempotency_key="invoice-7")
    services.todo_discard(actor=p.as_human(), todo_id=todo.id)
    again = services.todo_create(
        actor=p.as_agent(), endpoint=p.agent, queue="inbox", title="x", idempotency_key="invoice-7"
    )
    assert again.created


def test_a_claimed_todo_is_not_discarded_and_a_moved_one_is_refused(personas: Personas) -> None:
    p = personas
    [todo] = push(p, 1)
    services.claim(actor=p.as_agent(), todo_id=todo.id)
    with pytest.raises(Conflict, match="todo is claimed"):
        services.todo_discard(actor=p.as_human(), todo_id=todo.id)
    services.release(actor=p.as_agent(), todo_id=todo.id)
    # The operator decided on the claimed todo they saw; it is pending now: nothing changes.
    with pytest.raises(Conflict, match="not claimed as you saw it"):
        services.todo_discard(actor=p.as_human(), todo_id=todo.id, seen_state="claimed")
    assert Todo.objects.get(pk=todo.pk).state == TodoState.PENDING


def test_the_database_refuses_a_state_nobody_named(personas: Personas) -> None:
    [todo] = push(personas, 1)
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE queues_todo SET state = 'binned' WHERE id = %s", [todo.pk])


def test_auditors_and_strangers_discard_nothing(personas: Personas) -> None:
    p = personas
    [todo] = push(p, 1)
    # An auditor reads every todo, so the service answers 403 (as the API does), not 404.
    with pytest.raises(Forbidden):
        services.todo_discard(actor=p.as_human(p.auditor), todo_id=todo.id)
    with pytest.raises(NotFound):
        services.todo_discard(actor=p.as_human(p.other_owner), todo_id=todo.id)
    preview = selectors.bulk_preview(
        actor=p.as_human(p.other_owner), action="discard", selection=Selection()
    )
    assert preview.count == 0
    with pytest.raises(Forbidden):
        services.todos_bulk(
            actor=p.as_human(p.auditor), action="discard", selection=Selection(), token="x"
        )
    assert Todo.objects.get(pk=todo.pk).state == TodoState.PENDING


def test_a_bulk_retry_changes_exactly_what_its_preview_showed(personas: Personas) -> None:
    p = personas
    dead = dead_letters(p, 3)
    dead_letters(p, 1, queue="outbox")
    push(p, 2)  # pending: not a retry's business
    owner = p.as_human()
    selection = Selection(queue="inbox", state="dead_letter")

    preview = selectors.bulk_preview(actor=owner, action="retry", selection=selection)
    assert preview.count == 3
    assert {t.id for t in preview.sample} == {t.id for t in dead}
    done = services.todos_bulk(
        actor=owner, action="retry", selection=selection, token=preview.token
    )

    assert sorted(done.todo_ids) == sorted(t.id for t in dead)
    for todo in Todo.objects.filter(pk__in=done.todo_ids):
        # A fresh round of one attempt after the one spent; the number goes on.
        assert (todo.state, todo.next_retry_at) == (TodoState.PENDING, None)
        assert (todo.attempt, todo.max_attempts, todo.retried_after) == (1, 2, 1)
    [row] = LedgerEntry.objects.filter(kind=LedgerKind.TODO_RETRY)
    assert (row.scope, row.queue, (row.after or {})["count"]) == ("endpoint:agent", "inbox", 3)
    assert Todo.objects.filter(queue="outbox", state=TodoState.FAILED).count() == 1


def test_a_bulk_discard_writes_one_ledger_row_per_queue_identity(personas: Personas) -> None:
    p = personas
    push(p, 2)
    push(p, 1, endpoint=p.agent2)
    dead_letters(p, 1, queue="outbox")
    owner = p.as_human()
    preview = selectors.bulk_preview(actor=owner, action="discard", selection=Selection())
    assert preview.count == 4
    services.todos_bulk(actor=owner, action="discard", selection=Selection(), token=preview.token)

    rows = LedgerEntry.objects.filter(kind=LedgerKind.TODO_DISCARD)
    assert sorted((r.scope, r.queue, (r.after or {})["count"]) for r in rows) == [
        ("endpoint:agent", "inbox", 2),
        ("endpoint:agent", "outbox", 1),
        (f"endpoint:{p.agent2.slug}", "inbox", 1),
    ]
    assert Todo.objects.exclude(state=TodoState.DISCARDED).count() == 0


def test_a_selection_that_moved_since_its_preview_changes_nothing(personas: Personas) -> None:
    p = personas
    dead = dead_letters(p, 3)
    owner = p.as_human()
    selection = Selection(state="failed")
    preview = selectors.bulk_preview(actor=owner, action="retry", selection=selection)
    services.todo_retry(actor=owner, todo_id=dead[0].id)  # someone else retried one meanwhile

    with pytest.raises(Conflict) as refused:
        services.todos_bulk(actor=owner, action="retry", selection=selection, token=preview.token)

    assert refused.value.details["reason"] == "stale_selection"
    assert refused.value.details["count"] == 2
    assert Todo.objects.filter(state=TodoState.FAILED).count() == 2
    assert not LedgerEntry.objects.filter(kind=LedgerKind.TODO_RETRY, after__count=2).exists()
    # The fresh token confirms the selection as it is now.
    done = services.todos_bulk(
        actor=owner, action="retry", selection=selection, token=refused.value.details["selection"]
    )
    assert done.count == 2


def test_a_bulk_action_names_its_wrong_field(personas: Personas) -> None:
    owner = personas.as_human()
    for selection, field in [
        (Selection(queue="no spaces"), "queue"),
        (Selection(state="lost"), "state"),
        (Selection(q="x" * 201), "q"),
    ]:
        with pytest.raises(InvalidArgument) as refused:
            selectors.bulk_preview(actor=owner, action="retry", selection=selection)
        assert refused.value.field == field
    with pytest.raises(InvalidArgument) as refused:
        selectors.bulk_preview(actor=owner, action="explode", selection=Selection())
    assert refused.value.field == "action"
    with pytest.raises(InvalidArgument) as refused:
        services.todos_bulk(actor=owner, action="retry", selection=Selection(), token="")
    assert refused.value.field == "selection"


def test_a_search_narrows_a_bulk_selection(personas: Personas) -> None:
    p = personas
    hit = services.todo_create(
        actor=p.as_agent(), endpoint=p.agent, queue="inbox", title="x", payload={"n": "INV-42"}
    ).todo
    push(p, 3)
    preview = selectors.bulk_preview(
        actor=p.as_human(), action="discard", selection=Selection(q="INV-42")
    )
    assert [t.id for t in preview.sample] == [hit.id]


def test_a_retry_never_makes_a_second_live_holder_of_an_idempotency_key(
    personas: Personas,
) -> None:
    """A dead letter frees its key, so the agent may push the work again under it; retrying the
    dead letter then would make two live todos of one key (the live-key index refused it with an
    IntegrityError: a 500). It is refused naming the holder, and a bulk retry leaves it out."""
    p = personas
    [dead] = dead_letters(p, 1, idempotency_key="k-1")
    again = services.todo_create(
        actor=p.as_agent(), endpoint=p.agent, queue="inbox", title="again", idempotency_key="k-1"
    )
    assert again.created
    with pytest.raises(Conflict) as refused:
        services.todo_retry(actor=p.as_human(), todo_id=dead.id)
    assert refused.value.details["reason"] == "idempotency_key_taken"
    assert refused.value.details["holder"] == str(again.todo.id)
    assert Todo.objects.get(pk=dead.pk).state == TodoState.FAILED
    preview = selectors.bulk_preview(
        actor=p.as_human(), action="retry", selection=Selection(state="dead_letter")
    )
    assert (preview.count, preview.left_out) == (0, 1)
    assert not LedgerEntry.objects.filter(kind=LedgerKind.TODO_RETRY).exists()


def test_of_two_dead_letters_of_one_key_only_the_newer_comes_back(personas: Personas) -> None:
    p = personas
    [older] = dead_letters(p, 1, idempotency_key="k-2")
    [newer] = dead_letters(p, 1, idempotency_key="k-2")
    [keyless] = dead_letters(p, 1)
    owner = p.as_human()
    selection = Selection(state="dead_letter")
    preview = selectors.bulk_preview(actor=owner, action="retry", selection=selection)
    assert preview.count == 2
    done = services.todos_bulk(
        actor=owner, action="retry", selection=selection, token=preview.token
    )
    assert sorted(done.todo_ids) == sorted([newer.id, keyless.id])
    with pytest.raises(Conflict) as refused:
        services.todo_retry(actor=owner, todo_id=older.id)
    assert refused.value.details["holder"] == str(newer.id)


def test_a_todo_of_a_revoked_endpoint_is_not_retried_into_a_queue_nobody_drains(
    personas: Personas,
) -> None:
    """A revoke dead-letters the endpoint's live todos; its token is refused from then on, so a
    retry would leave a pending todo no claim could ever take."""
    p = personas
    [todo] = push(p, 1)
    services.endpoint_revoke(actor=p.as_human(), endpoint=p.agent)
    assert Todo.objects.get(pk=todo.pk).state == TodoState.FAILED
    with pytest.raises(Conflict) as refused:
        services.todo_retry(actor=p.as_human(), todo_id=todo.id)
    assert refused.value.details["reason"] == "endpoint_revoked"
    assert "revoked" in refused.value.message
    assert Todo.objects.get(pk=todo.pk).state == TodoState.FAILED
    preview = selectors.bulk_preview(actor=p.as_human(), action="retry", selection=Selection())
    assert (preview.count, preview.left_out) == (0, 1)
    discard = selectors.bulk_preview(actor=p.as_human(), action="discard", selection=Selection())
    assert (discard.count, discard.left_out) == (1, 0)
    # Discarding it is still the operator's to do.
    assert services.todo_discard(actor=p.as_human(), todo_id=todo.id).state == "discarded"


def test_nobody_pushes_work_to_a_revoked_endpoint(personas: Personas) -> None:
    """Its token is refused from the revoke on: work pushed there waits for a claim that never
    comes. A superuser, who may act on any endpoint, is refused too."""
    p = personas
    services.endpoint_revoke(actor=p.as_human(), endpoint=p.agent)
    for human in (p.owner, p.admin):
        with pytest.raises(Conflict, match="the endpoint is revoked"):
            services.todo_create(
                actor=p.as_human(human), endpoint=p.agent, queue="inbox", title="x"
            )
    assert not Todo.objects.exists()
