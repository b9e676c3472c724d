"""Admission under real concurrency: processes and threads racing real connections."""

from __future__ import annotations

import threading
import time
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection, connections
from django.utils import timezone

from admission import engine, windows
from admission.models import AdmissionPolicy
from queues import metrics, services, sql
from queues.models import Attempt, Todo, TodoState
from queues.services import Claimed, NothingClaimable
from switchboard.core import counters
from tests.admission.conftest import budget, window_total
from tests.admission.racer import race
from tests.conftest import (
    Personas,
    attempt_count,
    database_url,
    lapse,
    make_retry_due,
    push,
    run_threads,
    statements,
)

ROOT = Path(__file__).resolve().parents[2]


def far_start() -> str:
    return (timezone.now() + timedelta(hours=12)).astimezone(UTC).strftime("%H:00")


def used(policy: AdmissionPolicy) -> int:
    """The current first window's count: its shard rows summed."""
    return window_total(policy)


def test_fifty_racers_in_two_processes_commit_exactly_ten_of_fifty(
    tx_personas: Personas, tmp_path: Path
) -> None:
    p = tx_personas
    policy = budget(p, per="day", limit=10, start=far_start())
    push(p, 50)
    reports = race(p.agent.id, 25, tmp_path, database_url(), settings.REDIS_URL)
    assert [r["errors"] for r in reports] == [[], []]
    claimed = [t for r in reports for t in r["claimed"]]
    assert len(claimed) == 10 and len(set(claimed)) == 10
    assert sum(r["empty"] for r in reports) == 40
    assert set(r for rep in reports for r in rep["deferred"]) <= {"window_exhausted"}
    # Both processes raced: each one's claimers met the policy lock.
    assert all(r["claimed"] or r["deferred"] for r in reports)
    assert Todo.objects.filter(state=TodoState.CLAIMED).count() == 10
    assert attempt_count() == 10
    assert used(policy) == 10
    assert counters.value(metrics.CHARGED, {"queue": "inbox"}) == 10
    assert counters.value(metrics.CLAIMED, {"queue": "inbox"}) == 10


def test_twenty_threads_over_an_in_flight_cap_of_three_hold_exactly_three(
    tx_personas: Personas,
) -> None:
    p = tx_personas
    budget(p, max_in_flight=3)
    push(p, 20)
    results = run_threads(20, lambda i: services.claim_next(actor=p.as_agent()))
    assert sum(isinstance(r, Claimed) for r in results) == 3
    assert Todo.objects.filter(state=TodoState.CLAIMED).count() == 3


def test_charged_total_equals_claimed_total_for_the_queue(tx_personas: Personas) -> None:
    p = tx_personas
    policy = budget(p, per="day", limit=8, start=far_start())
    push(p, 6)
    push(p, 2, queue="outbox")
    got = run_threads(4, lambda i: services.claim_next(actor=p.as_agent(), queue="inbox"))
    held = [r.todo for r in got if isinstance(r, Claimed)]
    assert len(held) == 4
    services.fail(actor=p.as_agent(), todo_id=held[0].id, error="x")
    make_retry_due(held[0])
    services.release(actor=p.as_agent(), todo_id=held[1].id)
    lapse(held[2])
    while isinstance(services.claim_next(actor=p.as_agent(), queue="inbox"), Claimed):
        pass
    services.claim_next(actor=p.as_agent(), queue="outbox")
    charged = counters.value(metrics.CHARGED, {"queue": "inbox"})
    assert charged == counters.value(metrics.CLAIMED, {"queue": "inbox"}) == used(policy) == 8
    assert attempt_count(queue="inbox") == 8
    assert counters.value(metrics.REFUSALS, {"queue": "inbox", "reason": "window_exhausted"}) >= 1
    # A queue without a budget counts claims and charges nothing.
    assert counters.value(metrics.CLAIMED, {"queue": "outbox"}) == 1
    assert counters.value(metrics.CHARGED, {"queue": "outbox"}) == 0


