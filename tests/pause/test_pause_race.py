"""A pause against claims racing on real connections.

The claim statement reads the pause table (ACCESS SHARE until its transaction ends); the pause
takes ACCESS EXCLUSIVE before it inserts. So a pause commits after every claim that could have
missed it, claims that arrive meanwhile wait and then see it, and ``paused_at`` (the clock once
the lock was granted) is later than every committed attempt's ``claimed_at``.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import transaction

from queues import pauses, services
from queues.access import HumanActor
from queues.models import QueuePause, Todo, TodoState
from queues.services import Claimed, NothingClaimable
from switchboard.core.errors import Conflict
from tests.conftest import Personas, attempts_of, audit_rows, every_attempt, run_threads
from tests.pause.helpers import in_thread, pause, wait_until, waiting_locks

CLAIMERS = 8
BACKLOG = 600
CLAIMS_BEFORE_PAUSE = 40
CALLS_AFTER_PAUSE = 25


def _backlog(p: Personas, n: int) -> None:
    Todo.objects.bulk_create(
        Todo(endpoint=p.agent, queue="inbox", title=f"todo {i}") for i in range(n)
    )


def test_no_claim_is_handed_out_after_a_pause_taken_mid_stream_returns(
    tx_personas: Personas,
) -> None:
    p = tx_personas
    _backlog(p, BACKLOG)
    lock = threading.Lock()
    claimed_before: list[Any] = []
    claimed_after: list[Any] = []
    empty_after = [0]
    enough_claims = threading.Event()
    pause_returned = threading.Event()
    paused: list[pauses.PauseResult] = []

    def claimer() -> None:
        agent = p.as_agent()
        calls_after = 0
        while calls_after < CALLS_AFTER_PAUSE:
            after = pause_returned.is_set()  # read before the call starts
            got = services.claim_next(actor=agent, queue="inbox")
            if after:
                calls_after += 1
            if isinstance(got, Claimed):
                with lock:
                    (claimed_after if after else claimed_before).append(got.todo.id)
                    if len(claimed_before) >= CLAIMS_BEFORE_PAUSE:
                        enough_claims.set()
                # In-flight work finishes whether or not the pause has landed.
                services.complete(actor=agent, todo_id=got.todo.id)
            elif after:
                with lock:
                    empty_after[0] += 1

    def pauser() -> None:
        assert enough_claims.wait(timeout=120), "the claimers never got going"
        paused.append(pause(p.pauser, "inbox", reason="race"))
        pause_returned.set()

    run_threads(CLAIMERS + 1, lambda i: pauser() if i == CLAIMERS else claimer())

    [result] = paused
    row = QueuePause.objects.get(queue="inbox")
    assert row.paused_at == result.pause.at
    assert claimed_after == []
    assert empty_after[0] == CLAIMERS * CALLS_AFTER_PAUSE
    attempts = every_attempt(queue="inbox")
    assert len(attempts) == len(claimed_before) >= CLAIMS_BEFORE_PAUSE
    late = [a for a in attempts if a.claimed_at >= row.paused_at]
    assert late == [], f"{len(late)} attempts were claimed at or after paused_at"
    # The claimers stopped for the pause, not for want of work.
    assert Todo.objects.filter(queue="inbox", state=TodoState.PENDING).count() > 0
    assert Todo.objects.filter(queue="inbox", state=TodoState.DONE).count() == len(attempts)


def test_the_pause_waits_for_an_open_claim_and_claims_arriving_meanwhile_see_it(
    tx_personas: Personas,
) -> None:
    """The order, step by step: claim A is open; the pause queues behind it; claim C queues
    behind the pause; A commits; the pause commits; C finds nothing."""
    p = tx_personas
    _backlog(p, 3)
    Todo.objects.bulk_create(
        Todo(endpoint=p.agent2, queue="inbox", title=f"other {i}") for i in range(3)
    )
    a_claimed = threading.Event()
    release_a = threading.Event()

    def claim_a_and_hold() -> Claimed | NothingClaimable:
        with transaction.atomic():
            got = services.claim_next(actor=p.as_agent(), queue="inbox")
            a_claimed.set()
            release_a.wait(timeout=60)
            return got

    thread_a, claim_a = in_thread(claim_a_and_hold)
    try:
        assert a_claimed.wait(timeout=30)
        thread_p, paused = in_thread(lambda: pause(p.pauser, "inbox", reason="ordered"))
        wait_until(lambda: waiting_locks() == ["AccessExclusiveLock"], "the pause to queue")
        thread_c, claim_c = in_thread(
            lambda: services.claim_next(actor=p.as_agent(p.agent2), queue="inbox")
        )
        wait_until(
            lambda: waiting_locks() == ["AccessExclusiveLock", "AccessShareLock"],
            "claim C to queue behind the pause",
        )
        assert not paused.done() and not claim_c.done()
    finally:
        release_a.set()
    for t in (thread_a, thread_p, thread_c):
        t.join(timeout=60)

    a = claim_a.result()
    assert isinstance(a, Claimed)
    c = claim_c.result()
    assert isinstance(c, NothingClaimable)
    assert [(d["queue"], d["reason"], d["pending"]) for d in c.deferred] == [
        ("inbox", "queue_paused", 3)
    ]
    result = paused.result()
    (attempt,) = attempts_of(a.todo)
    assert attempt.claimed_at < result.pause.at
    assert Todo.objects.filter(endpoint=p.agent2, state=TodoState.PENDING).count() == 3


def test_a_pause_that_cannot_get_the_table_in_time_is_a_conflict_and_writes_nothing(
    tx_personas: Personas, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tx_personas
    _backlog(p, 2)
    monkeypatch.setattr(pauses, "LOCK_TIMEOUT", "200ms")
    a_claimed = threading.Event()
    release_a = threading.Event()

    def claim_and_hold() -> Claimed | NothingClaimable:
        with transaction.atomic():
            got = services.claim_next(actor=p.as_agent(), queue="inbox")
            a_claimed.set()
            release_a.wait(timeout=60)
            return got

    thread_a, claim_a = in_thread(claim_and_hold)
    try:
        assert a_claimed.wait(timeout=30)
        with pytest.raises(Conflict) as refused:
            pauses.queue_pause(actor=HumanActor(p.pauser), queue="inbox", reason="too soon")
    finally:
        release_a.set()
    thread_a.join(timeout=60)

    assert "claims are holding the queue table" in refused.value.message
    assert isinstance(claim_a.result(), Claimed)
    assert not QueuePause.objects.exists()
    assert not audit_rows().exists()
    # Once the claim has committed, the pause goes through.
    assert pause(p.pauser, "inbox").changed is True


def test_concurrent_pauses_of_one_queue_write_one_row_and_one_ledger_entry(
    tx_personas: Personas,
) -> None:
    p = tx_personas
    users = [p.pauser, p.admin, p.pauser, p.admin]

    results = run_threads(len(users), lambda i: pause(users[i], "inbox", reason=f"pauser {i}"))

    assert sorted(r.changed for r in results) == [False, False, False, True]
    [winner] = [r for r in results if r.changed]
    assert all(r.pause == winner.pause for r in results)
    assert QueuePause.objects.count() == 1
    assert audit_rows().filter(queue="inbox").count() == 1
