"""The seed's unlocked pre-read: claim_next leaves an exhausted queue out before locking, so a
claimer never waits on the policy lock of a queue it cannot be admitted to."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
from django.db import connection

from queues import services
from queues.services import Claimed, NothingClaimable
from tests.admission.conftest import budget
from tests.conftest import Personas, push


def test_an_exhausted_queue_is_left_out_without_waiting_on_its_lock(
    tx_personas: Personas,
) -> None:
    p = tx_personas
    policy = budget(p, "inbox", per="day", limit=1)
    push(p, 2, queue="inbox")  # older: without the pre-read, inbox's todo is the candidate
    (other,) = push(p, 1, queue="outbox")
    first = services.claim_next(actor=p.as_agent(), queue="inbox")
    assert isinstance(first, Claimed)  # spends inbox's one claim of the day

    # Another transaction holds inbox's policy lock for as long as the test wants.
    holder = psycopg.connect(**connection.get_connection_params())
    holder.execute("SELECT 1 FROM admission_admissionpolicy WHERE id = %s FOR UPDATE", [policy.id])
    outcome: dict[str, Any] = {}

    def claim() -> None:
        try:
            outcome["result"] = services.claim_next(actor=p.as_agent())
        finally:
            from django.db import connections

            connections.close_all()

    worker = threading.Thread(target=claim)
    worker.start()
    worker.join(timeout=20)
    finished = not worker.is_alive()
    holder.rollback()
    holder.close()
    worker.join(timeout=20)
    assert finished, "claim_next waited on the lock of a queue whose window is spent"
    result = outcome["result"]
    assert isinstance(result, Claimed) and result.todo.id == other.id


def test_the_pre_read_reports_the_exhausted_queue_as_deferred(tx_personas: Personas) -> None:
    p = tx_personas
    budget(p, "inbox", per="day", limit=1)
    push(p, 2, queue="inbox")
    assert isinstance(services.claim_next(actor=p.as_agent()), Claimed)
    empty = services.claim_next(actor=p.as_agent())
    assert isinstance(empty, NothingClaimable)
    (entry,) = empty.deferred
    assert entry["queue"] == "inbox" and entry["reason"] == "window_exhausted"
    assert entry["pending"] == 1 and entry["exact"] is True


def test_a_spent_queue_with_nothing_waiting_is_not_reported(tx_personas: Personas) -> None:
    p = tx_personas
    budget(p, "inbox", per="day", limit=1)
    (todo,) = push(p, 1, queue="inbox")
    claimed = services.claim_next(actor=p.as_agent())
    assert isinstance(claimed, Claimed)
    services.complete(actor=p.as_agent(), todo_id=todo.id)
    empty = services.claim_next(actor=p.as_agent())
    assert isinstance(empty, NothingClaimable) and empty.deferred == []
