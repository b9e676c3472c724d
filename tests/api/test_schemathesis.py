"""Schemathesis over /api/v1/openapi.json against a live server, as an agent and as an operator.

Every operation gets schema-valid and schema-invalid requests. Nothing may answer 5xx, answer a
status the document does not declare, or answer a body that violates the declared schema; and
invalid requests must be refused (4xx). Bounded by a fixed number of examples per operation.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from pydantic import BaseModel
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from queues import services
from queues.models import LIMIT_NAME_RE, QUEUE_NAME_RE, check_limit_name, check_queue_name
from switchboard.api import EVENT_STREAM, EVENTS_PATH
from switchboard.core.errors import InvalidArgument
from tests.api.conftest import human_token
from tests.conftest import Personas, push

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
EXAMPLES = {schemathesis.GenerationMode.POSITIVE: 20, schemathesis.GenerationMode.NEGATIVE: 10}


def _fuzz_one(operation: Any, base_url: str, token: str, mode: Any, calls: list[int]) -> None:
    checks = [*CHECKS, negative_data_rejection] if mode.is_negative else CHECKS

    @settings(
        max_examples=EXAMPLES[mode],
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        response = case.call_and_validate(
            base_url=base_url, headers={"Authorization": f"Bearer {token}"}, checks=checks
        )
        calls.append(response.status_code)

    run()


def _fuzz(
    schema: Any, base_url: str, token: str, mode: schemathesis.GenerationMode, calls: list[int]
) -> list[str]:
    failures: list[str] = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result
        operation = result.ok()
        if _streams(operation):  # never ends: test_the_event_stream_is_as_the_document_says
            continue
        try:
            _fuzz_one(operation, base_url, token, mode, calls)
        except Exception as exc:  # collected, so one report names every failing operation
            failures.append(f"{operation.label} ({mode.value}): {exc}")
    return failures


@pytest.mark.parametrize("who", ["agent", "operator"])
def test_the_openapi_document_is_true(tx_personas: Personas, live_url: str, who: str) -> None:
    todos = push(tx_personas, 3)
    services.claim(actor=tx_personas.as_agent(), todo_id=todos[0].id)
    token = tx_personas.agent_token if who == "agent" else human_token(tx_personas.owner)
    schema = schemathesis.openapi.from_url(f"{live_url}/api/v1/openapi.json")
    failures: list[str] = []
    calls: list[int] = []
    for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
        failures += _fuzz(schema, live_url, token, mode, calls)
    assert not failures, "\n\n".join(failures)
    operations = len(list(schema.get_all_operations()))
    assert len(calls) >= 5 * operations, "schemathesis made too few requests to mean anything"
    # The identity got through somewhere (not every answer was 401).
    assert any(200 <= status < 300 for status in calls)


def _streams(operation: Any) -> bool:
    """Whether the operation's answer is an event stream (one that stays open)."""
    ok = operation.definition.raw.get("responses", {}).get("200", {})
    return EVENT_STREAM in ok.get("content", {})


def test_the_event_stream_is_as_the_document_says(tx_personas: Personas, live_url: str) -> None:
    """The agents' event stream, a Django view rather than a ninja route, is in the document
    (it was not), and its head, its refusals and its opening answer as the document says.
    Schemathesis leaves it out: a stream that stays open is no request/response pair."""
    document = httpx.get(f"{live_url}/api/v1/openapi.json").json()
    operation = document["paths"][EVENTS_PATH]["get"]
    assert operation["operationId"] == "agent_events"
    assert operation["security"] == [{"VerbAuth": []}]
    declared = {int(code) for code in operation["responses"]}
    assert {200, 400, 401, 429, 503} <= declared
    bearer = {"Authorization": f"Bearer {tx_personas.agent_token}"}
    head = httpx.head(f"{live_url}{EVENTS_PATH}", headers=bearer)
    assert head.status_code == 200
    assert head.headers["content-type"].startswith(EVENT_STREAM)
    for headers, params, status in [
        ({}, {}, 401),
        ({"Authorization": "Bearer sbk_nope"}, {}, 401),
        (bearer, {"since": "1"}, 400),
    ]:
        refused = httpx.get(f"{live_url}{EVENTS_PATH}", headers=headers, params=params)
        assert refused.status_code == status and status in declared
        assert set(refused.json()) >= {"error", "code"}
    with httpx.stream("GET", f"{live_url}{EVENTS_PATH}", headers=bearer, timeout=10) as opened:
        assert opened.status_code == 200
        assert opened.headers["content-type"].startswith(EVENT_STREAM)
        first = next(opened.iter_text())
        assert first.startswith("retry: ")


def test_the_document_gives_the_pattern_of_each_checked_path_parameter(client: Any) -> None:
    """A queue or a limit name in a path is checked against a pattern (400 naming the field);
    the document allowed any string, so schemathesis's "valid" names were refused (s43)."""
    document = client.get("/api/v1/openapi.json").json()
    found: dict[str, list[str]] = {"queue": [], "name": []}
    for operations in document["paths"].values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "path" and parameter["name"] in found:
                    found[parameter["name"]].append(parameter["schema"].get("pattern", ""))
    assert len(found["queue"]) >= 6 and set(found["queue"]) == {QUEUE_NAME_RE}
    assert len(found["name"]) >= 3 and set(found["name"]) == {LIMIT_NAME_RE}
    # The patterns as the services apply them: what one refuses, the other does.
    for name, ok in [("gpu", True), ("vendor.a", True), ("GPU", False), ("-x", False)]:
        assert bool(re.fullmatch(LIMIT_NAME_RE, name)) is ok
        if not ok:
            with pytest.raises(InvalidArgument):
                check_limit_name(name, field_name="name")
    for queue, ok in [("inbox", True), ("Batch:2", True), ("bad name", False), (".x", False)]:
        assert bool(re.fullmatch(QUEUE_NAME_RE, queue)) is ok
        if not ok:
            with pytest.raises(InvalidArgument):
                check_queue_name(queue)


def _app_models() -> dict[str, list[type[BaseModel]]]:
    """Every pydantic model the apps define, by class name."""
    seen: dict[str, list[type[BaseModel]]] = {}
    stack: list[type[BaseModel]] = [BaseModel]
    while stack:
        cls = stack.pop()
        for sub in cls.__subclasses__():
            stack.append(sub)
            if sub.__module__.split(".")[0] in ("queues", "admission", "switchboard"):
                seen.setdefault(sub.__name__, []).append(sub)
    return seen


def _shape(model: type[BaseModel]) -> Any:
    schema = model.model_json_schema()
    schema.pop("description", None)
    if schema.get("additionalProperties") is True:  # JSON Schema's default anyway
        del schema["additionalProperties"]
    return schema


def test_schemas_sharing_a_name_share_a_shape(client: Any) -> None:
    """The OpenAPI document keys schemas by class name: two different shapes under one name
    would make it lie about one of them."""
    client.get("/api/v1/openapi.json")  # every router is imported
    for name, models in _app_models().items():
        shapes = {json.dumps(_shape(m), sort_keys=True) for m in models}
        assert len(shapes) == 1, f"{name} is defined differently in " + ", ".join(
            sorted(m.__module__ for m in models)
        )
