"""The agent verbs over REST: an agent holding only its token does its whole job, and every
refusal answers with the one error shape."""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any

from django.test import Client
from django.utils import timezone

from admission.models import AdmissionPolicy
from queues import services
from queues.models import QueuePause, Todo, TodoState
from switchboard.core import ratelimit
from switchboard.core.verbs import load_verbs
from tests.api.conftest import Api
from tests.conftest import FIXTURE, Personas, push

TODO_KEYS = {
    "id", "queue", "title", "kind", "payload", "state", "owner", "attempt", "max_attempts",
    "lease_expires_at", "next_retry_at", "dead_letter", "result", "created_at", "updated_at",
    "pool", "tags", "rate_limit", "grant",
}  # fmt: skip


def test_an_agent_does_its_whole_job_with_only_its_token(
    personas: Personas, agent_api: Api
) -> None:
    made = agent_api.verb(
        "create_todo", {"queue": "inbox", "title": "write it", "payload": {"n": 1}}
    )
    assert made.status_code == 200, made.content
    assert made.json()["created"] is True
    todo = made.json()["todo"]
    assert set(todo) == TODO_KEYS
    assert todo["state"] == "pending" and todo["payload"] == {"n": 1}
    assert todo["created_at"].endswith("Z")

    listed = agent_api.verb("list_todos", {"queue": "inbox"}).json()
    assert [t["id"] for t in listed["todos"]] == [todo["id"]]
    assert listed["paused_queues"] == [] and listed["next_cursor"] is None

    assert agent_api.verb("get_todo", {"id": todo["id"]}).json()["todo"]["title"] == "write it"

    claimed = agent_api.verb("claim_next", {"lease_ttl_seconds": 60}).json()
    assert claimed["empty"] is False and claimed["attempt"] == 1
    assert claimed["todo"]["id"] == todo["id"] and claimed["todo"]["state"] == "claimed"
    assert "lease_token" not in claimed and "admission" not in claimed

    beat = agent_api.verb("heartbeat", {"id": todo["id"], "lease_ttl_seconds": 600}).json()
    assert beat["todo"]["lease_expires_at"] > claimed["todo"]["lease_expires_at"]

    done = agent_api.verb("complete", {"id": todo["id"], "result": {"ok": True}}).json()
    assert done["todo"]["state"] == "done" and done["todo"]["result"] == {"ok": True}

    assert agent_api.verb("claim_next").json() == {"empty": True}


def test_claim_fail_and_release_by_id(personas: Personas, agent_api: Api) -> None:
    first, second = push(personas, 2)
    claimed = agent_api.verb("claim", {"id": str(first.id)}).json()
    assert claimed["todo"]["state"] == "claimed" and claimed["attempt"] == 1
    failed = agent_api.verb("fail", {"id": str(first.id), "error": "boom"}).json()["todo"]
    assert failed["state"] == "failed" and failed["next_retry_at"] is not None
    assert failed["dead_letter"] is False and failed["result"] == {"error": "boom"}

    agent_api.verb("claim", {"id": str(second.id)})
    released = agent_api.verb("release", {"id": str(second.id)}).json()["todo"]
    assert released["state"] == "pending" and released["owner"] == ""


def test_a_fenced_claim_needs_its_lease_token(personas: Personas, agent_api: Api) -> None:
    (todo,) = push(personas, 1)
    claimed = agent_api.verb("claim_next", {"require_fence": True}).json()
    token = claimed["lease_token"]
    assert token.startswith("sbl_")
    refused = agent_api.verb("complete", {"id": str(todo.id)})
    assert refused.status_code == 409 and refused.json()["code"] == "conflict"
    done = agent_api.verb("complete", {"id": str(todo.id), "lease_token": token})
    assert done.status_code == 200 and done.json()["todo"]["state"] == "done"


def test_an_idempotency_key_returns_the_live_todo(agent_api: Api) -> None:
    body = {"queue": "inbox", "title": "once", "idempotency_key": "k-1"}
    first = agent_api.verb("create_todo", body).json()
    again = agent_api.verb("create_todo", body).json()
    assert again["created"] is False and again["todo"]["id"] == first["todo"]["id"]
    assert again["differs"] == [] and "differs" not in first
    other = agent_api.verb("create_todo", {**body, "queue": "outbox", "tags": []}).json()
    assert other["todo"]["queue"] == "inbox" and other["differs"] == ["queue"]


def test_list_todos_pages_with_a_cursor_and_names_paused_queues(
    personas: Personas, agent_api: Api
) -> None:
    push(personas, 3)
    QueuePause.objects.create(
        queue="outbox", reason="draining", paused_by=personas.admin, paused_at=timezone.now()
    )
    page = agent_api.verb("list_todos", {"limit": 2}).json()
    assert len(page["todos"]) == 2 and page["next_cursor"]
    assert page["paused_queues"] == ["outbox"]
    rest = agent_api.verb("list_todos", {"limit": 2, "cursor": page["next_cursor"]}).json()
    assert len(rest["todos"]) == 1 and rest["next_cursor"] is None
    bad = agent_api.verb("list_todos", {"cursor": "nonsense"})
    assert bad.status_code == 400 and bad.json()["field"] == "cursor"