@pytest.mark.parametrize("pause_after", ["lock_policy", "charge"])
def test_a_locked_path_claim_killed_after_the_policy_lock_charges_nothing(
    tx_personas: Personas, monkeypatch: pytest.MonkeyPatch, pause_after: str
) -> None:
    p = tx_personas
    policy = budget(p, per="day", limit=5, max_in_flight=5, start=far_start())
    (todo,) = push(p, 1)
    paused = threading.Event()
    proceed = threading.Event()
    pid: list[int] = []
    original = getattr(engine, pause_after)

    def hooked(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        if threading.current_thread().name == "doomed-claim":
            pid.append(connection.connection.info.backend_pid)
            paused.set()
            proceed.wait(timeout=30)
        return result

    monkeypatch.setattr(engine, pause_after, hooked)
    # The locked path (a refusal seen lately sends the endpoint's claims there).
    sql.mark_gated(p.agent.id)
    outcome: list[Any] = []

    def doomed() -> None:
        try:
            outcome.append(services.claim_next(actor=p.as_agent()))
        except Exception as exc:
            outcome.append(exc)
        finally:
            try:
                connections.close_all()
            except Exception:
                pass

    thread = threading.Thread(target=doomed, name="doomed-claim")
    thread.start()
    assert paused.wait(timeout=30)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid[0]])
        assert cursor.fetchone() == (True,)
    proceed.set()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert isinstance(outcome[0], Exception), outcome
    todo.refresh_from_db()
    assert todo.state == TodoState.PENDING and todo.attempt == 0
    assert not Attempt.objects.exists()
    assert used(policy) == 0
    assert counters.value(metrics.CHARGED, {"queue": "inbox"}) == 0
    assert counters.value(metrics.CLAIMED, {"queue": "inbox"}) == 0
    # The policy lock died with the connection: the next claim goes through.
    monkeypatch.setattr(engine, pause_after, original)
    again = services.claim_next(actor=p.as_agent())
    assert isinstance(again, Claimed) and again.todo.id == todo.id
    assert used(policy) == 1


@pytest.mark.parametrize("blocked_on", ["shards", "window"])
def test_a_one_statement_claim_killed_mid_statement_charges_nothing_and_leaves_the_todo_pending(
    tx_personas: Personas, blocked_on: str
) -> None:
    """The fast path's claim is one statement: killed while it waits for the budget's shard
    locks, or for its window counter row after it holds a shard and has written the todo, it
    leaves nothing."""
    p = tx_personas
    policy = budget(p, per="day", limit=5, max_in_flight=5, start=far_start())
    _first, todo = push(p, 2)
    assert isinstance(services.claim_next(actor=p.as_agent()), Claimed)  # the window row exists
    assert used(policy) == 1
    holder = psycopg.connect(database_url(), autocommit=False)
    if blocked_on == "shards":  # as a policy write holds them
        holder.execute("SELECT admission_shards_lock(%s)", [policy.id])
    else:  # every shard's counter row of the window, whichever shard the claim holds
        start = windows.window_start(policy, timezone.now())
        holder.execute(
            "INSERT INTO admission_admissionwindow (policy_id, window_key, window_start, shard, "
            "used, refused, updated_at) SELECT %s, '', %s, s, 0, 0, now() "
            "FROM generate_series(0, 7) s ON CONFLICT DO NOTHING",
            [policy.id, start],
        )
        holder.commit()
        holder.execute(
            "SELECT 1 FROM admission_admissionwindow WHERE policy_id = %s FOR UPDATE", [policy.id]
        )
    outcome: list[Any] = []

    def doomed() -> None:
        try:
            outcome.append(services.claim_next(actor=p.as_agent()))
        except Exception as exc:
            outcome.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=doomed)
    thread.start()
    pid = None
    with connection.cursor() as cursor:
        for _ in range(300):
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE %s AND pid <> pg_backend_pid()",
                # The statement's opening: pg_stat_activity keeps only its first 1024 bytes.
                ["%WITH cand AS (%"],
            )
            row = cursor.fetchone()
            if row:
                pid = row[0]
                break
            time.sleep(0.05)
        assert pid is not None, "the claim never waited on the held lock"
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    thread.join(timeout=30)
    holder.rollback()
    holder.close()
    assert isinstance(outcome[0], Exception), outcome
    todo.refresh_from_db()
    assert todo.state == TodoState.PENDING and todo.attempt == 0
    assert attempt_count() == 1
    assert used(policy) == 1
    assert counters.value(metrics.CLAIMED, {"queue": "inbox"}) == 1
    again = services.claim_next(actor=p.as_agent())
    assert isinstance(again, Claimed) and again.todo.id == todo.id
    assert used(policy) == 2


