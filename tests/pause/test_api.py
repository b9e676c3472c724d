"""The operators' queue API (/api/v1/queues…) and the paused gauge on /metrics."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from django.db import IntegrityError, transaction
from django.test import Client
from django.utils import timezone

from queues import pauses, services
from queues.models import QueuePause
from switchboard.ledger.models import LedgerEntry, LedgerKind
from tests.conftest import FIXTURE, Personas, push
from tests.pause.helpers import pause

QUEUES = "/api/v1/queues"


def _client(user: Any = None, token: str | None = None) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    if token is not None:
        client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    return client


def _post(client: Client, path: str, body: dict[str, Any] | None = None) -> Any:
    return client.post(path, body or {}, content_type="application/json")


def _by_name(response: Any) -> dict[str, dict[str, Any]]:
    assert response.status_code == 200, response.content
    return {q["queue"]: q for q in response.json()["queues"]}


def test_a_pauser_pauses_a_queue_over_the_api(personas: Personas) -> None:
    response = _post(_client(personas.pauser), f"{QUEUES}/inbox/pause", {"reason": "upgrade"})

    assert response.status_code == 200, response.content
    body = response.json()
    row = QueuePause.objects.get(queue="inbox")
    assert body["queue"] == "inbox"
    assert (body["paused"], body["changed"]) == (True, True)
    assert body["pause"]["reason"] == "upgrade"
    assert body["pause"]["by"] == "paul"
    # JSON times carry microseconds, as every surface writes them.
    assert datetime.fromisoformat(body["pause"]["at"]) == row.paused_at
    assert LedgerEntry.objects.filter(kind=LedgerKind.QUEUE_PAUSE, queue="inbox").count() == 1


def test_a_superuser_with_a_personal_token_pauses_and_resumes(personas: Personas) -> None:
    _, token = services.human_token_create(actor=FIXTURE, user=personas.admin)
    client = _client(token=token)

    paused = _post(client, f"{QUEUES}/inbox/pause", {"reason": "drain"})
    resumed = _post(client, f"{QUEUES}/inbox/resume")

    assert paused.status_code == 200, paused.content
    assert resumed.status_code == 200, resumed.content
    assert resumed.json()["resumed"] is True
    assert resumed.json()["lifted"]["reason"] == "drain"
    assert not QueuePause.objects.exists()


def test_pausing_a_paused_queue_answers_changed_false(personas: Personas) -> None:
    client = _client(personas.pauser)
    _post(client, f"{QUEUES}/inbox/pause", {"reason": "first"})

    again = _post(client, f"{QUEUES}/inbox/pause", {"reason": "second"})

    assert again.status_code == 200
    assert (again.json()["paused"], again.json()["changed"]) == (True, False)
    assert again.json()["pause"]["reason"] == "first"


def test_resuming_a_live_queue_answers_that_nothing_was_lifted(personas: Personas) -> None:
    response = _post(_client(personas.pauser), f"{QUEUES}/inbox/resume")

    assert response.status_code == 200
    assert response.json() == {
        "queue": "inbox",
        "resumed": False,
        "lifted": None,
        "woken": [],
        "held": [],
    }


def test_the_quarantine_queue_cannot_be_paused(personas: Personas) -> None:
    response = _post(_client(personas.admin), f"{QUEUES}/quarantine/pause", {"reason": "no"})

    assert response.status_code == 400
    assert response.json()["code"] == "invalid_argument"
    assert response.json()["field"] == "queue"
    assert not QueuePause.objects.exists()


def test_an_unknown_name_is_not_found_unless_create_is_asked(personas: Personas) -> None:
    client = _client(personas.admin)

    typo = _post(client, f"{QUEUES}/inbx/pause", {"reason": "upgrade"})
    created = _post(client, f"{QUEUES}/night-batch/pause", {"reason": "later", "create": True})

    assert typo.status_code == 404
    assert typo.json()["code"] == "not_found"
    assert typo.json()["field"] == "queue"  # as the resume's is
    assert created.status_code == 200
    assert list(QueuePause.objects.values_list("queue", flat=True)) == ["night-batch"]
    # A resume of the typo is not found either ("was not paused" told it a real queue was
    # checked), while a known queue that is not paused answers resumed: false.
    resume_typo = _post(client, f"{QUEUES}/inbx/resume", {})
    assert resume_typo.status_code == 404, resume_typo.content
    assert resume_typo.json()["field"] == "queue"
    known = _post(client, f"{QUEUES}/inbox/resume", {})
    assert known.status_code == 200 and known.json()["resumed"] is False


@pytest.mark.parametrize("body", [{}, {"reason": ""}, {"reason": "   "}, {"reason": "x" * 501}])
def test_a_reason_is_required(personas: Personas, body: dict[str, Any]) -> None:
    response = _post(_client(personas.admin), f"{QUEUES}/inbox/pause", body)

    assert response.status_code == 400
    assert response.json()["code"] == "invalid_argument"
    assert response.json()["field"] == "reason"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        # A misspelt "create" was dropped, so the pause was refused as an unknown queue, or
        # (another field misspelt) done without the operator's intent; "yes" and 1 were true.
        ({"reason": "later", "craete": True}, "craete"),
        ({"reason": "later", "create": "yes"}, "create"),
        ({"reason": "later", "create": 1}, "create"),
        ({"reason": 5}, "reason"),
    ],
)
def test_a_pause_body_is_read_strictly(
    personas: Personas, body: dict[str, Any], field: str
) -> None:
    response = _post(_client(personas.admin), f"{QUEUES}/night-batch/pause", body)

    assert response.status_code == 400, response.content
    assert (response.json()["code"], response.json()["field"]) == ("invalid_argument", field)
    assert not QueuePause.objects.exists()


@pytest.mark.parametrize("who", ["auditor", "owner"])
def test_auditors_and_plain_owners_are_forbidden(personas: Personas, who: str) -> None:
    client = _client(getattr(personas, who))
    pause(personas.admin, "outbox")

    paused = _post(client, f"{QUEUES}/inbox/pause", {"reason": "mine"})
    resumed = _post(client, f"{QUEUES}/outbox/resume")

    assert (paused.status_code, paused.json()["code"]) == (403, "forbidden")
    assert (resumed.status_code, resumed.json()["code"]) == (403, "forbidden")
    assert list(QueuePause.objects.values_list("queue", flat=True)) == ["outbox"]


def test_an_agent_token_cannot_reach_the_queue_routes(personas: Personas) -> None:
    client = _client(token=personas.agent_token)

    for response in (
        client.get(QUEUES),
        _post(client, f"{QUEUES}/inbox/pause", {"reason": "hide my work"}),
        _post(client, f"{QUEUES}/inbox/resume"),
    ):
        assert response.status_code == 401
        assert response.json()["code"] == "unauthorized"
    assert not QueuePause.objects.exists()


def test_anonymous_callers_are_unauthorized(personas: Personas) -> None:
    response = Client().get(QUEUES)

    assert response.status_code == 401
    assert response.json()["code"] == "unauthorized"


def test_the_list_shows_counts_oldest_pending_and_the_pause(personas: Personas) -> None:
    push(personas, 3, queue="inbox")
    push(personas, 1, queue="outbox")
    got = services.claim_next(actor=personas.as_agent(), queue="inbox")
    assert isinstance(got, services.Claimed)
    pause(personas.pauser, "inbox", reason="upgrade")
    pause(personas.pauser, "night-batch", reason="not yet", create=True)

    queues = _by_name(_client(personas.admin).get(QUEUES))

    inbox = queues["inbox"]
    assert inbox["counts"] == {"pending": 2, "claimed": 1, "done": 0, "failed": 0}
    assert inbox["dead_letter"] == 0
    assert inbox["oldest_pending_seconds"] >= 0
    assert inbox["paused"]["reason"] == "upgrade"
    assert inbox["paused"]["by"] == "paul"
    assert queues["outbox"]["paused"] is None
    assert queues["outbox"]["counts"]["pending"] == 1
    # A paused queue that holds no todos is still listed, as paused.
    assert queues["night-batch"]["paused"]["reason"] == "not yet"
    assert queues["night-batch"]["counts"] == {"pending": 0, "claimed": 0, "done": 0, "failed": 0}
    assert queues["night-batch"]["oldest_pending_seconds"] is None


def test_owners_see_their_endpoints_counts_and_every_paused_queue(personas: Personas) -> None:
    push(personas, 2, queue="inbox")  # olive's agent
    push(personas, 5, queue="inbox", endpoint=personas.foreign)  # otto's endpoint
    pause(personas.admin, "night-batch", create=True)

    olive = _by_name(_client(personas.owner).get(QUEUES))
    otto = _by_name(_client(personas.other_owner).get(QUEUES))
    auditor = _by_name(_client(personas.auditor).get(QUEUES))

    assert olive["inbox"]["counts"]["pending"] == 2
    assert otto["inbox"]["counts"]["pending"] == 5
    assert "outbox" in olive and "outbox" not in otto
    assert auditor["inbox"]["counts"]["pending"] == 7
    for view in (olive, otto, auditor):
        assert view["night-batch"]["paused"] is not None


def test_the_openapi_document_declares_the_queue_routes(personas: Personas) -> None:
    doc = _client(personas.admin).get("/api/v1/openapi.json")

    assert doc.status_code == 200
    paths = doc.json()["paths"]
    pause_op = paths["/api/v1/queues/{queue}/pause"]["post"]
    assert set(pause_op["responses"]) == {"200", "400", "401", "403", "404", "409", "413", "503"}
    assert set(paths["/api/v1/queues"]["get"]["responses"]) == {"200", "400", "401", "403", "503"}
    assert "/api/v1/queues/{queue}/resume" in paths


def test_metrics_say_which_queues_are_paused(personas: Personas) -> None:
    push(personas, 2, queue="inbox")
    pause(personas.pauser, "inbox")
    pause(personas.pauser, "night-batch", create=True)

    response = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer test-metrics-token")

    assert response.status_code == 200
    lines = set(response.content.decode().splitlines())
    assert 'switchboard_queue_paused{queue="inbox"} 1.0' in lines
    assert 'switchboard_queue_paused{queue="night-batch"} 1.0' in lines
    assert 'switchboard_queue_paused{queue="outbox"} 0.0' in lines
    assert any(
        line.startswith('switchboard_queue_oldest_pending_seconds{queue="inbox"}') for line in lines
    )


def test_metrics_drop_the_flag_once_resumed(personas: Personas) -> None:
    pause(personas.pauser, "inbox")
    _post(_client(personas.pauser), f"{QUEUES}/inbox/resume")

    response = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer test-metrics-token")

    assert 'switchboard_queue_paused{queue="inbox"} 0.0' in response.content.decode().splitlines()


def test_list_todos_names_the_agents_granted_queues_that_are_paused(personas: Personas) -> None:
    pause(personas.pauser, "inbox")
    pause(personas.pauser, "night-batch", create=True)  # not granted to this agent

    response = _post(_client(token=personas.agent_token), "/api/v1/agent/list_todos")

    assert response.status_code == 200, response.content
    assert response.json()["paused_queues"] == ["inbox"]


def test_no_agent_verb_pauses_or_resumes_a_queue(personas: Personas) -> None:
    paths = _client(personas.admin).get("/api/v1/openapi.json").json()["paths"]

    agent_paths = [path for path in paths if path.startswith("/api/v1/agent/")]
    assert agent_paths, "the agent verbs are mounted"
    assert not [p for p in agent_paths if "pause" in p or "resume" in p]


def test_the_database_refuses_a_reason_the_service_would_refuse(personas: Personas) -> None:
    # Written behind the services' back, a reason still has to be one a pause could give.
    for reason in ("", "x" * (pauses.MAX_REASON + 1)):
        with pytest.raises(IntegrityError), transaction.atomic():
            QueuePause.objects.create(
                queue="inbox", reason=reason, paused_by=personas.admin, paused_at=timezone.now()
            )
    QueuePause.objects.create(
        queue="inbox", reason="x" * pauses.MAX_REASON, paused_by=personas.admin,
        paused_at=timezone.now(),
    )  # fmt: skip
