"""Named limits are declared with database constraints, and todos name them at intake on every
surface; an undeclared or malformed name is refused naming its field, and nothing is created."""

from __future__ import annotations

import io
import json
from typing import Any

import anyio
import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connection, transaction
from django.test import Client

from admission.limits import services as limit_services
from admission.limits.models import Pool, QueueSettings, RateLimit, TagLimit
from queues import services
from queues.models import Todo
from switchboard.core.errors import InvalidArgument
from tests.api.conftest import Api, human_token
from tests.conftest import FIXTURE, Personas
from tests.mcp.test_mcp_sdk import connect, error_of


def declare() -> None:
    Pool.objects.create(name="gpu", slots=2)
    TagLimit.objects.create(tag="vendor.a", limit=3)
    TagLimit.objects.create(tag="vendor-b", limit=1)
    RateLimit.objects.create(name="openai", base_limit=8, floor=2)


def refused_by_the_database(model: Any, **fields: Any) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        model.objects.create(**fields)


def test_the_database_refuses_declarations_that_break_an_invariant(db: None) -> None:
    refused_by_the_database(Pool, name="GPU", slots=1)
    refused_by_the_database(Pool, name="gpu\n", slots=1)
    refused_by_the_database(Pool, name="gpu", slots=-1)
    refused_by_the_database(Pool, name="gpu", slots=1, posture="maybe")
    refused_by_the_database(TagLimit, tag="_x", limit=1)
    refused_by_the_database(TagLimit, tag="x", limit=-1)
    refused_by_the_database(RateLimit, name="r", base_limit=0, floor=1)
    refused_by_the_database(RateLimit, name="r", base_limit=4, floor=5)
    refused_by_the_database(RateLimit, name="r", base_limit=4, floor=0)
    refused_by_the_database(RateLimit, name="r", base_limit=4, decay_window_seconds=0)
    refused_by_the_database(RateLimit, name="r", base_limit=4, decay_step=-1)
    refused_by_the_database(RateLimit, name="r", base_limit=4, decay_step=17)
    refused_by_the_database(QueueSettings, queue="in box")
    refused_by_the_database(QueueSettings, queue="inbox", aging_seconds=0)
    Pool.objects.create(name="quarantined", slots=0)  # zero slots is quarantine, not an error
    rate = RateLimit.objects.create(name="r", base_limit=4)
    assert (rate.floor, rate.decay_window_seconds, rate.decay_step, rate.posture) == (
        1,
        300,
        1,
        "enforce",
    )
    settings = QueueSettings.objects.create(queue="inbox")
    assert (settings.priority, settings.aging_seconds) == (0, None)


def test_the_database_refuses_a_todo_with_malformed_or_too_many_tags(personas: Personas) -> None:
    todo = services.todo_create(
        actor=personas.as_agent(), endpoint=personas.agent, queue="inbox", title="t"
    ).todo
    for bad in ([""], ["Upper"], ["ok", "has space"], [f"t{i}" for i in range(9)]):
        with pytest.raises(IntegrityError), transaction.atomic():
            Todo.objects.filter(pk=todo.pk).update(tags=bad)
    for column in ("pool", "rate_limit"):
        with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"UPDATE queues_todo SET {column} = 'Bad' WHERE id = %s", [todo.pk])


def test_a_todo_keeps_the_names_it_was_created_with_tags_sorted_and_unique(
    personas: Personas,
) -> None:
    declare()
    todo = services.todo_create(
        actor=personas.as_agent(),
        endpoint=personas.agent,
        queue="inbox",
        title="t",
        pool="gpu",
        tags=["vendor.a", "vendor-b", "vendor.a"],
        rate_limit="openai",
    ).todo
    todo.refresh_from_db()
    assert (todo.pool, todo.tags, todo.rate_limit) == ("gpu", ["vendor-b", "vendor.a"], "openai")


@pytest.mark.parametrize(
    ("names", "field"),
    [
        ({"pool": "cpu"}, "pool"),
        ({"tags": ["vendor.a", "vendor.z"]}, "tags"),
        ({"rate_limit": "anthropic"}, "rate_limit"),
        ({"pool": "gpu\n"}, "pool"),
        ({"tags": ["vendor.a", "Vendor"]}, "tags.1"),
        ({"tags": [f"t{i}" for i in range(9)]}, "tags"),
        ({"tags": "vendor.a"}, "tags"),
    ],
)
def test_intake_refuses_an_undeclared_or_malformed_name_naming_the_field(
    personas: Personas, names: dict[str, Any], field: str
) -> None:
    declare()
    with pytest.raises(InvalidArgument) as refused:
        services.todo_create(
            actor=personas.as_agent(), endpoint=personas.agent, queue="inbox", title="t", **names
        )
    assert refused.value.details["field"] == field
    assert not Todo.objects.exists()


