"""claim_next's lean statement (issue 12, the ten-queue budget point): for an endpoint whose
claims met gated work lately, the bare statement's candidate decided by a budget inside one
lean statement; it claims exactly what the full statement claims, charged the same, and leaves
a takeover, a grant to end and a todo naming a pool, tag or rate limit to the full statement."""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction
from django.db.models import Sum

from admission import services as admission_services
from admission.limits.models import Pool
from admission.models import AdmissionPolicy, AdmissionWindow
from queues import services, sql
from queues.models import AttemptOutcome, Todo, TodoState
from queues.services import Claimed, NothingClaimable
from tests.conftest import Personas, attempt_count, attempts_of, lapse, push, statements
from tests.queues.test_bare_claim import _claimed_rows

_KW: dict[str, Any] = {
    "queues": ["inbox", "outbox"],
    "claimant": "w0",
    "via": "api",
    "ttl": 120,
    "fence_hash": "f" * 64,
}


def _lean(p: Personas) -> sql.Candidate | sql.NoCandidate | None:
    with sql.hot_cursor() as cursor:
        return sql.claim_next_lean(cursor, endpoint_id=p.agent.id, **_KW)


def _full(p: Personas) -> sql.Candidate | sql.NoCandidate:
    with sql.hot_cursor() as cursor:
        return sql.claim_next_candidate(
            cursor,
            endpoint_id=p.agent.id,
            excluded=[],
            passed=[],
            fast=True,
            ledger=sql.grant_params(None, "w0"),
            **_KW,
        )


def _budget(p: Personas, *, limit: int = 100, cap: int | None = 5) -> AdmissionPolicy:
    return admission_services.policy_set(
        actor=p.as_human(p.owner),
        endpoint=p.agent,
        queue="inbox",
        max_in_flight=cap,
        max_claims_per_window=limit,
        window={"period": "day", "tz": "UTC", "start": "00:00"},
        posture="enforce",
    )


def _charged(policy: AdmissionPolicy) -> int:
    return AdmissionWindow.objects.filter(policy=policy).aggregate(n=Sum("used"))["n"] or 0


def test_the_lean_statement_claims_and_charges_what_the_full_statement_does(
    settings: Any, personas: Personas
) -> None:
    settings.POLICY_WRITE_RATE_LIMIT = (0, 0)
    policy = _budget(personas)
    push(personas, 1, queue="outbox")  # older, unbudgeted: both statements take it first
    push(personas, 2, queue="inbox")
    for queue in ("outbox", "inbox"):
        with transaction.atomic():
            sid = transaction.savepoint()
            lean = _lean(personas)
            assert isinstance(lean, sql.Candidate) and lean.todo is not None
            lean_rows, lean_charged = _claimed_rows(lean.todo_id), _charged(policy)
            transaction.savepoint_rollback(sid)
            full = _full(personas)
            assert isinstance(full, sql.Candidate) and full.todo is not None
            full_rows, full_charged = _claimed_rows(full.todo_id), _charged(policy)
        assert lean.todo_id == full.todo_id and lean.queue == full.queue == queue
        assert lean_rows == full_rows and lean_charged == full_charged
        assert lean_rows[0]["state"] == TodoState.CLAIMED and lean_rows[0]["grant_hash"] is None
        assert lean_rows[1] == []  # the claim in progress is the todo's columns
        assert (lean_rows[0]["owner"], lean_rows[0]["lease_token_hash"]) == ("w0", "f" * 64)
        # The verdicts, per gate in lock order, as the full statement gives them.
        assert len(lean.verdicts) == len(full.verdicts)
        for mine, theirs in zip(lean.verdicts, full.verdicts, strict=True):
            assert (mine is None) == (theirs is None)
            if mine is not None and theirs is not None:
                assert mine["ok"] and theirs["ok"]
                assert {k: v for k, v in mine.items() if k != "shard"} == {
                    k: v for k, v in theirs.items() if k != "shard"
                }
        stored = Todo.objects.get(pk=lean.todo_id)
        assert stored.state == TodoState.CLAIMED
    assert _charged(policy) == 1  # the inbox claim; the outbox one is ungated


def test_claim_next_on_a_budgeted_queue_runs_the_lean_statement_once_per_claim(
    settings: Any, personas: Personas
) -> None:
    settings.POLICY_WRITE_RATE_LIMIT = (0, 0)
    policy = _budget(personas, limit=5, cap=3)
    push(personas, 3)
    assert isinstance(services.claim_next(actor=personas.as_agent()), Claimed)  # bare, then lean
    with statements() as seen:
        result = services.claim_next(actor=personas.as_agent())
    assert isinstance(result, Claimed)
    assert len(seen) == 1
    assert seen[0] == sql._lean_claim_sql(sql.gates.gates(), False, False)
    assert _charged(policy) == 2
    assert result.admission is not None
    assert result.admission["used"] == 2 and result.admission["remaining"] == 3
    assert result.admission["in_flight"] == 2 and result.admission["max_in_flight"] == 3


