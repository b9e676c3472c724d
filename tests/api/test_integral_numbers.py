"""JSON Schema's ``integer``, which the tools' input schemas and the OpenAPI declare, is any
number with no fraction: ``60.0`` as well as ``60``. The strict inputs refused every float, so a
client computing a lease or a limit in floating point was told "a valid integer" about one.
A fraction, a string and a boolean are still refused, naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from admission.limits.models import Pool
from admission.models import AdmissionPolicy
from tests.api.conftest import Api, human_token, mcp_tool
from tests.conftest import Personas, push


def test_an_agent_verb_takes_an_integer_written_with_a_fraction_of_zero(
    personas: Personas,
) -> None:
    p = personas
    api = Api(Client(), p.agent_token)
    [todo] = push(p, 1)
    assert api.verb("list_todos", {"limit": 1.0}).json()["todos"][0]["id"] == str(todo.id)
    claimed = api.verb("claim_next", {"lease_ttl_seconds": 60.0})
    assert claimed.status_code == 200, claimed.content
    assert claimed.json()["todo"]["id"] == str(todo.id)
    beat = api.verb("heartbeat", {"id": str(todo.id), "attempt": 1.0, "lease_ttl_seconds": 9e1})
    assert beat.status_code == 200, beat.content
    done = api.verb("complete", {"id": str(todo.id), "attempt": 1.0})
    assert done.json()["todo"]["state"] == "done"


def test_an_mcp_tool_takes_an_integer_written_with_a_fraction_of_zero(
    personas: Personas,
) -> None:
    p = personas
    [todo] = push(p, 1)
    result = mcp_tool(p.agent.slug, p.agent_token, "claim_next", {"lease_ttl_seconds": 60.0})
    assert result["isError"] is False, result
    assert result["structuredContent"]["todo"]["id"] == str(todo.id)


def test_operator_writes_take_an_integer_written_with_a_fraction_of_zero(
    personas: Personas,
) -> None:
    p = personas
    admin = Api(Client(), human_token(p.admin))
    made = admin.put("/api/v1/limits/pool/gpu", {"slots": 3.0})
    assert made.status_code == 200, made.content
    assert made.json()["slots"] == 3 and Pool.objects.get(name="gpu").slots == 3
    owner = Api(Client(), human_token(p.owner))
    budget = owner.put(
        f"/api/v1/admission/endpoint:{p.agent.slug}/inbox",
        {
            "max_in_flight": 2.0,
            "windows": [{"period": "hour", "limit": 5.0, "tz": "Europe/Berlin"}],
        },
    )
    assert budget.status_code == 200, budget.content
    policy = AdmissionPolicy.objects.get()
    assert policy.max_in_flight == 2
    assert policy.max_claims_per_window == 5


@pytest.mark.parametrize("value", [60.5, "60", True, 1e400])
def test_a_fraction_a_string_or_a_boolean_is_still_refused_naming_the_field(
    personas: Personas, value: Any
) -> None:
    p = personas
    api = Api(Client(), p.agent_token)
    push(p, 1)
    body = json.dumps({"lease_ttl_seconds": value}).replace("Infinity", "1e400")
    refused = api.post("/api/v1/agent/claim_next", raw=body)
    assert refused.status_code == 400, refused.content
    assert refused.json()["field"] == "lease_ttl_seconds"
    assert api.verb("list_todos", {}).json()["todos"][0]["state"] == "pending"
