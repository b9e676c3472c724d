"""The operators' limits API answers what it did: a write's answer shows how full the limit is
as the list does, a delete refuses a header that means nothing on it, a queue's aging is set or
cleared (not both), and verify is rationed per person as the console's "Verify now" is."""

from __future__ import annotations

import json
from typing import Any

from django.test import Client

from admission.limits.models import Pool, QueueSettings
from queues import services
from tests.api.conftest import human_token
from tests.conftest import Personas
from tests.limits.conftest import pool, push_named


def call(user: Any, method: str, path: str, body: Any = None, **headers: str) -> Any:
    send = getattr(Client(), method)
    token = human_token(user)
    return send(
        path,
        json.dumps(body) if body is not None else "",  # None is sent as the body "None"
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}", **headers},
    )


def test_a_put_and_a_quarantine_answer_the_held_the_list_shows(personas: Personas) -> None:
    p = personas
    pool("gpu", slots=3)
    [todo] = push_named(p, 1, pool="gpu")
    services.claim(actor=p.as_agent(), todo_id=todo.id)
    put = call(p.admin, "put", "/api/v1/limits/pool/gpu", {"slots": 2})
    assert put.status_code == 200 and put.json()["held"] == 1
    listed = call(p.admin, "get", "/api/v1/limits").json()["limits"]
    assert [x["held"] for x in listed] == [1]
    quarantined = call(p.admin, "post", "/api/v1/limits/pool/gpu/quarantine", {})
    assert quarantined.status_code == 200
    # The quarantine expired the one claim: held 0, as the list now says.
    assert quarantined.json()["limit"]["held"] == 0
    assert call(p.admin, "get", "/api/v1/limits").json()["limits"][0]["held"] == 0


def test_a_delete_with_if_none_match_is_refused_naming_the_header(personas: Personas) -> None:
    pool("gpu", slots=1)
    refused = call(personas.admin, "delete", "/api/v1/limits/pool/gpu", **{"If-None-Match": "*"})
    assert refused.status_code == 400
    assert refused.json()["field"] == "If-None-Match"
    assert Pool.objects.filter(name="gpu").exists()


def test_setting_and_clearing_a_queues_aging_at_once_is_refused(personas: Personas) -> None:
    p = personas
    call(p.admin, "put", "/api/v1/limits/queues/inbox", {"aging_seconds": 60})
    refused = call(
        p.admin, "put", "/api/v1/limits/queues/inbox", {"aging_seconds": 30, "clear_aging": True}
    )
    assert refused.status_code == 400
    assert "aging_seconds" in refused.json()["error"] and "clear_aging" in refused.json()["error"]
    assert QueueSettings.objects.get(queue="inbox").aging_seconds == 60


def test_verify_is_rationed_per_person(personas: Personas, settings: Any) -> None:
    settings.LEDGER_VERIFY_RATE_LIMIT = (1 / 30, 2)
    p = personas
    answers = [call(p.auditor, "get", "/api/v1/limits/verify") for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert int(answers[2]["Retry-After"]) > 0
    # Another person's allowance is their own.
    assert call(p.admin, "get", "/api/v1/limits/verify").status_code == 200


def test_verify_is_the_fleets_report_for_who_reads_every_ledger_row(personas: Personas) -> None:
    # Round 8: an owner without staff read every chain's row count and head, and the fleet's
    # grants and policies, which the ledger page's badge counts only for readers of all.
    p = personas
    refused = call(p.owner, "get", "/api/v1/limits/verify")
    assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
    assert "rows" not in refused.content.decode()
    assert call(p.auditor, "get", "/api/v1/limits/verify").json()["ok"] is True
