"""A verb's answer is checked against a plain twin of its output model
(``switchboard.core.verbs.plain_model``): the same schema, the same JSON, ninja's wrapping
validator left out."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

import pytest
from django.test import Client
from ninja import Schema
from pydantic import BaseModel, ValidationError, field_validator

from queues import services
from queues.models import Todo
from queues.schemas import iso, model_time, todo_out
from switchboard.core import verbs
from tests.api.conftest import Api
from tests.conftest import Personas, push


@pytest.mark.parametrize("name", list(verbs.load_verbs()))
def test_every_verbs_twin_has_its_output_models_schema(name: str) -> None:
    spec = verbs.get(name)
    assert spec is not None
    twin = verbs.plain_model(spec.output)
    assert twin is not spec.output
    for mode in ("serialization", "validation"):
        assert twin.model_json_schema(mode=mode) == spec.output.model_json_schema(mode=mode)


def _as_before(spec: verbs.VerbSpec, result: dict[str, Any]) -> dict[str, Any]:
    """What render gave before the twin: the output model itself."""
    return spec.output.model_validate(result).model_dump(
        mode="json", by_alias=True, exclude_unset=True
    )


def test_the_hot_verbs_render_the_same_json_through_the_twin(
    personas: Personas, client: Client
) -> None:
    push(personas, 2)
    agent = Api(client, personas.agent_token)
    actor_results: list[tuple[str, dict[str, Any]]] = []
    claimed = agent.verb("claim_next", {"require_fence": True}).json()
    actor_results.append(("claim_next", claimed))
    done = agent.verb(
        "complete",
        {
            "id": claimed["todo"]["id"],
            "result": {"ok": [1, 2.5, None]},
            "lease_token": claimed["lease_token"],
        },
    ).json()
    actor_results.append(("complete", done))
    agent.verb("claim_next", {})
    actor_results.append(("claim_next", agent.verb("claim_next", {}).json()))  # empty
    assert actor_results[-1][1]["empty"] is True
    for name, answer in actor_results:
        spec = verbs.get(name)
        assert spec is not None
        # The answer as the handler gave it (the JSON is its own input): same bytes both ways.
        rendered = spec.render(answer)
        assert json.dumps(rendered) == json.dumps(_as_before(spec, answer)) == json.dumps(answer)
        # The REST body: the same JSON, written compactly in one pass.
        assert spec.render_json(answer) == _compact(rendered)


def _compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


# A todo as a verb answers it, with every awkward spelling its fields can hold (text beyond
# ASCII, quotes, backslashes, a tab, -0.0, big and exponent numbers); the MCP tests use it too.
AWKWARD_TODO: dict[str, Any] = {
    "id": "0b5c1f54-5d0e-4a43-9d5e-2f0a3f6f1c7e",
    "queue": "inbox",
    "title": 'café ☕ "quoted" \\ and a tab\t',
    "kind": "",
    "payload": {"nested": [1, 2.5, -0.0, 10**15, None, True, {"é": "ü"}]},
    "state": "done",
    "owner": "",
    "attempt": 1,
    "max_attempts": 3,
    "lease_expires_at": None,
    "next_retry_at": "2026-12-02T04:50:28.123456Z",
    "dead_letter": False,
    "result": {"ok": "☃", "big": 1e22},
    "created_at": "2026-12-02T04:50:28Z",
    "updated_at": "2026-12-02T04:50:28.000001Z",
    "pool": None,
    "tags": ["a", "b"],
    "rate_limit": None,
    "grant": None,
}


def test_the_json_text_is_renders_answer_written_compactly() -> None:
    """``render_json`` writes what ``render`` answers: every type of a todo's fields, text
    beyond ASCII escaped, keys left unset left out. Numbers are the same values; a float
    with an exponent below -4 is written without Python's padding (1.5e-7, not 1.5e-07)."""
    spec = verbs.get("complete")
    assert spec is not None
    for answer in ({"todo": AWKWARD_TODO}, {"todo": {**AWKWARD_TODO, "admission": None}}):
        rendered = spec.render(answer)
        assert spec.render_json(answer) == _compact(rendered)
        assert json.loads(spec.render_json(answer)) == rendered
    small = {"todo": {**AWKWARD_TODO, "result": {"small": [1.5e-7, 1e-5, 2.5e-300]}}}
    assert spec.render_json(small).count(b"1.5e-7,0.00001,2.5e-300") == 1
    assert json.loads(spec.render_json(small)) == spec.render(small)
    with pytest.raises(ValidationError):
        spec.render_json({"todo": {"id": "not a uuid"}})


