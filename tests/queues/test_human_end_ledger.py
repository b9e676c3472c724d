"""A human's ending of a claim is a decision the ledger records: the console's Complete, Fail and
Release and the operator API's and admin's release each append one chain-0 row naming whose claim
it ended, in the statement's transaction (the operator API's release: tests/api/test_operator_rest.py). An agent's ending of its own claim appends none; a
refused ending appends none; a human and the agent racing to end the same claim leave a row only
when the human's ending won."""

from __future__ import annotations

from typing import Any

import pytest

from admission.limits import verify as limits_verify
from queues import services
from queues.models import Todo, TodoState
from queues.services import Claimed
from switchboard.core.errors import Conflict, Forbidden
from switchboard.ledger import chain
from switchboard.ledger.models import LedgerEntry, LedgerKind
from tests.conftest import Personas, push, run_threads
from tests.limits.conftest import pool

HUMAN_ENDS = (LedgerKind.TODO_COMPLETE, LedgerKind.TODO_FAIL, LedgerKind.TODO_RELEASE)


def _claimed(p: Personas, **kw: Any) -> Todo:
    [todo] = push(p, 1, **kw)
    claimed = services.claim(actor=p.as_agent(), todo_id=todo.id, claimant="worker-7")
    assert isinstance(claimed, Claimed)
    return todo


def _rows(kind: str | None = None) -> list[LedgerEntry]:
    kinds = [kind] if kind else list(HUMAN_ENDS)
    return list(LedgerEntry.objects.filter(kind__in=kinds).order_by("seq"))


def test_an_operator_completing_an_agents_claim_is_ledgered(personas: Personas) -> None:
    p = personas
    todo = _claimed(p)
    lease = Todo.objects.get(pk=todo.pk).lease_expires_at
    done = services.complete(
        actor=p.as_human(via="console"), todo_id=todo.id, result={"ok": 1}, summary="by hand"
    )
    assert done.state == TodoState.DONE

    [row] = _rows()
    assert row.kind == LedgerKind.TODO_COMPLETE and row.chain == 0
    assert (row.actor_human_name, row.actor_endpoint_slug) == ("olive", "")
    assert (row.scope, row.queue) == ("endpoint:agent", "inbox")
    assert row.before == {
        "state": "claimed",
        "owner": "worker-7",
        "attempt": 1,
        "lease_expires_at": lease.isoformat().replace("+00:00", "Z") if lease else None,
    }
    assert row.after == {"state": "done", "count": 1, "todos": [str(todo.id)], "summary": "by hand"}
    assert chain.verify().ok


def test_an_operator_failing_a_claim_says_whether_it_will_retry(personas: Personas) -> None:
    p = personas
    retried, last = _claimed(p, max_attempts=3), _claimed(p, max_attempts=1)
    first = services.fail(actor=p.as_human(), todo_id=retried.id, error="stuck")
    second = services.fail(actor=p.as_human(), todo_id=last.id)
    assert not first.dead_letter and second.dead_letter

    rows = _rows(LedgerKind.TODO_FAIL)
    assert [r.after["todos"] for r in rows] == [[str(retried.id)], [str(last.id)]]  # type: ignore[index]
    assert [r.after["dead_letter"] for r in rows] == [False, True]  # type: ignore[index]
    assert rows[0].after["next_retry_at"] is not None  # type: ignore[index]
    assert rows[1].after["next_retry_at"] is None  # type: ignore[index]
    assert "summary" not in rows[0].after  # type: ignore[operator]
    assert chain.verify().ok


def test_an_agent_ending_its_own_claim_appends_nothing(personas: Personas) -> None:
    p = personas
    agent = p.as_agent()
    for end in (
        lambda t: services.complete(actor=agent, todo_id=t.id),
        lambda t: services.fail(actor=agent, todo_id=t.id, error="x"),
        lambda t: services.release(actor=agent, todo_id=t.id),
    ):
        end(_claimed(p))
    assert _rows() == []


def test_a_refused_ending_appends_nothing_and_changes_nothing(personas: Personas) -> None:
    p = personas
    [pending] = push(p, 1)
    with pytest.raises(Conflict):
        services.complete(actor=p.as_human(), todo_id=pending.id)
    with pytest.raises(Conflict):
        services.todo_release(actor=p.as_human(), todo_id=pending.id)
    theirs = _claimed(p)
    with pytest.raises(Forbidden):
        services.todo_release(actor=p.as_human(p.auditor), todo_id=theirs.id)
    assert _rows() == []
    assert Todo.objects.get(pk=pending.pk).state == TodoState.PENDING
    assert Todo.objects.get(pk=theirs.pk).state == TodoState.CLAIMED


def test_a_limited_claim_ended_by_an_operator_keeps_its_end_row_and_replays(
    personas: Personas,
) -> None:
    p = personas
    pool("gpu", slots=1)
    todo = _claimed(p, pool="gpu")
    services.todo_release(actor=p.as_human(), todo_id=todo.id)

    [row] = _rows()
    [end] = LedgerEntry.objects.filter(kind=LedgerKind.LIMITS_END)
    assert row.kind == LedgerKind.TODO_RELEASE and end.actor_human_name == "olive"
    assert chain.verify().ok
    assert limits_verify.limits_verify().ok
    # The slot is free again: the released todo is claimable at once.
    assert isinstance(services.claim(actor=p.as_agent(), todo_id=todo.id), Claimed)


def test_a_human_and_the_agent_racing_to_end_a_claim_leave_a_row_only_if_the_human_won(
    tx_personas: Personas,
) -> None:
    p = tx_personas
    agent, human = p.as_agent(), p.as_human()
    won_by: dict[str, int] = {"agent": 0, "human": 0}
    todos = [_claimed(p) for _ in range(12)]
    for todo in todos:

        def end(i: int, todo: Todo = todo) -> str | None:
            try:
                if i == 0:
                    services.complete(actor=agent, todo_id=todo.id)
                    return "agent"
                services.todo_release(actor=human, todo_id=todo.id)
                return "human"
            except Conflict:
                return None

        winners = [w for w in run_threads(2, end) if w is not None]
        assert len(winners) == 1, winners
        won_by[winners[0]] += 1
        rows = [r for r in _rows() if r.after["todos"] == [str(todo.id)]]  # type: ignore[index]
        assert len(rows) == (1 if winners[0] == "human" else 0)
        state = Todo.objects.get(pk=todo.pk).state
        assert state == (TodoState.PENDING if winners[0] == "human" else TodoState.DONE)
    assert len(_rows()) == won_by["human"]
    assert chain.verify().ok