def test_an_agent_names_limits_over_rest(personas: Personas, client: Client) -> None:
    declare()
    api = Api(client, personas.agent_token)
    made = api.verb(
        "create_todo", {"queue": "inbox", "title": "t", "pool": "gpu", "tags": ["vendor.a"]}
    )
    assert made.status_code == 200, made.content
    todo = made.json()["todo"]
    assert (todo["pool"], todo["tags"], todo["rate_limit"]) == ("gpu", ["vendor.a"], None)
    refused = api.verb("create_todo", {"queue": "inbox", "title": "t", "rate_limit": "nope"})
    assert refused.status_code == 400
    assert refused.json()["field"] == "rate_limit"
    malformed = api.verb("create_todo", {"queue": "inbox", "title": "t", "tags": ["A"]})
    assert malformed.status_code == 400 and malformed.json()["field"].startswith("tags")
    assert Todo.objects.count() == 1


def test_an_operator_names_limits_over_rest(personas: Personas) -> None:
    declare()
    api = Api(Client(), human_token(personas.owner))
    body = {"endpoint": "agent", "queue": "inbox", "title": "t", "pool": "gpu"}
    made = api.post("/api/v1/todos", {**body, "tags": ["vendor-b"], "rate_limit": "openai"})
    assert made.status_code == 201, made.content
    assert made.json()["todo"]["rate_limit"] == "openai"
    refused = api.post("/api/v1/todos", {**body, "pool": "tpu"})
    assert refused.status_code == 400 and refused.json()["field"] == "pool"
    assert Todo.objects.count() == 1


def test_the_shell_names_limits_and_is_refused_an_undeclared_one(personas: Personas) -> None:
    declare()
    out = io.StringIO()
    call_command(
        "todo", "push", "agent", "inbox", "--title", "t", "--pool", "gpu",
        "--tag", "vendor.a", "--tag", "vendor-b", "--rate-limit", "openai", "--json", stdout=out,
    )  # fmt: skip
    todo = json.loads(out.getvalue())["todo"]
    assert (todo["pool"], todo["tags"]) == ("gpu", ["vendor-b", "vendor.a"])
    err = io.StringIO()
    with pytest.raises(CommandError) as caught:
        call_command(
            "todo", "push", "agent", "inbox", "--title", "t", "--tag", "nope", "--json",
            stdout=io.StringIO(), stderr=err,
        )  # fmt: skip
    assert caught.value.returncode == 1 and json.loads(err.getvalue())["field"] == "tags"
    assert Todo.objects.count() == 1


def test_an_agent_names_limits_over_mcp(tx_personas: Personas, live_url: str) -> None:
    declare()
    url = f"{live_url}/mcp/{tx_personas.agent.slug}"
    seen: dict[str, Any] = {}

    async def job() -> None:
        async with connect(url, tx_personas.agent_token, "auto") as client:
            made = await client.call_tool(
                "create_todo", {"queue": "inbox", "title": "t", "pool": "gpu", "tags": ["vendor.a"]}
            )
            seen["made"] = made.structured_content
            refused = await client.call_tool(
                "create_todo", {"queue": "inbox", "title": "t", "pool": "nope"}
            )
            seen["refused"] = (refused.is_error, error_of(refused))

    anyio.run(job)
    assert seen["made"]["todo"]["pool"] == "gpu"
    is_error, content = seen["refused"]
    assert is_error is True and content["field"] == "pool"
    assert Todo.objects.count() == 1


def test_a_rate_limit_under_its_floor_is_refused_naming_what_the_request_sent(db: None) -> None:
    # Round 8: lowering base_limit under the floor in force named `floor`, not sent.
    limit_services.limit_set(actor=FIXTURE, kind="rate", name="api", base_limit=8, floor=3)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"base_limit": 2}, "base_limit"),
        ({"floor": 9}, "floor"),
        ({"base_limit": 2, "floor": 5}, "floor"),
    ]
    for given, blamed in cases:
        with pytest.raises(InvalidArgument) as refused:
            limit_services.limit_set(actor=FIXTURE, kind="rate", name="api", **given)
        assert refused.value.field == blamed, given
        assert "floor must not exceed base_limit" in refused.value.message
    assert (RateLimit.objects.get(name="api").base_limit, RateLimit.objects.get().floor) == (8, 3)