def test_an_empty_claim_next_names_the_pause_holding_its_work(
    personas: Personas, agent_api: Api
) -> None:
    from queues import pauses
    from queues.access import HumanActor

    push(personas, 2)
    pauses.queue_pause(actor=HumanActor(personas.pauser), queue="inbox", reason="draining")
    answer = agent_api.verb("claim_next", {})
    assert answer.status_code == 200
    body = answer.json()
    assert body["empty"] is True
    [held] = body["deferred"]
    assert (held["queue"], held["reason"], held["pending"]) == ("inbox", "queue_paused", 2)
    assert held["pause"]["reason"] == "draining" and held["pause"]["by"] == "paul"
    assert held["pause"]["at"].endswith("Z")


def test_an_unknown_token_is_unauthorized(client: Client, personas: Personas) -> None:
    response = Api(client, "sbk_not-a-real-token").verb("claim_next")
    assert response.status_code == 401
    assert response.json()["code"] == "unauthorized"
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_missing_token_is_unauthorized(client: Client, personas: Personas) -> None:
    response = Api(client).verb("claim_next")
    assert response.status_code == 401 and response.json()["code"] == "unauthorized"


def test_a_revoked_token_is_unauthorized(personas: Personas, agent_api: Api) -> None:
    services.endpoint_revoke(actor=FIXTURE, endpoint=personas.agent)
    response = agent_api.verb("list_todos")
    assert response.status_code == 401 and response.json()["code"] == "unauthorized"


def test_a_verb_outside_the_grant_is_forbidden_before_the_body_is_read(
    personas: Personas, client: Client
) -> None:
    _, token = services.endpoint_vend(
        actor=FIXTURE,
        owner=personas.owner,
        name="Reader",
        queues=["inbox"],
        verbs=["list_todos"],
        rps=0,
    )
    reader = Api(client, token)
    assert reader.verb("list_todos").status_code == 200
    refused = reader.verb("claim_next", raw="{not json")
    assert refused.status_code == 403
    assert refused.json()["code"] == "forbidden" and refused.json()["verb"] == "claim_next"


def test_a_queue_outside_the_scope_is_forbidden(personas: Personas, agent_api: Api) -> None:
    created = agent_api.verb("create_todo", {"queue": "elsewhere", "title": "x"})
    assert created.status_code == 403 and created.json()["code"] == "forbidden"
    claimed = agent_api.verb("claim_next", {"queue": "elsewhere"})
    assert claimed.status_code == 403 and claimed.json()["queue"] == "elsewhere"


def test_a_foreign_todo_is_not_found(personas: Personas, agent_api: Api) -> None:
    (theirs,) = push(personas, 1, endpoint=personas.foreign)
    for verb in ("get_todo", "claim", "heartbeat", "complete", "fail", "release"):
        response = agent_api.verb(verb, {"id": str(theirs.id)})
        assert response.status_code == 404, verb
        assert response.json()["code"] == "not_found"
    assert Todo.objects.get(pk=theirs.pk).state == TodoState.PENDING


def test_bad_bodies_are_invalid_arguments_naming_the_field(agent_api: Api) -> None:
    cases = [
        ("create_todo", {"queue": "inbox"}, "title"),
        ("create_todo", {"queue": "in box", "title": "x"}, "queue"),
        ("create_todo", {"queue": "inbox", "title": "x", "max_attempts": 0}, "max_attempts"),
        ("create_todo", {"queue": "inbox", "title": "x", "colour": "red"}, "colour"),
        ("list_todos", {"limit": "many"}, "limit"),
        ("list_todos", {"state": "sleeping"}, "state"),
        ("claim", {"id": "not-a-uuid"}, "id"),
        ("claim_next", {"lease_ttl_seconds": 0}, "lease_ttl_seconds"),
        ("get_todo", [1, 2], "body"),
    ]
    for verb, body, field in cases:
        response = agent_api.verb(verb, body)
        assert response.status_code == 400, (verb, body, response.content)
        error = response.json()
        assert error["code"] == "invalid_argument" and error["field"] == field, (verb, error)
        assert field in error["error"]


def test_malformed_json_is_an_invalid_argument(agent_api: Api) -> None:
    response = agent_api.verb("create_todo", raw='{"queue": ')
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_argument" and response.json()["field"] == "body"


def test_a_body_over_one_mebibyte_is_refused_naming_the_body(agent_api: Api) -> None:
    huge = json.dumps({"queue": "inbox", "title": "x", "payload": "a" * (1024 * 1024)})
    response = agent_api.verb("create_todo", raw=huge)
    assert response.status_code == 413
    error = response.json()
    assert error["code"] == "invalid_argument" and error["field"] == "body"
    assert error["limit"] == 1024 * 1024
    assert not Todo.objects.exists()