def test_a_claim_on_an_unbudgeted_queue_is_one_statement_with_the_indexed_probe(
    tx_personas: Personas,
) -> None:
    p = tx_personas
    budget(p, "outbox", max_in_flight=1)  # the policy table is not empty
    push(p, 1, queue="inbox")
    services.claim_next(actor=p.as_agent(), queue="outbox")  # window bounds cached for a second
    with statements() as seen:
        result = services.claim_next(actor=p.as_agent(), queue="inbox")
    assert isinstance(result, Claimed)
    assert len(seen) == 1, seen
    (statement,) = seen
    assert "admission_admissionpolicy" in statement
    assert "FOR UPDATE OF t SKIP LOCKED" in statement


def test_the_policy_probe_uses_the_unique_identity_index(tx_personas: Personas) -> None:
    p = tx_personas
    # Enough budgets that the planner weighs the table as production would.
    AdmissionPolicy.objects.bulk_create(
        AdmissionPolicy(
            endpoint=p.foreign,
            queue=f"q{i}",
            max_in_flight=1,
            created_by=p.other_owner,
            updated_by=p.other_owner,
        )
        for i in range(2000)
    )
    budget(p, "outbox", max_in_flight=1)
    push(p, 1, queue="inbox")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE admission_admissionpolicy")
        cursor.execute(
            "EXPLAIN " + sql.claim_next_sql(),
            {
                "endpoint": p.agent.id,
                "queues": ["inbox"],
                "excluded": [],
                "passed": [],
                "claimant": "x",
                "via": "api",
                "ttl": 60,
                "fence_hash": None,
                **sql.grant_params(None, "x"),
            },
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "admission_policy_identity" in plan, plan


def test_an_admitted_budgeted_claim_is_one_statement(tx_personas: Personas) -> None:
    p = tx_personas
    policy = budget(p, per="day", limit=5, max_in_flight=3, start=far_start())
    push(p, 2)
    # The first claim caches the window bounds and learns that this endpoint's work is gated
    # (its bare statement met a budgeted candidate), so the next goes to the full one at once.
    assert isinstance(services.claim_next(actor=p.as_agent()), Claimed)
    with statements() as sqls:
        result = services.claim_next(actor=p.as_agent())
    assert isinstance(result, Claimed)
    assert len(sqls) == 1, sqls
    assert "SKIP LOCKED" in sqls[0] and "admission_admit" in sqls[0]
    assert used(policy) == 2
    assert result.admission is not None
    assert result.admission["used"] == 2 and result.admission["remaining"] == 3
    assert result.admission["in_flight"] == 2 and result.admission["max_in_flight"] == 3


def test_a_refused_budgeted_claim_takes_the_locked_path(tx_personas: Personas) -> None:
    p = tx_personas
    budget(p, per="day", limit=1, start=far_start())
    push(p, 2)
    assert isinstance(services.claim_next(actor=p.as_agent()), Claimed)
    with statements() as sqls:
        result = services.claim_next(actor=p.as_agent())
    assert isinstance(result, NothingClaimable)
    assert result.deferred and result.deferred[0]["reason"] == "window_exhausted"
    assert "admission_admit" in sqls[0]
    assert any("admission_count_refusal" in s for s in sqls)  # the refusal's count
    assert not any(s.startswith("INSERT INTO admission_ledgerentry") for s in sqls)


def test_nothing_claimable_on_an_unbudgeted_queue_is_one_statement(
    tx_personas: Personas,
) -> None:
    p = tx_personas
    services.claim_next(actor=p.as_agent(), queue="outbox")  # window bounds cached for a second
    with statements() as seen:
        assert isinstance(services.claim_next(actor=p.as_agent(), queue="inbox"), NothingClaimable)
    assert len(seen) == 1


def test_a_window_redefined_a_moment_ago_is_charged_by_its_new_definition(
    tx_personas: Personas,
) -> None:
    """The fast path's window bounds are cached for a second; the statement sees the policy's
    new window definition, answers "stale" and the locked path charges the new window."""
    p = tx_personas
    policy = budget(p, per="day", limit=5, start=far_start())
    push(p, 2)
    assert isinstance(services.claim_next(actor=p.as_agent()), Claimed)  # bounds cached
    policy = budget(p, per="day", limit=5, tz="Asia/Kolkata", start=far_start())
    with statements() as sqls:
        assert isinstance(services.claim_next(actor=p.as_agent()), Claimed)
    assert "admission_admit" in sqls[0] and len(sqls) > 1  # stale, then the locked path
    assert used(policy) == 1  # the redefined window counts anew
    assert not sql.recently_gated(p.agent.id)  # stale bounds alone keep the fast path