def test_a_verdict_that_refuses_leaves_the_candidate_to_the_locked_path(
    settings: Any, personas: Personas
) -> None:
    settings.POLICY_WRITE_RATE_LIMIT = (0, 0)
    policy = _budget(personas, limit=1, cap=None)
    push(personas, 2)
    assert isinstance(services.claim_next(actor=personas.as_agent()), Claimed)
    left = _lean(personas)
    assert isinstance(left, sql.Candidate) and left.todo is None
    assert any(v is not None and v["ok"] is False for v in left.verdicts)
    assert _charged(policy) == 1
    result = services.claim_next(actor=personas.as_agent())
    assert isinstance(result, NothingClaimable)
    assert result.deferred and result.deferred[0]["reason"] == "window_exhausted"


def test_the_lean_statement_answers_no_candidate_when_nothing_is_claimable(
    settings: Any, personas: Personas
) -> None:
    settings.POLICY_WRITE_RATE_LIMIT = (0, 0)
    _budget(personas)
    assert _lean(personas) == sql.NoCandidate(skipped=False)


def test_the_lean_statement_leaves_a_takeover_to_the_full_statement(
    settings: Any, personas: Personas
) -> None:
    settings.POLICY_WRITE_RATE_LIMIT = (0, 0)
    policy = _budget(personas, limit=10, cap=1)
    (todo,) = push(personas, 1)
    assert isinstance(services.claim_next(actor=personas.as_agent(), claimant="slow"), Claimed)
    lapse(todo)
    assert _lean(personas) is None  # not its candidate: no verdict, no charge, no claim
    assert not sql.recently_named(personas.agent.id)  # a takeover is no named work
    assert _charged(policy) == 1
    assert Todo.objects.get(pk=todo.id).owner == "slow"
    assert attempt_count(pk=todo.pk) == 1
    result = services.claim_next(actor=personas.as_agent(), claimant="fast")
    assert isinstance(result, Claimed) and result.todo.id == todo.id and result.attempt == 2
    attempts = attempts_of(todo)
    assert [a.outcome for a in attempts] == [AttemptOutcome.SUPERSEDED, None]
    assert _charged(policy) == 2  # every committed claim is charged, a takeover too


def test_the_lean_statement_leaves_a_todo_naming_a_pool_to_the_full_statement(
    settings: Any, personas: Personas
) -> None:
    settings.POLICY_WRITE_RATE_LIMIT = (0, 0)
    policy = _budget(personas)
    Pool.objects.create(name="gpu", slots=2, posture="enforce")
    (todo,) = push(personas, 1, pool="gpu")
    assert _lean(personas) is None
    assert Todo.objects.get(pk=todo.id).state == TodoState.PENDING
    assert _charged(policy) == 0
    assert sql.recently_named(personas.agent.id)  # its next claims skip the lean statement
    result = services.claim_next(actor=personas.as_agent())
    assert isinstance(result, Claimed) and result.todo.id == todo.id
    assert result.grant is not None  # the pool's grant row: only the full statement writes it
    assert _charged(policy) == 1


def test_the_lean_statement_leaves_a_todo_naming_tags_or_a_rate_limit_to_the_full_one(
    settings: Any, personas: Personas
) -> None:
    from admission.limits.models import TagLimit

    settings.POLICY_WRITE_RATE_LIMIT = (0, 0)
    _budget(personas)
    TagLimit.objects.create(tag="big", limit=2, posture="enforce")
    (tagged,) = push(personas, 1, tags=["big"])
    assert _lean(personas) is None
    assert Todo.objects.get(pk=tagged.id).state == TodoState.PENDING
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE queues_todo SET tags = '{}', rate_limit = 'r' WHERE id = %s", [tagged.id]
        )
    assert _lean(personas) is None
    assert Todo.objects.get(pk=tagged.id).state == TodoState.PENDING


def test_named_work_costs_one_statement_per_claim_after_the_first(
    settings: Any, personas: Personas
) -> None:
    """An endpoint whose todos name a pool: the bare statement leaves the first to the gated
    path, the lean statement leaves it to the full one; from then on each claim is the full
    statement alone (neither the bare nor the lean statement is paid for again)."""
    settings.POLICY_WRITE_RATE_LIMIT = (0, 0)
    _budget(personas)
    Pool.objects.create(name="gpu", slots=5, posture="enforce")
    push(personas, 3, pool="gpu")
    assert isinstance(services.claim_next(actor=personas.as_agent()), Claimed)
    assert sql.recently_limited(personas.agent.id) and sql.recently_named(personas.agent.id)
    with statements() as seen:
        result = services.claim_next(actor=personas.as_agent())
    assert isinstance(result, Claimed) and result.grant is not None
    assert len(seen) == 1 and "limits_pool_check" in seen[0], seen
