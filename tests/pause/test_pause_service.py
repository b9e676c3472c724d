"""queue_pause / queue_resume: what they accept, refuse, record and report."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission

from queues import pauses
from queues.access import AgentActor, HumanActor
from queues.models import QueuePause
from switchboard.core.errors import Forbidden, InvalidArgument, NotFound
from switchboard.ledger import chain as ledger
from switchboard.ledger.models import LedgerEntry, LedgerKind
from tests.conftest import Personas, audit_rows
from tests.pause.helpers import pause, resume


def test_it_pauses_a_known_queue_recording_who_when_and_why(personas: Personas) -> None:
    result = pause(personas.pauser, "inbox", reason="  consumer upgrade  ")

    row = QueuePause.objects.get(queue="inbox")
    assert result.changed is True
    assert row.reason == "consumer upgrade"
    assert row.paused_by == personas.pauser
    assert result.pause.at == row.paused_at
    assert result.as_dict() == {
        "queue": "inbox",
        "paused": True,
        "changed": True,
        "pause": {"reason": "consumer upgrade", "by": "paul", "at": row.paused_at},
    }


def test_it_appends_one_ledger_row_for_the_pause_and_one_for_the_resume(
    personas: Personas,
) -> None:
    paused = pause(personas.pauser, "inbox", reason="upgrade")
    resume(personas.admin, "inbox")

    rows = list(audit_rows().filter(queue="inbox").order_by("seq"))
    assert [r.kind for r in rows] == [LedgerKind.QUEUE_PAUSE, LedgerKind.QUEUE_RESUME]
    assert (rows[0].actor_human_id, rows[0].actor_human_name) == (personas.pauser.pk, "paul")
    assert rows[0].scope == "queue"
    assert rows[0].before is None
    assert rows[0].after == {"reason": "upgrade", "by": "paul", "at": paused.pause.at.isoformat()}
    assert (rows[1].actor_human_id, rows[1].actor_human_name) == (personas.admin.pk, "ada")
    assert rows[1].before == rows[0].after
    assert rows[1].after is None
    assert ledger.verify_chain(list(LedgerEntry.objects.order_by("seq"))) is None


def test_pausing_a_paused_queue_changes_nothing_and_says_so(personas: Personas) -> None:
    first = pause(personas.pauser, "inbox", reason="upgrade")

    again = pause(personas.admin, "inbox", reason="something else")

    assert again.changed is False
    assert again.as_dict()["paused"] is True
    assert again.pause == first.pause
    row = QueuePause.objects.get(queue="inbox")
    assert (row.reason, row.paused_by, row.paused_at) == (
        "upgrade",
        personas.pauser,
        first.pause.at,
    )
    assert audit_rows().filter(kind=LedgerKind.QUEUE_PAUSE).count() == 1


def test_it_refuses_to_pause_the_quarantine_queue(personas: Personas) -> None:
    with pytest.raises(InvalidArgument) as refused:
        pause(personas.admin, "quarantine")

    assert refused.value.field == "queue"
    assert not QueuePause.objects.exists()
    assert not audit_rows().exists()


def test_it_refuses_an_unknown_name_unless_asked_to_create_it(personas: Personas) -> None:
    with pytest.raises(NotFound) as refused:
        pause(personas.admin, "inbx")
    assert refused.value.details["queue"] == "inbx"
    assert not QueuePause.objects.exists()

    created = pause(personas.admin, "night-batch", create=True)

    assert created.changed is True
    assert QueuePause.objects.filter(queue="night-batch").exists()


def test_a_name_used_only_by_an_endpoint_scope_is_known(personas: Personas) -> None:
    # "outbox" is in agent's scope but holds no todo.
    assert pause(personas.admin, "outbox").changed is True


def test_a_name_used_only_by_a_todo_is_known(personas: Personas) -> None:
    from queues.models import Todo

    # A todo left on a queue no scope grants any more (scopes never widen, but endpoints are
    # re-vended with narrower ones): only that todo knows the name.
    Todo.objects.create(endpoint=personas.agent, queue="side-queue", title="one-off")

    assert pause(personas.admin, "side-queue").changed is True


@pytest.mark.parametrize(
    ("reason", "why"), [("", "empty"), ("   ", "blank"), ("x" * 501, "too long")]
)
def test_it_requires_a_reason_of_at_most_500_characters(
    personas: Personas, reason: str, why: str
) -> None:
    with pytest.raises(InvalidArgument) as refused:
        pause(personas.admin, "inbox", reason=reason)

    assert refused.value.field == "reason", why
    assert not QueuePause.objects.exists()


def test_a_reason_of_exactly_500_characters_is_accepted(personas: Personas) -> None:
    assert pause(personas.admin, "inbox", reason="x" * 500).pause.reason == "x" * 500


def test_it_refuses_a_malformed_queue_name(personas: Personas) -> None:
    with pytest.raises(InvalidArgument) as refused:
        pause(personas.admin, "no spaces please")
    assert refused.value.field == "queue"


@pytest.mark.parametrize("who", ["auditor", "owner", "other_owner"])
def test_only_pausers_and_superusers_may_pause_or_resume(personas: Personas, who: str) -> None:
    user = getattr(personas, who)
    with pytest.raises(Forbidden):
        pause(user, "inbox")
    pause(personas.pauser, "inbox")
    with pytest.raises(Forbidden):
        resume(user, "inbox")
    assert QueuePause.objects.filter(queue="inbox").exists()


def test_an_auditor_holding_the_permission_is_still_refused(personas: Personas) -> None:
    personas.auditor.user_permissions.add(Permission.objects.get(codename="pause_queue"))

    with pytest.raises(Forbidden):
        pause(personas.auditor, "inbox")


def test_an_agent_cannot_pause(personas: Personas) -> None:
    agent: AgentActor = personas.as_agent()
    with pytest.raises(Forbidden):
        pauses.queue_pause(actor=agent, queue="inbox", reason="mine")  # type: ignore[arg-type]
    assert not QueuePause.objects.exists()


def test_resume_deletes_the_row_and_reports_what_it_lifted(personas: Personas) -> None:
    paused = pause(personas.pauser, "inbox", reason="upgrade")

    result = pauses.queue_resume(actor=HumanActor(personas.pauser), queue="inbox")

    assert not QueuePause.objects.exists()
    assert result.resumed is True
    assert result.lifted == paused.pause
    assert result.as_dict()["lifted"] == {"reason": "upgrade", "by": "paul", "at": paused.pause.at}


def test_resuming_a_queue_that_was_never_paused_lifts_nothing(personas: Personas) -> None:
    result = resume(personas.pauser, "inbox")

    assert result.as_dict() == {
        "queue": "inbox",
        "resumed": False,
        "lifted": None,
        "woken": [],
        "held": [],
    }
    assert not audit_rows().exists()


def test_resume_of_a_name_nothing_has_used_is_not_found_as_its_pause_is(
    personas: Personas,
) -> None:
    # It answered "was not paused", telling a typo a real queue had been checked (round 4).
    with pytest.raises(NotFound) as refused:
        resume(personas.admin, "never-heard-of-it")
    assert refused.value.details["field"] == "queue"
    assert not audit_rows().exists()
    # A known name that is not paused is still no error, nor one the caller knows of.
    assert resume(personas.admin, "inbox").resumed is False
    lifted = pauses.queue_resume(
        actor=HumanActor(personas.admin), queue="declared-elsewhere", known=True
    )
    assert lifted.lifted is None


def test_nothing_auto_resumes(personas: Personas) -> None:
    from queues import services

    pause(personas.pauser, "inbox")
    services.reap_expired()
    services.requeue_due_retries()

    assert QueuePause.objects.filter(queue="inbox").exists()
