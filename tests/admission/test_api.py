"""The budget API at /api/v1/admission and the agent's budget verbs over REST."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from admission.models import AdmissionPolicy, AdmissionWindow
from admission.selectors import policy_dict
from queues import services as queue_services
from queues.models import POLICY_VERBS, Verb
from switchboard.core import verbs
from switchboard.ledger.models import LedgerKind
from tests.admission.conftest import budget
from tests.conftest import FIXTURE, Personas, audit_rows, push, self_budgeting

DAY = {"period": "day", "tz": "Europe/Berlin", "start": "06:00"}


class Api:
    def __init__(self, token: str | None) -> None:
        self.client = Client()
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def get(self, path: str) -> Any:
        return self.client.get(path, headers=self.headers)

    def put(self, path: str, body: Any = None, *, raw: str | None = None, **headers: str) -> Any:
        data = raw if raw is not None else json.dumps(body)
        return self.client.put(
            path, data, content_type="application/json", headers={**self.headers, **headers}
        )

    def delete(self, path: str, **headers: str) -> Any:
        return self.client.delete(path, headers={**self.headers, **headers})

    def post(self, path: str, body: Any) -> Any:
        return self.client.post(
            path, json.dumps(body), content_type="application/json", headers=self.headers
        )


def human(user: Any) -> Api:
    return Api(queue_services.human_token_create(actor=FIXTURE, user=user, name="test")[1])


def one(p: Personas, queue: str = "inbox", endpoint: Any = None) -> str:
    return f"/api/v1/admission/endpoint:{(endpoint or p.agent).slug}/{queue}"


def test_an_owner_lists_only_their_budgets_with_posture_status_and_usage(
    personas: Personas,
) -> None:
    p = personas
    budget(p, per="day", limit=5, posture="advise")
    budget(p, "inbox", endpoint=p.foreign, max_in_flight=1)
    response = human(p.owner).get("/api/v1/admission")
    assert response.status_code == 200
    (row,) = response.json()["policies"]
    assert row["policy"]["scope"] == f"endpoint:{p.agent.slug}"
    assert row["policy"]["posture"] == "advise"
    assert row["policy"]["window"]["description"] == "per day from 00:00 UTC"
    assert row["status"] == {
        "state": "admitted",
        "reason": None,
        "next_eligible_at": None,
        "exact": True,
        "window": None,
    }
    assert row["usage"]["used"] == 0 and row["usage"]["remaining"] == 5
    for reader in (p.admin, p.auditor):
        assert len(human(reader).get("/api/v1/admission").json()["policies"]) == 2


def test_get_one_returns_the_policy_its_windows_and_its_audit_tail(personas: Personas) -> None:
    p = personas
    policy = budget(p, per="day", limit=1)
    budget(p, per="day", limit=2)
    push(p, 3)
    queue_services.claim_next(actor=p.as_agent())
    queue_services.claim_next(actor=p.as_agent())
    queue_services.claim_next(actor=p.as_agent())  # refused
    body = human(p.owner).get(one(p)).json()
    assert body["policy"]["max_claims_per_window"] == 2
    assert body["status"]["state"] == "deferred"
    assert body["status"]["reason"] == "window_exhausted" and body["status"]["exact"] is True
    (window,) = body["windows"]
    assert (window["used"], window["refused"], window["limit"]) == (2, 1, 2)
    assert [a["kind"] for a in body["audit"]] == [
        LedgerKind.POLICY_UPDATE,
        LedgerKind.POLICY_CREATE,
    ]
    assert body["audit"][0]["actor_human"] == "olive"
    assert body["audit"][0]["before"]["max_claims_per_window"] == 1
    assert AdmissionWindow.objects.filter(policy=policy).count() == 1


def test_foreign_unknown_and_missing_budgets_are_all_not_found(personas: Personas) -> None:
    p = personas
    budget(p, "inbox", endpoint=p.foreign, max_in_flight=1)
    api = human(p.owner)
    for path in (
        one(p, endpoint=p.foreign),
        "/api/v1/admission/endpoint:nobody/inbox",
        f"/api/v1/admission/endpoint:{p.foreign.id}/inbox",
        one(p, queue="never-budgeted"),
    ):
        response = api.get(path)
        assert response.status_code == 404, path
        assert response.json()["code"] == "not_found"
    for write in (
        api.put(one(p, endpoint=p.foreign), {"max_in_flight": 3}),
        api.delete(one(p, endpoint=p.foreign)),
        api.put("/api/v1/admission/endpoint:nobody/inbox", {"max_in_flight": 3}),
    ):
        assert write.status_code == 404
    assert AdmissionPolicy.objects.get().max_in_flight == 1


def test_a_scope_that_is_not_an_endpoint_is_an_invalid_argument(personas: Personas) -> None:
    response = human(personas.owner).get("/api/v1/admission/team:abc/inbox")
    assert response.status_code == 400
    assert response.json()["field"] == "scope"


def test_put_creates_then_fully_replaces_a_budget(personas: Personas) -> None:
    p = personas
    api = human(p.owner)
    created = api.put(one(p), {"max_claims_per_window": 10, "window": DAY, "max_in_flight": 2})
    assert created.status_code == 200, created.json()
    assert created.json()["policy"]["window"] == {
        "period": "day",
        "tz": "Europe/Berlin",
        "start": "06:00",
        "weekday": None,
        "description": "per day from 06:00 Europe/Berlin",
    }
    assert created.json()["policy"]["posture"] == "enforce"
    replaced = api.put(one(p), {"max_in_flight": 4, "posture": "off"})
    assert replaced.status_code == 200
    policy = AdmissionPolicy.objects.get()
    assert (policy.max_in_flight, policy.max_claims_per_window, policy.window_period) == (
        4,
        None,
        None,
    )
    assert policy.posture == "off"
    assert audit_rows().count() == 2


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"max_in_flight": -1}, "max_in_flight"),
        ({"max_in_flight": "2"}, "max_in_flight"),
        ({"max_claims_per_window": 5, "window": {**DAY, "tz": "Nowhere/Land"}}, "window.tz"),
        ({"max_claims_per_window": 5, "window": {**DAY, "start": "6:00"}}, "window.start"),
        ({"max_claims_per_window": 5, "window": {**DAY, "period": "week"}}, "window.weekday"),
        ({"max_claims_per_window": 5, "window": {**DAY, "weekday": "Tue"}}, "window.weekday"),
        ({"max_claims_per_window": 5, "window": {**DAY, "period": "year"}}, "window.period"),
        ({"max_claims_per_window": 5}, "window"),
        ({}, "max_in_flight"),
        ({"max_in_flight": 1, "posture": "loud"}, "posture"),
        ({"max_in_flight": 1, "colour": "red"}, "colour"),
    ],
)
def test_a_bad_put_is_refused_naming_the_field_and_leaves_the_budget_alone(
    personas: Personas, body: dict[str, Any], field: str
) -> None:
    p = personas
    stored = policy_dict(budget(p, per="day", limit=7))
    response = human(p.owner).put(one(p), body)
    assert response.status_code == 400, response.json()
    assert response.json()["code"] == "invalid_argument"
    assert response.json()["field"] == field
    assert policy_dict(AdmissionPolicy.objects.get()) == stored
    assert audit_rows().count() == 1


def test_a_near_miss_zone_is_refused_naming_the_zone_meant(personas: Personas) -> None:
    p = personas
    body = {"max_claims_per_window": 5, "window": {**DAY, "tz": "europe/berlin"}}
    response = human(p.owner).put(one(p), body)
    assert response.status_code == 400 and response.json()["field"] == "window.tz"
    assert response.json()["error"].endswith("(did you mean 'Europe/Berlin'?)")
    assert not AdmissionPolicy.objects.exists()


def test_a_policy_body_over_sixteen_kib_is_refused_before_parsing(personas: Personas) -> None:
    p = personas
    raw = json.dumps({"max_in_flight": 2}) + " " * (16 * 1024)
    response = human(p.owner).put(one(p), raw=raw)
    assert response.status_code == 413
    assert response.json()["code"] == "invalid_argument" and response.json()["field"] == "body"
    assert not AdmissionPolicy.objects.exists()


def test_an_auditor_reads_but_cannot_write(personas: Personas) -> None:
    p = personas
    budget(p, max_in_flight=1)
    api = human(p.auditor)
    assert api.get(one(p)).status_code == 200
    assert api.put(one(p), {"max_in_flight": 9}).status_code == 403
    assert api.delete(one(p)).status_code == 403
    assert AdmissionPolicy.objects.get().max_in_flight == 1


def test_delete_removes_the_budget_and_keeps_its_history(personas: Personas) -> None:
    p = personas
    budget(p, max_in_flight=1)
    api = human(p.owner)
    assert api.delete(one(p)).status_code == 204
    assert api.delete(one(p)).status_code == 404
    assert not AdmissionPolicy.objects.exists()
    assert audit_rows().filter(kind=LedgerKind.POLICY_DELETE).count() == 1


def test_writes_over_the_per_human_rate_are_refused_with_retry_after(
    personas: Personas, settings: Any
) -> None:
    p = personas
    # A refill of one write per 100 s: eleven writes cannot earn a token back, however slow the run.
    settings.POLICY_WRITE_RATE_LIMIT = (0.01, 10)
    api = human(p.owner)
    for n in range(10):
        assert api.put(one(p), {"max_in_flight": n + 1}).status_code == 200
    refused = api.put(one(p), {"max_in_flight": 99})
    assert refused.status_code == 429
    assert refused.json()["code"] == "rate_limited"
    assert int(refused["Retry-After"]) >= 1
    assert AdmissionPolicy.objects.get().max_in_flight == 10


def test_the_budget_api_needs_a_human(personas: Personas) -> None:
    p = personas
    assert Api(None).get("/api/v1/admission").status_code == 401
    assert Api(p.agent_token).get("/api/v1/admission").status_code == 401


def test_the_openapi_document_declares_every_status(personas: Personas) -> None:
    doc = human(personas.owner).get("/api/v1/openapi.json").json()
    ops = doc["paths"]["/api/v1/admission/{scope}/{queue}"]
    assert set(ops["put"]["responses"]) == {
        "200",
        "400",
        "401",
        "403",
        "404",
        "409",
        "412",
        "413",
        "429",
        "503",
    }
    assert set(ops["delete"]["responses"]) >= {"204", "404", "412", "429", "503"}
    headers = {
        verb: {p["name"] for p in ops[verb]["parameters"] if p["in"] == "header"}
        for verb in ("put", "delete")
    }
    assert headers == {"put": {"If-Match", "If-None-Match"}, "delete": {"If-Match"}}
    assert set(ops["get"]["responses"]) == {"200", "400", "401", "403", "404", "503"}
    assert set(doc["paths"]["/api/v1/admission"]["get"]["responses"]) == {
        "200",
        "400",
        "401",
        "403",
        "503",
    }


# --- the agent verbs -----------------------------------------------------------------------------


def test_admission_status_rides_on_the_drain_grant_and_answers_every_scoped_queue(
    personas: Personas,
) -> None:
    p = personas
    budget(p, per="day", limit=1)
    push(p, 2)
    queue_services.claim_next(actor=p.as_agent())
    assert p.agent.holds(Verb.ADMISSION_STATUS)
    response = Api(p.agent_token).post("/api/v1/agent/admission_status", {})
    assert response.status_code == 200, response.json()
    queues = {q["queue"]: q for q in response.json()["queues"]}
    assert set(queues) == {"inbox", "outbox"}  # quarantine is never delivered
    assert queues["inbox"]["status"]["reason"] == "window_exhausted"
    assert queues["inbox"]["usage"]["used"] == 1
    assert queues["inbox"]["policy"]["posture"] == "enforce"
    assert queues["outbox"] == {
        "queue": "outbox",
        "policy": None,
        "status": {"state": "admitted", "reason": None, "next_eligible_at": None, "exact": True},
        "usage": None,
    }
    only = Api(p.agent_token).post("/api/v1/agent/admission_status", {"queue": "inbox"})
    assert [q["queue"] for q in only.json()["queues"]] == ["inbox"]


def test_admission_status_on_a_queue_outside_the_scope_is_forbidden(personas: Personas) -> None:
    response = Api(personas.agent_token).post(
        "/api/v1/agent/admission_status", {"queue": "elsewhere"}
    )
    assert response.status_code == 403 and response.json()["code"] == "forbidden"


def test_admission_status_is_not_granted_without_a_drain_verb(personas: Personas) -> None:
    p = personas
    endpoint, token = queue_services.endpoint_vend(
        actor=FIXTURE, owner=p.owner, name="Writer", queues=["inbox"], verbs=["create_todo"], rps=0
    )
    assert not endpoint.holds(Verb.ADMISSION_STATUS)
    response = Api(token).post("/api/v1/agent/admission_status", {})
    assert response.status_code == 403


def test_the_policy_verbs_are_never_in_the_basic_grant(personas: Personas) -> None:
    p = personas
    names = {spec.name for spec in verbs.granted(p.as_agent())}
    assert "admission_status" in names
    assert not names & set(POLICY_VERBS)
    response = Api(p.agent_token).post(
        "/api/v1/agent/set_admission_policy", {"queue": "inbox", "policy": {"max_in_flight": 1}}
    )
    assert response.status_code == 403
    assert not AdmissionPolicy.objects.exists()


def test_an_agent_granted_the_policy_verbs_sets_and_clears_its_own_budget(
    personas: Personas,
) -> None:
    p = personas
    endpoint, token = self_budgeting(p)
    api = Api(token)
    set_ = api.post(
        "/api/v1/agent/set_admission_policy",
        {"queue": "inbox", "policy": {"max_claims_per_window": 3, "window": DAY}},
    )
    assert set_.status_code == 200, set_.json()
    assert set_.json()["policy"]["max_claims_per_window"] == 3
    assert set_.json()["status"]["state"] == "admitted"
    row = audit_rows().get()
    assert row.actor_endpoint_id == endpoint.id and row.actor_human_id == p.owner.pk
    bad = api.post(
        "/api/v1/agent/set_admission_policy",
        {"queue": "inbox", "policy": {"max_claims_per_window": 3, "window": {**DAY, "tz": "X/Y"}}},
    )
    assert bad.status_code == 400 and bad.json()["field"] == "policy.window.tz"
    # The service's own refusals name the field under policy too, as the arguments hold it.
    for policy, field in [
        ({"max_claims_per_window": 3}, "policy.window"),
        ({"max_in_flight": 1, "window": DAY}, "policy.window"),
        ({"windows": [{**DAY, "limit": 2}, {**DAY, "limit": 3}]}, "policy.windows[1].period"),
    ]:
        refused = api.post(
            "/api/v1/agent/set_admission_policy", {"queue": "inbox", "policy": policy}
        )
        assert refused.status_code == 400, refused.json()
        assert refused.json()["field"] == field, (policy, refused.json())
    outside = api.post(
        "/api/v1/agent/set_admission_policy", {"queue": "outbox", "policy": {"max_in_flight": 1}}
    )
    assert outside.status_code == 403
    cleared = api.post("/api/v1/agent/clear_admission_policy", {"queue": "inbox"})
    assert cleared.status_code == 200
    assert cleared.json()["policy"] is None
    assert not AdmissionPolicy.objects.exists()
    again = api.post("/api/v1/agent/clear_admission_policy", {"queue": "inbox"})
    assert again.status_code == 404
