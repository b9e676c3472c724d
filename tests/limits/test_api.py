"""The operators' limits API: list with occupancy, set, delete; the same service and shapes as
the CLI, field-named refusals, writes only with the limits change permission."""

from __future__ import annotations

import json
from typing import Any

import anyio
from django.test import Client

from admission.limits import services as limit_services
from admission.limits.models import Pool
from queues import services
from tests.api.conftest import Api, human_token
from tests.conftest import Personas, push
from tests.limits.conftest import pool, tag
from tests.mcp.test_mcp_sdk import connect


def put(user: Any, path: str, body: Any) -> Any:
    token = human_token(user)
    return Client().put(
        path,
        json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )


def delete(user: Any, path: str) -> Any:
    return Client().delete(path, headers={"Authorization": f"Bearer {human_token(user)}"})


def test_the_list_shows_each_limit_and_how_full_it_is(personas: Personas) -> None:
    pool("gpu", slots=2)
    tag("vendor.a", 3, posture="advise")
    [todo] = push(personas, 1, pool="gpu", tags=["vendor.a"])
    services.claim(actor=personas.as_agent(), todo_id=todo.id)
    token = human_token(personas.auditor)
    listed = Client().get("/api/v1/limits", headers={"Authorization": f"Bearer {token}"}).json()
    gpu = {"kind": "pool", "name": "gpu", "slots": 2, "posture": "enforce"}
    vendor = {"kind": "tag", "name": "vendor.a", "limit": 3, "posture": "advise"}
    assert listed["limits"] == [
        gpu
        | {"held": 1, "version": limit_services.limit_version(gpu)}
        | dict.fromkeys(["limit", "base_limit", "floor", "decay_window_seconds", "decay_step"])
        | dict.fromkeys(["effective_limit", "observations", "used_this_minute"]),
        vendor
        | {"held": 1, "version": limit_services.limit_version(vendor)}
        | dict.fromkeys(["slots", "base_limit", "floor", "decay_window_seconds", "decay_step"])
        | dict.fromkeys(["effective_limit", "observations", "used_this_minute"]),
    ]


def test_a_superuser_sets_and_deletes_a_limit(personas: Personas) -> None:
    made = put(personas.admin, "/api/v1/limits/rate/openai", {"base_limit": 60})
    assert made.status_code == 200, made.content
    assert made.json()["floor"] == 1 and made.json()["decay_window_seconds"] == 300
    assert made.json()["decay_step"] == 1
    stepped = put(personas.admin, "/api/v1/limits/rate/openai", {"decay_step": 2})
    assert stepped.status_code == 200 and stepped.json()["decay_step"] == 2
    refused = put(personas.admin, "/api/v1/limits/rate/openai", {"decay_step": -1})
    assert refused.status_code == 400 and "decay_step" in json.dumps(refused.json())
    changed = put(personas.admin, "/api/v1/limits/rate/openai", {"posture": "advise"})
    assert changed.json()["base_limit"] == 60 and changed.json()["posture"] == "advise"
    deleted = delete(personas.admin, "/api/v1/limits/rate/openai")
    assert deleted.status_code == 204 and not deleted.content
    assert "Content-Type" not in deleted.headers  # no body, so no type (it said text/html)


def test_bad_input_is_refused_naming_the_field(personas: Personas) -> None:
    cases = [
        ("/api/v1/limits/pool/gpu", {"slots": "3"}, "slots"),
        ("/api/v1/limits/pool/gpu", {"slots": 3, "color": "red"}, "color"),
        ("/api/v1/limits/pool/gpu", {"slots": 3, "limit": 2}, "limit"),
        ("/api/v1/limits/shelf/gpu", {"slots": 3}, "kind"),
        ("/api/v1/limits/pool/GPU", {"slots": 3}, "name"),
        ("/api/v1/limits/pool/gpu", {"slots": 3, "posture": "maybe"}, "posture"),
    ]
    for path, body, field in cases:
        refused = put(personas.admin, path, body)
        assert refused.status_code == 400, (body, refused.content)
        assert field in json.dumps(refused.json()), (body, refused.json())
    assert not Pool.objects.exists()


def test_an_owner_or_auditor_is_forbidden_to_change_a_limit(personas: Personas) -> None:
    for user in (personas.owner, personas.auditor):
        assert put(user, "/api/v1/limits/pool/gpu", {"slots": 1}).status_code == 403
    pool("gpu", slots=1)
    assert delete(personas.owner, "/api/v1/limits/pool/gpu").status_code == 403
    assert Pool.objects.filter(name="gpu").exists()


def test_an_agent_reads_limits_status_over_rest_on_its_drain_grant(personas: Personas) -> None:
    pool("gpu", slots=2)
    body = Api(Client(), personas.agent_token).verb("limits_status", {}).json()
    assert [(x["name"], x["slots"], x["held"]) for x in body["limits"]] == [("gpu", 2, 0)]


