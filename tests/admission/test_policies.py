"""Policy writes: who may, what is valid, and the ledger row in the same transaction."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from admission import services
from admission.models import AdmissionPolicy
from admission.policy import FIELD_OF_CONSTRAINT
from admission.selectors import policy_dict
from queues import services as queue_services
from queues.models import BASIC_VERBS, POLICY_VERBS, Endpoint
from switchboard.core.errors import Conflict, Forbidden, InvalidArgument, NotFound, RateLimited
from switchboard.ledger.models import LedgerKind
from tests.admission.conftest import budget
from tests.conftest import FIXTURE, Personas, audit_rows, run_threads

DAY_UTC = {"period": "day", "tz": "UTC", "start": "00:00"}


def policy_agent(p: Personas, queues: list[str] | None = None) -> Endpoint:
    endpoint, _ = queue_services.endpoint_vend(
        actor=FIXTURE,
        owner=p.owner,
        name="Self-budgeting agent",
        queues=queues or ["inbox", "outbox"],
        verbs=[*BASIC_VERBS, *POLICY_VERBS],
        rps=0,
    )
    return endpoint


def set_policy(p: Personas, actor: Any = None, **kw: Any) -> AdmissionPolicy:
    args: dict[str, Any] = {
        "actor": actor or p.as_human(),
        "endpoint": p.agent,
        "queue": "inbox",
        "max_in_flight": None,
        "max_claims_per_window": 10,
        "window": DAY_UTC,
        "posture": "enforce",
    }
    args.update(kw)
    return services.policy_set(**args)


def test_an_owner_creates_a_budget_and_the_ledger_records_it(personas: Personas) -> None:
    p = personas
    policy = set_policy(p, max_in_flight=2)
    assert policy.max_claims_per_window == 10 and policy.max_in_flight == 2
    assert policy.created_by == p.owner and policy.updated_by == p.owner
    (row,) = audit_rows().all()
    assert row.kind == LedgerKind.POLICY_CREATE
    assert row.scope == f"endpoint:{p.agent.slug}" and row.queue == "inbox"
    assert row.before is None
    assert row.after == policy_dict(policy)
    assert row.after["window"] == {"period": "day", "tz": "UTC", "start": "00:00", "weekday": None}
    assert row.actor_human_id == p.owner.pk and row.actor_human_name == "olive"
    assert row.actor_endpoint_id is None


def test_a_put_replaces_the_whole_budget_and_records_before_and_after(personas: Personas) -> None:
    p = personas
    first = set_policy(p, max_in_flight=2)
    before = policy_dict(first)
    second = set_policy(
        p,
        max_in_flight=None,
        max_claims_per_window=5,
        window={"period": "week", "tz": "Europe/Berlin", "start": "09:30", "weekday": "Mon"},
        posture="advise",
    )
    assert second.pk == first.pk
    assert second.max_in_flight is None  # absent from the replace: removed
    assert (second.window_period, second.window_weekday, second.posture) == (
        "week",
        "Mon",
        "advise",
    )
    update = audit_rows().get(kind=LedgerKind.POLICY_UPDATE)
    assert update.before == before
    assert update.after == policy_dict(second)


def test_a_write_that_changes_nothing_appends_nothing(personas: Personas) -> None:
    set_policy(personas)
    set_policy(personas)
    assert audit_rows().count() == 1


def test_clearing_a_budget_records_the_delete_and_keeps_the_history(personas: Personas) -> None:
    p = personas
    policy = set_policy(p)
    snapshot = policy_dict(policy)
    removed = services.policy_clear(actor=p.as_human(), endpoint=p.agent, queue="inbox")
    assert removed == snapshot
    assert not AdmissionPolicy.objects.exists()
    kinds = list(audit_rows().values_list("kind", flat=True))
    assert kinds == [LedgerKind.POLICY_CREATE, LedgerKind.POLICY_DELETE]
    delete = audit_rows().get(kind=LedgerKind.POLICY_DELETE)
    assert delete.before == snapshot and delete.after is None


def test_clearing_a_queue_without_a_budget_is_not_found(personas: Personas) -> None:
    with pytest.raises(NotFound):
        services.policy_clear(actor=personas.as_human(), endpoint=personas.agent, queue="inbox")


def test_a_foreign_endpoint_and_an_unknown_one_are_both_not_found(personas: Personas) -> None:
    p = personas
    for ref in (p.foreign, f"endpoint:{p.foreign.slug}", "endpoint:nobody", str(p.foreign.id)):
        with pytest.raises(NotFound) as caught:
            set_policy(p, endpoint=ref)
        assert caught.value.code == "not_found"
    with pytest.raises(NotFound):
        services.policy_clear(actor=p.as_human(), endpoint=p.foreign, queue="inbox")
    assert not AdmissionPolicy.objects.exists() and not audit_rows().exists()


def test_an_endpoint_may_be_named_by_slug_id_or_scope(personas: Personas) -> None:
    p = personas
    for ref in (
        p.agent.slug,
        str(p.agent.id),
        f"endpoint:{p.agent.slug}",
        f"endpoint:{p.agent.id}",
    ):
        assert set_policy(p, endpoint=ref).endpoint_id == p.agent.id


def test_an_auditor_cannot_change_a_budget(personas: Personas) -> None:
    p = personas
    with pytest.raises(Forbidden):
        set_policy(p, actor=p.as_human(p.auditor))
    budget(p, max_in_flight=1)
    with pytest.raises(Forbidden):
        services.policy_clear(actor=p.as_human(p.auditor), endpoint=p.agent, queue="inbox")


def test_a_superuser_may_change_any_budget(personas: Personas) -> None:
    p = personas
    policy = set_policy(p, actor=p.as_human(p.admin), endpoint=p.foreign)
    assert policy.endpoint_id == p.foreign.id and policy.created_by == p.admin


def test_a_revoked_endpoint_takes_no_new_budget(personas: Personas) -> None:
    p = personas
    queue_services.endpoint_revoke(actor=FIXTURE, endpoint=p.agent2)
    with pytest.raises(Conflict):
        set_policy(p, endpoint=p.agent2)


BAD_WRITES: list[tuple[dict[str, Any], str]] = [
    ({"max_in_flight": -1}, "max_in_flight"),
    ({"max_in_flight": 10001}, "max_in_flight"),
    ({"max_in_flight": "3"}, "max_in_flight"),
    ({"max_in_flight": True}, "max_in_flight"),
    ({"max_claims_per_window": -1}, "max_claims_per_window"),
    ({"max_claims_per_window": 1000001}, "max_claims_per_window"),
    ({"max_claims_per_window": 2.5}, "max_claims_per_window"),
    ({"max_claims_per_window": None, "window": None}, "max_in_flight"),
    ({"window": None}, "window"),
    ({"max_claims_per_window": None, "max_in_flight": 3}, "window"),
    ({"window": "daily"}, "window"),
    ({"window": {**DAY_UTC, "colour": "red"}}, "window.colour"),
    ({"window": {**DAY_UTC, "period": "month"}}, "window.period"),
    ({"window": {"tz": "UTC", "start": "00:00"}}, "window.period"),
    ({"window": {**DAY_UTC, "tz": "Mars/Olympus_Mons"}}, "window.tz"),
    ({"window": {**DAY_UTC, "tz": ""}}, "window.tz"),
    ({"window": {**DAY_UTC, "tz": "localtime"}}, "window.tz"),
    ({"window": {"period": "day", "start": "00:00"}}, "window.tz"),
    ({"window": {**DAY_UTC, "start": "24:00"}}, "window.start"),
    ({"window": {**DAY_UTC, "start": "7:00"}}, "window.start"),
    ({"window": {**DAY_UTC, "start": "07:60"}}, "window.start"),
    ({"window": {**DAY_UTC, "weekday": "Mon"}}, "window.weekday"),
    ({"window": {**DAY_UTC, "period": "week"}}, "window.weekday"),
    ({"window": {**DAY_UTC, "period": "week", "weekday": "Monday"}}, "window.weekday"),
    ({"posture": "strict"}, "posture"),
    ({"queue": "no spaces allowed"}, "queue"),
    ({"queue": "quarantine"}, "queue"),
]


@pytest.mark.parametrize(("change", "field"), BAD_WRITES)
def test_a_bad_write_is_refused_naming_the_field_and_changes_nothing(
    personas: Personas, change: dict[str, Any], field: str
) -> None:
    p = personas
    stored = policy_dict(set_policy(p, max_in_flight=4))
    rows = audit_rows().count()
    with pytest.raises(InvalidArgument) as caught:
        set_policy(p, **change)
    assert caught.value.field == field
    assert caught.value.as_dict()["field"] == field
    assert audit_rows().count() == rows
    assert policy_dict(AdmissionPolicy.objects.get()) == stored


# Each database constraint, violated by a raw write that skips validation.
RAW_VIOLATIONS = {
    "policy_max_in_flight_range": "max_in_flight = -1",
    "policy_max_claims_range": "max_claims_per_window = 1000001",
    "policy_window_period_valid": "window_period = 'year'",
    "policy_window_start_format": "window_start = '24:00'",
    "policy_window_weekday_valid": "window_period = 'week', window_weekday = 'Moo'",
    "policy_has_a_limit": "max_in_flight = NULL, max_claims_per_window = NULL",
    "policy_window_complete": "window_tz = NULL",
    "policy_weekday_iff_week": "window_weekday = 'Mon'",
    "policy_posture_valid": "posture = 'strict'",
}


@pytest.mark.parametrize(("constraint", "assignment"), sorted(RAW_VIOLATIONS.items()))
def test_the_database_refuses_what_validation_would(
    personas: Personas, constraint: str, assignment: str
) -> None:
    policy = set_policy(personas)
    with pytest.raises(IntegrityError) as caught, transaction.atomic(), connection.cursor() as c:
        c.execute(f"UPDATE admission_admissionpolicy SET {assignment} WHERE id = %s", [policy.pk])
    assert constraint in str(caught.value)
    assert constraint in FIELD_OF_CONSTRAINT


def test_one_budget_per_queue_identity_is_a_database_constraint(personas: Personas) -> None:
    p = personas
    policy = set_policy(p)
    with pytest.raises(IntegrityError) as caught, transaction.atomic():
        AdmissionPolicy.objects.create(
            endpoint=p.agent,
            queue="inbox",
            max_in_flight=1,
            created_by=p.owner,
            updated_by=p.owner,
        )
    assert "admission_policy_identity" in str(caught.value)
    assert AdmissionPolicy.objects.get().pk == policy.pk


def test_an_agent_with_the_policy_verbs_sets_its_own_budget_audited_as_itself(
    personas: Personas,
) -> None:
    p = personas
    me = policy_agent(p)
    policy = set_policy(p, actor=p.as_agent(me), endpoint=me, max_claims_per_window=3)
    assert policy.created_by == p.owner  # the accountable human is the owner
    row = audit_rows().get()
    assert row.actor_endpoint_id == me.id and row.actor_endpoint_slug == me.slug
    assert row.actor_human_id == p.owner.pk
    services.policy_clear(actor=p.as_agent(me), endpoint=me, queue="inbox")
    delete = audit_rows().get(kind=LedgerKind.POLICY_DELETE)
    assert delete.actor_endpoint_id == me.id


def test_an_agent_without_the_policy_verbs_is_forbidden(personas: Personas) -> None:
    p = personas
    with pytest.raises(Forbidden):
        set_policy(p, actor=p.as_agent(), endpoint=p.agent)
    assert not AdmissionPolicy.objects.exists()


def test_an_agent_changes_only_its_own_scoped_queues(personas: Personas) -> None:
    p = personas
    me = policy_agent(p)
    with pytest.raises(NotFound):
        set_policy(p, actor=p.as_agent(me), endpoint=p.agent)
    with pytest.raises(Forbidden):
        set_policy(p, actor=p.as_agent(me), endpoint=me, queue="elsewhere")
    assert not AdmissionPolicy.objects.exists()


def test_no_human_sets_a_budget_where_the_endpoint_never_claims(personas: Personas) -> None:
    """A queue outside the endpoint's scope has no work of it to govern: the owner, a superuser
    and the agent itself are refused alike (a budget set there before stays clearable)."""
    p = personas
    for human in (p.owner, p.admin):
        with pytest.raises(InvalidArgument) as caught:
            set_policy(p, actor=p.as_human(human), queue="nowhere")
        assert caught.value.field == "queue"
        assert "not in endpoint agent's scope" in caught.value.message
    assert not AdmissionPolicy.objects.exists()
    assert not audit_rows().exists()
    me = policy_agent(p)
    with pytest.raises(Forbidden):
        set_policy(p, actor=p.as_agent(me), endpoint=me, queue="nowhere")


def test_policy_writes_are_limited_per_human(personas: Personas, settings: Any) -> None:
    p = personas
    # A refill of one write per 100 s: eleven writes cannot earn a token back, however slow the run.
    settings.POLICY_WRITE_RATE_LIMIT = (0.01, 10)
    for n in range(10):
        set_policy(p, max_claims_per_window=n + 1)
    with pytest.raises(RateLimited) as caught:
        set_policy(p, max_claims_per_window=100)
    assert caught.value.details["retry_after"] >= 1
    assert AdmissionPolicy.objects.get().max_claims_per_window == 10
    # Another human has a bucket of their own.
    set_policy(p, actor=p.as_human(p.admin), endpoint=p.foreign)


def test_two_writers_creating_one_budget_at_once_leave_one_policy(tx_personas: Personas) -> None:
    p = tx_personas

    def write(i: int) -> AdmissionPolicy:
        return set_policy(p, max_claims_per_window=10 + i)

    made = run_threads(2, write)
    assert made[0].pk == made[1].pk
    policy = AdmissionPolicy.objects.get()
    kinds = list(audit_rows().values_list("kind", flat=True))
    assert kinds == [LedgerKind.POLICY_CREATE, LedgerKind.POLICY_UPDATE]
    last = audit_rows().order_by("-seq").first()
    assert last is not None and last.after == policy_dict(policy)