def test_over_the_endpoint_rate_it_answers_429_with_retry_after(
    personas: Personas, client: Client
) -> None:
    _, token = services.endpoint_vend(
        actor=FIXTURE, owner=personas.owner, name="Chatty", queues=["inbox"], rps=1, burst=2
    )
    chatty = Api(client, token)
    assert [chatty.verb("list_todos").status_code for _ in range(2)] == [200, 200]
    # One token a second refills; a burst of requests soon runs dry.
    answers = [chatty.verb("list_todos") for _ in range(10)]
    limited = next(a for a in answers if a.status_code == 429)
    assert limited.json()["code"] == "rate_limited"
    assert int(limited["Retry-After"]) >= 1


def test_a_burst_set_alone_is_the_endpoints_burst_at_the_fleets_rate(
    personas: Personas, client: Client, settings: Any
) -> None:
    """The endpoint shows the burst it was vended with; it was ignored without an rps of its own
    (the fleet's burst applied)."""
    settings.ENDPOINT_RATE_LIMIT = (0.001, 40)  # a slow fleet rate: nothing refills in the test
    endpoint, token = services.endpoint_vend(
        actor=FIXTURE, owner=personas.owner, name="Bursty", queues=["inbox"], burst=3
    )
    assert (endpoint.rate_limit_rps, endpoint.rate_limit_burst) == (None, 3)
    bursty = Api(client, token)
    answers = [bursty.verb("list_todos").status_code for _ in range(6)]
    assert answers == [200, 200, 200, 429, 429, 429]


def test_a_rate_that_never_refills_in_practice_still_limits(
    personas: Personas, client: Client
) -> None:
    # A burst, then nothing: the wait is as long as the bucket is kept (ten years), where such
    # a rate made the limiter's script fail and admit every request.
    _, token = services.endpoint_vend(
        actor=FIXTURE, owner=personas.owner, name="Once", queues=["inbox"], rps=1e-300, burst=1
    )
    once = Api(client, token)
    assert once.verb("list_todos").status_code == 200
    refused = once.verb("list_todos")
    assert refused.status_code == 429 and refused.json()["code"] == "rate_limited"
    assert int(refused["Retry-After"]) == ratelimit.LONGEST_MS // 1000


def _budget(personas: Personas, *, per_day: int) -> AdmissionPolicy:
    return AdmissionPolicy.objects.create(
        endpoint=personas.agent,
        queue="inbox",
        max_claims_per_window=per_day,
        window_period="day",
        window_tz="UTC",
        window_start="00:00",
        created_by=personas.owner,
        updated_by=personas.owner,
    )


def test_a_deferred_claim_is_409_with_retry_after_and_todos_show_why(
    personas: Personas, agent_api: Api
) -> None:
    _budget(personas, per_day=1)
    first, second = push(personas, 2)
    claimed = agent_api.verb("claim", {"id": str(first.id)}).json()
    assert claimed["admission"]["used"] == 1 and claimed["admission"]["remaining"] == 0

    refused = agent_api.verb("claim", {"id": str(second.id)})
    assert refused.status_code == 409
    error = refused.json()
    assert error["code"] == "deferred" and error["queue"] == "inbox"
    assert error["reason"] == "window_exhausted" and error["exact"] is True
    # Written as every answer writes an instant (it was "+00:00" in refusals only).
    assert (
        error["next_eligible_at"].endswith("Z") and error["window"]["window_resets_at"][-1] == "Z"
    )
    assert error["error"].endswith(error["next_eligible_at"])
    eligible = datetime.fromisoformat(error["next_eligible_at"])
    wait = math.ceil((eligible - timezone.now()).total_seconds())
    assert abs(int(refused["Retry-After"]) - wait) <= 1

    pending = agent_api.verb("get_todo", {"id": str(second.id)}).json()["todo"]
    assert pending["admission"]["state"] == "deferred"
    assert pending["admission"]["reason"] == "window_exhausted"
    assert pending["admission"]["next_eligible_at"].endswith("Z")

    empty = agent_api.verb("claim_next").json()
    assert empty["empty"] is True
    assert empty["deferred"][0]["queue"] == "inbox" and empty["deferred"][0]["pending"] == 1


def test_an_admitted_pending_todo_of_a_budgeted_queue_says_so(
    personas: Personas, agent_api: Api
) -> None:
    _budget(personas, per_day=5)
    (todo,) = push(personas, 1)
    shown = agent_api.verb("get_todo", {"id": str(todo.id)}).json()["todo"]
    assert shown["admission"] == {
        "state": "admitted",
        "reason": None,
        "next_eligible_at": None,
        "exact": True,
    }
    (plain,) = push(personas, 1, queue="outbox")
    assert "admission" not in agent_api.verb("get_todo", {"id": str(plain.id)}).json()["todo"]


def test_every_agent_verb_is_a_route_and_the_basic_grant_is_the_todo_verbs(
    client: Client,
) -> None:
    doc = client.get("/api/v1/openapi.json").json()
    todo_verbs = {
        "list_todos", "get_todo", "claim", "claim_next", "heartbeat", "complete", "fail",
        "release", "create_todo",
    }  # fmt: skip
    assert todo_verbs <= set(load_verbs())
    for name in load_verbs():
        operation = doc["paths"][f"/api/v1/agent/{name}"]["post"]
        assert {"200", "400", "401", "403", "413", "429"} <= set(operation["responses"])