def test_a_wrong_answer_is_still_refused() -> None:
    spec = verbs.get("complete")
    assert spec is not None
    with pytest.raises(ValidationError):
        spec.render({"todo": {"id": "not a uuid"}})


def test_a_model_with_validators_of_its_own_is_kept() -> None:
    class Inner(Schema):
        n: int

        @field_validator("n")
        @classmethod
        def positive(cls, value: int) -> int:
            if value < 0:
                raise ValueError("negative")
            return value

    class Outer(Schema):
        inner: Inner | None = None
        items: list[Inner] = []

    twin = verbs.plain_model(Outer)
    assert twin is not Outer and verbs.plain_model(Inner) is Inner
    with pytest.raises(ValidationError):
        twin.model_validate({"inner": {"n": -1}})
    with pytest.raises(ValidationError):
        twin.model_validate({"items": [{"n": -1}]})
    assert issubclass(twin, BaseModel)


@pytest.mark.parametrize(
    "when",
    [
        datetime(2026, 12, 2, 4, 50, 28, tzinfo=UTC),
        datetime(2026, 12, 2, 4, 50, 28, 1, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(2026, 12, 2, 4, 50, 28, 123456, tzinfo=ZoneInfo("UTC")),
        datetime(2026, 12, 2, 4, 50, 28, 120000, tzinfo=timezone(timedelta(hours=2))),
        datetime(2026, 12, 2, 4, 50, 28, tzinfo=timezone(timedelta(hours=-5, minutes=-30))),
    ],
)
def test_a_verbs_times_are_written_as_iso_writes_them(when: datetime) -> None:
    """The agent verbs hand their todos' times to the output model as ``model_time`` gives
    them (``todo_out(for_model=True)``: a UTC datetime as it is): the answer is the same bytes as with ``iso``'s text, in
    UTC with a ``Z`` whatever the datetime's own offset."""
    spec = verbs.get("complete")
    assert spec is not None
    times = ("lease_expires_at", "next_retry_at", "created_at", "updated_at")
    as_text = {"todo": {**AWKWARD_TODO, **dict.fromkeys(times, iso(when))}}
    as_given = {"todo": {**AWKWARD_TODO, **dict.fromkeys(times, model_time(when))}}
    assert spec.render_json(as_given) == spec.render_json(as_text)
    assert spec.render(as_given) == spec.render(as_text)
    assert spec.render(as_given)["todo"]["created_at"].endswith("Z")


def test_a_todo_for_the_model_renders_as_the_todo_every_surface_shows(
    personas: Personas,
) -> None:
    """``todo_out(for_model=True)`` (the agent verbs: the id and the UTC times as they are)
    renders as ``todo_out``'s text does, byte for byte, read back from the database or as a
    service returned it, claimed and done; through a union (claim_next) and not (complete)."""
    made = push(personas, 1)[0]
    claimed = services.claim_next(actor=personas.as_agent(personas.agent))
    assert isinstance(claimed, services.Claimed)
    done = services.complete(actor=personas.as_agent(personas.agent), todo_id=made.id)
    read = Todo.objects.get(pk=made.id)
    assert isinstance(read.id, UUID) and read.created_at.tzinfo is UTC
    for todo in (made, claimed.todo, done, read):
        for name, wrap in (
            ("claim_next", lambda t: {"empty": False, "todo": t, "attempt": 1}),
            ("complete", lambda t: {"todo": t}),
        ):
            spec = verbs.get(name)
            assert spec is not None
            as_text, as_given = wrap(todo_out(todo)), wrap(todo_out(todo, for_model=True))
            assert spec.render_json(as_given) == spec.render_json(as_text)
            assert spec.render(as_given) == spec.render(as_text)
