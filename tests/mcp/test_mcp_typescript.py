"""The TypeScript MCP SDK (the client most agent hosts embed) against a live server.

It negotiates 2025-11-25 and validates every tool result against the tool's output schema, error
results included, so these tests show an agent on it receives each refusal as the API's error
object instead of an exception from its own SDK.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from admission import selectors as admission_selectors
from admission import services as admission_services
from admission.limits import services as limit_services
from queues import pauses, selectors, services
from queues.models import Todo, TodoState
from switchboard.ledger.models import LedgerEntry, LedgerKind
from tests.conftest import FIXTURE, Personas, push, self_budgeting
from tests.limits.conftest import everything_full, pool
from tests.mcp.conftest import NODE


def run_agent(js: Path, url: str, token: str, calls: list[Any]) -> dict[str, Any]:
    env = {**os.environ, "MCP_URL": url, "MCP_TOKEN": token, "MCP_CALLS": json.dumps(calls)}
    done = subprocess.run(
        [NODE, str(js / "agent.mjs")], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    assert "failed" not in report, report
    return report


def test_a_typescript_agent_works_and_reads_every_refusal(
    tx_personas: Personas, live_url: str, js_clients: Path
) -> None:
    (theirs,) = push(tx_personas, 1, endpoint=tx_personas.foreign)
    calls = [
        ["create_todo", {"queue": "inbox", "title": "from typescript"}],
        ["claim_next", {"lease_ttl_seconds": 60}],
        ["complete", {"id": {"$todo": 1}, "result": {"ok": True}}],
        ["complete", {"id": {"$todo": 1}}],
        ["get_todo", {"id": str(theirs.id)}],
        ["create_todo", {"queue": "inbox"}],
        ["create_todo", {"queue": "elsewhere", "title": "out of scope"}],
    ]
    report = run_agent(
        js_clients, f"{live_url}/mcp/{tx_personas.agent.slug}", tx_personas.agent_token, calls
    )

    assert report["protocolVersion"] == "2025-11-25" and report["server"] == "switchboard"
    assert all(tool["outputSchema"] for tool in report["tools"])
    # The SDK parsed each tool's annotations (its schema for them): what a host reads.
    hints = {tool["name"]: tool["annotations"] for tool in report["tools"]}
    assert hints["get_todo"]["readOnlyHint"] is True
    assert hints["claim_next"]["readOnlyHint"] is False
    assert hints["claim_next"]["destructiveHint"] is False
    made, claimed, done, again, foreign, invalid, scope = report["calls"]
    assert made["isError"] is False and made["structuredContent"]["created"] is True
    assert claimed["structuredContent"]["todo"]["id"] == made["structuredContent"]["todo"]["id"]
    assert done["structuredContent"]["todo"]["state"] == "done"
    for refused, code in (
        (again, "conflict"),
        (foreign, "not_found"),
        (invalid, "invalid_argument"),
        (scope, "forbidden"),
    ):
        assert "thrown" not in refused, refused
        assert refused["isError"] is True and refused["text"]["code"] == code, refused
    assert invalid["text"]["field"] == "title"
    # The second complete: the claim had ended, said with a reason the agent can branch on.
    assert (again["text"]["reason"], again["text"]["state"]) == ("not_claimed", "done")
    mine = Todo.objects.get(endpoint=tx_personas.agent)
    assert mine.state == TodoState.DONE and mine.result == {"ok": True}


def test_the_typescript_sdk_accepts_the_answers_that_say_why_work_waits(
    tx_personas: Personas, live_url: str, js_clients: Path
) -> None:
    """Shapes this session added to tools' structured content, each checked by the SDK against
    the tool's output schema: an empty claim_next's queue_paused entry (with its pause) and a
    create's differs."""
    p = tx_personas
    push(p, 2, queue="outbox")
    pauses.queue_pause(actor=p.as_human(p.admin), queue="outbox", reason="draining")
    # The live server is a process of its own: it learns paused names within the period it
    # keeps them (queues.selectors.paused_names; a local pause tells only its own process).
    time.sleep(selectors.PAUSED_NAMES_SECONDS + 0.2)
    calls = [
        ["claim_next", {"queue": "outbox"}],
        ["create_todo", {"queue": "inbox", "title": "once", "idempotency_key": "k-ts"}],
        ["create_todo", {"queue": "inbox", "title": "other", "idempotency_key": "k-ts"}],
    ]
    report = run_agent(js_clients, f"{live_url}/mcp/{p.agent.slug}", p.agent_token, calls)
    for call in report["calls"]:
        assert "thrown" not in call and call["isError"] is False, call
    empty, made, reused = (call["structuredContent"] for call in report["calls"])
    [held] = empty["deferred"]
    assert empty["empty"] is True
    assert (held["reason"], held["pending"], held["pause"]["reason"]) == (
        "queue_paused",
        2,
        "draining",
    )
    assert made["created"] is True and "differs" not in made
    assert reused["created"] is False and reused["differs"] == ["title"]
    assert reused["todo"]["id"] == made["todo"]["id"]


