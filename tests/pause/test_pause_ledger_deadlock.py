"""A pause against an operator's retry and release, on real connections.

Lock order (``queues.pauses``): the pause table, then ledger chain 0. A pause locks the table
(ACCESS EXCLUSIVE) and then appends its ledger row; an operator's retry or release appends its
row to chain 0, and its ring's gate reads the pause table. The ring runs after the retry's
commit, so the retry never waits for the pause holding chain 0. Rung inside the retry's
transaction it did, and the two deadlocked: PostgreSQL aborted one (the retry answered 503, or
the pause a conflict), and the claims queued behind the pause's lock waited out their timeout.
"""

from __future__ import annotations

import threading
import time

import psycopg
from django.db import OperationalError

from queues import services, wakes
from queues.models import Todo, TodoState
from queues.services import Claimed
from switchboard.core.errors import Conflict, DomainError
from switchboard.ledger.chain import APPEND_LOCK_KEY
from switchboard.ledger.models import LedgerEntry, LedgerKind
from tests.conftest import Personas, database_url, patient, push, run_threads
from tests.pause.helpers import Listener, in_thread, pause, resume, wait_until, waiting_locks

RACE_SECONDS = 5.0


def _dead_letter(p: Personas, queue: str = "inbox") -> Todo:
    """A todo of the agent's whose one attempt failed: an operator may retry it."""
    (todo,) = push(p, 1, queue=queue, max_attempts=1)
    claimed = services.claim(actor=p.as_agent(), todo_id=todo.id)
    services.fail(actor=p.as_agent(), todo_id=todo.id, error="boom", attempt=claimed.attempt)
    todo.refresh_from_db()
    assert todo.state == TodoState.FAILED and todo.dead_letter
    return todo


def _chain_zero_waiters() -> int:
    """Sessions waiting for ledger chain 0's append lock (an advisory lock on one bigint key:
    its high and low 32 bits are pg_locks' classid and objid)."""
    with psycopg.connect(database_url(), autocommit=True) as watcher:
        row = watcher.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND classid = %s AND objid = %s AND objsubid = 1",
            [APPEND_LOCK_KEY >> 32, APPEND_LOCK_KEY & 0xFFFFFFFF],
        ).fetchone()
    assert row is not None
    return int(row[0])


def _rings(listener: Listener) -> list[tuple[str, str | None]]:
    bodies = [wakes.parse(raw) for raw in listener.drain_raw()]
    return [(body["r"], body["t"]) for body in bodies if body is not None]


def test_a_retry_waiting_for_a_pause_holds_no_ledger_lock(
    tx_personas: Personas, listener: Listener
) -> None:
    """A pause part-way (its table lock taken, its ledger row next) and an operator's retry on
    the paused queue: the retry commits and its ring waits for the pause holding nothing, so
    chain 0, which the pause appends to next, is free. Then the ring goes out as it always did."""
    p = tx_personas
    todo = _dead_letter(p)
    listener.drain()
    retry = patient(lambda: services.todo_retry(actor=p.as_human(p.owner), todo_id=todo.id))
    pauser = psycopg.connect(database_url(), autocommit=False)
    thread = None
    try:
        pauser.execute("LOCK TABLE queues_queuepause IN ACCESS EXCLUSIVE MODE")
        thread, retried = in_thread(retry)
        wait_until(lambda: waiting_locks() == ["AccessShareLock"], "the retry's ring to wait")
        row = pauser.execute("SELECT pg_try_advisory_xact_lock(%s)", [APPEND_LOCK_KEY]).fetchone()
        assert row == (True,), "the retry waits for the pause table holding ledger chain 0"
        row = pauser.execute("SELECT state FROM queues_todo WHERE id = %s", [todo.id]).fetchone()
        assert row == (TodoState.PENDING,), "the retry has committed"
    finally:
        pauser.rollback()  # the pause gives up: the queue is not paused
        pauser.close()
        if thread is not None:
            thread.join(timeout=60)
    assert retried.result().state == TodoState.PENDING
    assert _rings(listener) == [("requeued", str(todo.id))]


