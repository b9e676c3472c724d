"""An operator's ending names the attempt their page showed (the console sends it): raced against
the agent releasing that attempt and claiming the todo again, on real connections, the operator's
complete lands on the attempt it named or not at all, never on the newer claim."""

from __future__ import annotations

import threading
import time
from typing import Any

from django.conf import settings

from admission.limits import services as limit_services
from queues import pauses, services
from queues.models import Todo, TodoState
from switchboard.core.errors import DomainError
from switchboard.ledger import chain as ledger
from switchboard.ledger.models import LedgerKind
from tests.conftest import FIXTURE, Personas, audit_rows, push, run_threads

PAIRS = 24
RETRY_PAIRS = 16


def test_an_operators_complete_never_lands_on_the_claim_made_after_the_one_it_named(
    tx_personas: Personas,
) -> None:
    p = tx_personas
    todos = push(p, PAIRS, max_attempts=5)
    for todo in todos:
        services.claim(actor=p.as_agent(), todo_id=todo.id)  # attempt 1, the one "on the page"
    operator, agent = p.as_human(p.owner), p.as_agent()

    def race(i: int) -> str:
        todo = todos[i // 2]
        try:
            if i % 2 == 0:  # the operator presses Complete on the page that showed attempt 1
                services.complete(actor=operator, todo_id=todo.id, attempt=1, summary="saw 1")
                return "completed"
            services.release(actor=agent, todo_id=todo.id, attempt=1)
            services.claim(actor=agent, todo_id=todo.id)  # attempt 2
            return "reclaimed"
        except DomainError as exc:
            return f"refused: {exc.as_dict().get('reason') or exc.message}"

    outcomes = run_threads(2 * PAIRS, race)
    by_todo: dict[Any, tuple[str, str]] = {
        todos[i].id: (outcomes[2 * i], outcomes[2 * i + 1]) for i in range(PAIRS)
    }
    completed = 0
    for todo in Todo.objects.filter(id__in=list(by_todo)):
        operator_said, agent_said = by_todo[todo.id]
        if operator_said == "completed":
            completed += 1
            # It ended attempt 1; the agent's release then found it done and claimed nothing.
            assert (todo.state, todo.attempt) == (TodoState.DONE, 1), (todo.id, agent_said)
            assert agent_said.startswith("refused")
        else:
            # The agent released first: the operator's press was refused, and the newer claim
            # (attempt 2) is the agent's, untouched.
            assert operator_said.startswith("refused"), operator_said
            assert agent_said == "reclaimed"
            assert (todo.state, todo.attempt) == (TodoState.CLAIMED, 2)
    # Every completion the ledger records is the operator's of attempt 1.
    rows = list(audit_rows().filter(kind=LedgerKind.TODO_COMPLETE))
    assert len(rows) == completed
    assert all(row.before is not None and row.before["attempt"] == 1 for row in rows)


def test_operators_claims_racing_agents_cycles_and_pauses_all_land_and_the_ledger_verifies(
    tx_personas: Personas,
) -> None:
    """An operator's claim through a named limit takes a grant chain's lock (its grant row),
    then chain 0's (its ``todo.claim`` row), as a human's ending does; agents' cycles take grant
    chains only, and pauses chain 0 only. Raced on real connections: every one lands (a lock
    cycle would be PostgreSQL's deadlock error, surfaced here), each operator claim has its one
    row, and the chains verify."""
    p = tx_personas
    limit_services.limit_set(actor=FIXTURE, kind="pool", name="gpu", slots=100)
    mine = push(p, 8, pool="gpu")
    theirs = push(p, 8, pool="gpu")
    push(p, 1, queue="outbox")  # a queue the pauses take turns on
    operator, agent = p.as_human(p.owner), p.as_agent()

    def race(i: int) -> None:
        if i < 8:
            services.claim(actor=operator, todo_id=mine[i].id)
        elif i < 16:
            claimed = services.claim(actor=agent, todo_id=theirs[i - 8].id)
            services.complete(actor=agent, todo_id=claimed.todo.id)
        else:
            for _ in range(3):
                pauses.queue_pause(actor=p.as_human(p.admin), queue="outbox", reason="r")
                pauses.queue_resume(actor=p.as_human(p.admin), queue="outbox")

    run_threads(18, race)
    claims = audit_rows().filter(kind=LedgerKind.TODO_CLAIM)
    assert sorted(row.after["todos"][0] for row in claims if row.after) == sorted(
        str(t.id) for t in mine
    )
    assert Todo.objects.filter(id__in=[t.id for t in theirs], state=TodoState.DONE).count() == 8
    assert ledger.verify().ok


def test_workers_whose_claims_ended_before_a_retry_never_end_the_claims_after_it(
    tx_personas: Personas,
) -> None:
    """Round 8: a retry set the attempt back to 0, so the claim after it was attempt 1 again and
    a worker still holding attempt 1's number ended it. Raced on real connections: per todo, a
    stale worker keeps completing with its ended attempt while an operator retries and a fresh
    worker claims; none of the stale completions lands, every fresh claim stands."""
    p = tx_personas
    # A stale worker holds its connection until after its partner's claim: both sides of every
    # pair hold one at once, within the pool (a partner left waiting for one would wait out
    # DATABASE_POOL_TIMEOUT while the stale workers spin).
    pool = settings.DATABASES["default"]["OPTIONS"].get("pool")  # none: a connection each
    assert pool is None or pool["max_size"] >= 2 * RETRY_PAIRS
    todos = push(p, RETRY_PAIRS, max_attempts=1)
    agent, operator = p.as_agent(), p.as_human(p.owner)
    for todo in todos:
        services.claim(actor=agent, todo_id=todo.id, claimant="stale")  # attempt 1
        services.fail(actor=agent, todo_id=todo.id, attempt=1)  # its last: a dead letter
    fresh = [threading.Event() for _ in todos]
    # Set when the operator's side ends, claimed or not: a stale worker whose partner raised
    # stops, so the partner's error is what the test reports (it would otherwise wait forever).
    ended = [threading.Event() for _ in todos]

    def race(i: int) -> list[str]:
        todo, claimed = todos[i // 2], fresh[i // 2]
        if i % 2 == 1:  # the operator retries, a fresh worker claims
            try:
                services.todo_retry(actor=operator, todo_id=todo.id)
                services.claim(actor=agent, todo_id=todo.id, claimant="fresh")
                claimed.set()
            finally:
                ended[i // 2].set()
            return ["claimed"]
        said: list[str] = []
        tries_after = 0
        while tries_after < 5:  # until well after the fresh claim
            if ended[i // 2].is_set() and not claimed.is_set():
                return said
            tries_after += claimed.is_set()
            try:
                services.complete(actor=agent, todo_id=todo.id, attempt=1, result={"by": "stale"})
                said.append("completed")
            except DomainError as exc:
                said.append(str(exc.as_dict().get("reason") or exc.code))
            time.sleep(0.002)
        return said

    outcomes = run_threads(2 * RETRY_PAIRS, race)
    stale = [said for i, said in enumerate(outcomes) if i % 2 == 0]
    assert not [said for said in stale if "completed" in said], stale
    assert all(said[-1] == "superseded" for said in stale), stale
    for todo in Todo.objects.filter(id__in=[t.id for t in todos]):
        assert (todo.state, todo.owner, todo.attempt) == (TodoState.CLAIMED, "fresh", 2)
    for todo in todos:
        services.complete(actor=agent, todo_id=todo.id, attempt=2, result={"by": "fresh"})
    assert set(Todo.objects.values_list("state", flat=True)) == {TodoState.DONE}