def test_a_typescript_agent_lists_and_reads_its_todos_as_resources(
    tx_personas: Personas, live_url: str, js_clients: Path
) -> None:
    (todo,) = push(tx_personas, 1)
    report = run_agent(
        js_clients,
        f"{live_url}/mcp/{tx_personas.agent.slug}",
        tx_personas.agent_token,
        [["$resources", {}]],
    )
    [resources] = report["calls"]
    assert "thrown" not in resources, resources
    uri = f"switchboard://todos/{todo.id}"
    assert resources["templates"] == ["switchboard://todos/{id}"]
    assert resources["uris"] == [uri]
    first = resources["first"]
    assert (first["uri"], first["mimeType"]) == (uri, "application/json")
    assert first["text"]["todo"]["id"] == str(todo.id)


def test_a_typescript_agent_connects_to_an_endpoint_limited_to_one_request_a_second(
    tx_personas: Personas, live_url: str, js_clients: Path
) -> None:
    endpoint, token = services.endpoint_vend(
        actor=FIXTURE, owner=tx_personas.owner, name="Slow", queues=["inbox"], rps=1, burst=1
    )
    report = run_agent(js_clients, f"{live_url}/mcp/{endpoint.slug}", token, [["claim_next", {}]])
    assert report["protocolVersion"] == "2025-11-25"
    assert report["calls"] == [
        {"name": "claim_next", "isError": False, "structuredContent": {"empty": True},
         "text": {"empty": True}}
    ]  # fmt: skip


def test_the_typescript_sdk_accepts_get_todo_with_an_explain(
    tx_personas: Personas, live_url: str, js_clients: Path
) -> None:
    held = everything_full(tx_personas)
    [free] = push(tx_personas, 1)
    calls = [["get_todo", {"id": str(held.id)}], ["get_todo", {"id": str(free.id)}]]
    report = run_agent(
        js_clients, f"{live_url}/mcp/{tx_personas.agent.slug}", tx_personas.agent_token, calls
    )
    held_call, free_call = report["calls"]
    for call in (held_call, free_call):
        assert "thrown" not in call and call["isError"] is False, json.dumps(call)
    assert held_call["structuredContent"]["todo"]["explain"]["binding"] == "pool"
    assert free_call["structuredContent"]["todo"]["explain"]["binding"] == "none"