def test_a_retry_and_a_pause_queued_on_the_ledger_both_go_through(
    tx_personas: Personas, listener: Listener
) -> None:
    """The retry takes chain 0 first, the pause (its table lock held) queues behind it: the
    retry commits, the pause commits, and the retry's ring, after its commit, sees the pause."""
    p = tx_personas
    todo = _dead_letter(p)
    listener.drain()
    retry = patient(lambda: services.todo_retry(actor=p.as_human(p.owner), todo_id=todo.id))
    holder = psycopg.connect(database_url(), autocommit=False)
    threads = []
    try:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", [APPEND_LOCK_KEY])
        retry_thread, retried = in_thread(retry)
        threads.append(retry_thread)
        wait_until(lambda: _chain_zero_waiters() == 1, "the retry to queue for chain 0")
        pause_thread, paused = in_thread(lambda: pause(p.pauser, "inbox", reason="race"))
        threads.append(pause_thread)
        wait_until(lambda: _chain_zero_waiters() == 2, "the pause to queue behind the retry")
    finally:
        holder.commit()
        holder.close()
        for thread in threads:
            thread.join(timeout=60)
    assert retried.result().state == TodoState.PENDING
    assert paused.result().changed
    kinds = list(
        LedgerEntry.objects.filter(chain=0).order_by("-seq").values_list("kind", flat=True)
    )
    assert kinds[:2] == [LedgerKind.QUEUE_PAUSE, LedgerKind.TODO_RETRY]
    assert _rings(listener) == []  # nothing rings for a paused queue


def test_pauses_and_resumes_racing_releases_and_retries_never_deadlock(
    tx_personas: Personas,
) -> None:
    """The outside tester's race, small: one operator pauses and resumes two queues in a loop,
    one releases claims an agent takes, one retries dead letters. Every answer is the domain's
    (a todo that moved, a paused queue), never a database error or a pause's collision."""
    p = tx_personas
    letters = [_dead_letter(p, queue) for queue in ("inbox", "outbox") for _ in range(4)]
    push(p, 20, endpoint=p.agent2)
    owner = p.as_human(p.owner)
    stop = threading.Event()
    failures: list[BaseException] = []
    counts = {"pauses": 0, "releases": 0, "retries": 0}
    lock = threading.Lock()

    def failed(exc: BaseException) -> None:
        with lock:
            failures.append(exc)

    def count(what: str) -> None:
        with lock:
            counts[what] += 1

    def pauser() -> None:
        while not stop.is_set():
            for queue in ("inbox", "outbox"):
                try:
                    pause(p.pauser, queue, reason="race")
                    count("pauses")
                except Conflict as exc:  # could not pause: a collision or a timeout
                    failed(exc)
            for queue in ("inbox", "outbox"):
                resume(p.pauser, queue)

    def releaser() -> None:
        agent = p.as_agent(p.agent2)
        while not stop.is_set():
            got = services.claim_next(actor=agent, queue="inbox")
            if not isinstance(got, Claimed):
                time.sleep(0.001)
                continue
            try:
                services.todo_release(actor=owner, todo_id=got.todo.id)
                count("releases")
            except OperationalError as exc:
                failed(exc)

    def retrier() -> None:
        agent = p.as_agent()
        while not stop.is_set():
            for todo in letters:
                try:
                    services.todo_retry(actor=owner, todo_id=todo.id)
                    count("retries")
                except OperationalError as exc:
                    failed(exc)
                except DomainError:
                    pass  # not failed now: its claim below did not go through
                try:  # fail it again, for the next retry (refused while paused)
                    claimed = services.claim(actor=agent, todo_id=todo.id)
                    services.fail(actor=agent, todo_id=todo.id, attempt=claimed.attempt)
                except DomainError:
                    pass

    def body(i: int) -> None:
        if i == 0:
            time.sleep(RACE_SECONDS)
            stop.set()
        else:
            (pauser, releaser, retrier)[i - 1]()

    run_threads(4, body)
    assert failures == []
    assert min(counts.values()) > 0, counts