def test_an_agent_reads_limits_status_over_mcp(tx_personas: Personas, live_url: str) -> None:
    pool("gpu", slots=2)
    seen: dict[str, Any] = {}

    async def job() -> None:
        url = f"{live_url}/mcp/{tx_personas.agent.slug}"
        async with connect(url, tx_personas.agent_token, "auto") as client:
            seen["tools"] = {t.name for t in (await client.list_tools()).tools}
            seen["status"] = (await client.call_tool("limits_status", {})).structured_content

    anyio.run(job)
    assert "limits_status" in seen["tools"]
    assert seen["status"]["limits"][0]["name"] == "gpu"


def post(user: Any, path: str) -> Any:
    return Client().post(
        path,
        "{}",
        content_type="application/json",
        headers={"Authorization": f"Bearer {human_token(user)}"},
    )


def get(user: Any, path: str) -> Any:
    return Client().get(path, headers={"Authorization": f"Bearer {human_token(user)}"})


def test_an_admin_quarantines_a_pool_over_rest_and_an_auditor_may_not(personas: Personas) -> None:
    pool("gpu", slots=3)
    [todo, _] = push(personas, 2, pool="gpu")
    services.claim(actor=personas.as_agent(), todo_id=todo.id)
    refused = post(personas.auditor, "/api/v1/limits/pool/gpu/quarantine")
    assert refused.status_code == 403 and Pool.objects.get().slots == 3
    unknown = post(personas.admin, "/api/v1/limits/pool/cpu/quarantine")
    assert unknown.status_code == 404 and unknown.json()["field"] == "name"
    done = post(personas.admin, "/api/v1/limits/pool/gpu/quarantine")
    assert done.status_code == 200
    assert [e["todo"] for e in done.json()["manifest"]["expired"]] == [str(todo.id)]
    assert done.json()["limit"]["slots"] == 0
    status = get(personas.auditor, "/api/v1/limits/status").json()
    assert status["quarantines"] == {"in_force": ["pool:gpu"], "recorded": 1}
    report = get(personas.auditor, "/api/v1/limits/verify").json()
    assert report["ok"] is True and report["grants"] == 1


def test_queue_settings_over_rest_name_a_bad_field_and_change_nothing(personas: Personas) -> None:
    bad = put(personas.admin, "/api/v1/limits/queues/inbox", {"aging_seconds": 0})
    assert bad.status_code == 400 and bad.json()["field"] == "aging_seconds"
    assert put(personas.auditor, "/api/v1/limits/queues/inbox", {"priority": 2}).status_code == 403
    ok = put(personas.admin, "/api/v1/limits/queues/inbox", {"priority": 2, "aging_seconds": 60})
    assert ok.status_code == 200
    version = ok.json()["version"]
    assert ok.json() == {"queue": "inbox", "priority": 2, "aging_seconds": 60, "version": version}
    status = get(personas.owner, "/api/v1/limits/status").json()
    assert status["queues"] == [
        {"queue": "inbox", "priority": 2, "aging_seconds": 60, "version": version}
    ]


def test_the_document_states_the_bounds_the_service_checks(personas: Personas) -> None:
    # A client reading the document learns each number's range, where it had only "integer";
    # and a rate limit, which nothing holds, is not offered for quarantine.
    document = Client().get("/api/v1/openapi.json").json()
    schemas = document["components"]["schemas"]

    def bounds(model: str, field: str) -> tuple[int, int]:
        number = next(s for s in schemas[model]["properties"][field]["anyOf"] if "minimum" in s)
        return number["minimum"], number["maximum"]

    for kind in limit_services.KINDS.values():
        for field, lowest, _ in kind.numbers:
            highest = limit_services._HIGHEST.get(field, limit_services.MAX_LIMIT)
            assert bounds("LimitIn", field) == (lowest, highest), field
            over = put(personas.admin, f"/api/v1/limits/{kind.name}/n", {field: highest + 1})
            under = put(personas.admin, f"/api/v1/limits/{kind.name}/n", {field: lowest - 1})
            for refused in (over, under):
                assert refused.status_code == 400 and refused.json()["field"] == field
    assert bounds("QueueSettingsIn", "priority") == (-1_000_000, 1_000_000)
    assert bounds("QueueSettingsIn", "aging_seconds") == (1, 86_400)
    quarantine = document["paths"]["/api/v1/limits/{kind}/{name}/quarantine"]["post"]
    kind_parameter = next(p for p in quarantine["parameters"] if p["name"] == "kind")
    assert kind_parameter["schema"]["enum"] == ["pool", "tag"]
    refused = post(personas.admin, "/api/v1/limits/rate/r/quarantine")
    assert refused.status_code == 400 and refused.json()["field"] == "kind"
    assert not Pool.objects.exists()