def test_the_typescript_sdk_accepts_a_claims_grant_and_get_todo_shows_the_same_one(
    tx_personas: Personas, live_url: str, js_clients: Path
) -> None:
    pool("gpu", slots=2)
    [todo] = push(tx_personas, 1, pool="gpu")
    calls = [["claim_next", {"lease_ttl_seconds": 60}], ["get_todo", {"id": str(todo.id)}]]
    report = run_agent(
        js_clients, f"{live_url}/mcp/{tx_personas.agent.slug}", tx_personas.agent_token, calls
    )
    claimed, got = report["calls"]
    for call in (claimed, got):
        assert "thrown" not in call and call["isError"] is False, json.dumps(call)
    [grant] = LedgerEntry.objects.filter(kind=LedgerKind.LIMITS_GRANT)
    assert claimed["structuredContent"]["grant"] == grant.entry_hash
    assert claimed["structuredContent"]["todo"]["grant"] == grant.entry_hash
    assert got["structuredContent"]["todo"]["grant"] == grant.entry_hash


def test_the_typescript_sdk_accepts_the_budget_and_limit_versions(
    tx_personas: Personas, live_url: str, js_clients: Path
) -> None:
    # Budgets and limits gained a required "version" in the outputs of admission_status,
    # limits_status and set_admission_policy: the SDK checks each result against its schema.
    p = tx_personas
    endpoint, token = self_budgeting(p, "Budgeter")
    budget = admission_services.policy_set(
        actor=p.as_human(), endpoint=endpoint, queue="inbox", max_in_flight=2,
        max_claims_per_window=None, window=None,
    )  # fmt: skip
    gpu = pool("gpu", slots=2)
    calls = [
        ["admission_status", {"queue": "inbox"}],
        ["limits_status", {}],
        ["set_admission_policy", {"queue": "inbox", "policy": {"max_in_flight": 3}}],
    ]
    report = run_agent(js_clients, f"{live_url}/mcp/{endpoint.slug}", token, calls)
    status, limits, changed = report["calls"]
    for call in report["calls"]:
        assert "thrown" not in call and call["isError"] is False, call
    (queue,) = status["structuredContent"]["queues"]
    assert queue["policy"]["version"] == admission_selectors.policy_version(budget)
    (limit,) = limits["structuredContent"]["limits"]
    shape = limit_services.as_dict(limit_services.KINDS["pool"], gpu)
    assert limit["version"] == limit_services.limit_version(shape)
    budget.refresh_from_db()
    assert changed["structuredContent"]["policy"]["version"] == (
        admission_selectors.policy_version(budget)
    )
    assert changed["structuredContent"]["policy"]["version"] != queue["policy"]["version"]


def test_the_typescript_sdk_writes_a_budget_over_the_version_it_read(
    tx_personas: Personas, live_url: str, js_clients: Path
) -> None:
    # if_version is in the tool's input schema; a write over a moved version is an error
    # result (no structuredContent), which the SDK hands back rather than throws.
    p = tx_personas
    endpoint, token = self_budgeting(p, "Careful")
    budget = admission_services.policy_set(
        actor=p.as_human(), endpoint=endpoint, queue="inbox", max_in_flight=2,
        max_claims_per_window=None, window=None,
    )  # fmt: skip
    read = admission_selectors.policy_version(budget)
    calls = [
        [
            "set_admission_policy",
            {"queue": "inbox", "policy": {"max_in_flight": 3}, "if_version": read},
        ],
        [
            "set_admission_policy",
            {"queue": "inbox", "policy": {"max_in_flight": 4}, "if_version": read},
        ],
        ["clear_admission_policy", {"queue": "inbox", "if_version": read}],
    ]
    report = run_agent(js_clients, f"{live_url}/mcp/{endpoint.slug}", token, calls)
    written, stale, clear = report["calls"]
    for call in report["calls"]:
        assert "thrown" not in call, call
    assert written["isError"] is False
    now = written["structuredContent"]["policy"]["version"]
    for refused in (stale, clear):
        assert refused["isError"] is True and refused["structuredContent"] is None
        answer = refused["text"]
        assert answer["code"] == "precondition_failed" and answer["version"] == now
    budget.refresh_from_db()
    assert budget.max_in_flight == 3
