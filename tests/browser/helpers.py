"""Helpers for the browser tests: budgets and API calls against the live server."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import Page

from admission import services as admission_services
from admission.models import AdmissionPolicy
from tests.conftest import Personas, push

AXE = Axe()
BLOCKING = {"critical", "serious"}


def findings(page: Page) -> list[str]:
    """Critical and serious axe violations on the page, one line each (rule, impact, where)."""
    results: Any = AXE.run(page)
    out = []
    for violation in results.response["violations"]:
        if violation.get("impact") in BLOCKING:
            targets = [", ".join(node["target"]) for node in violation["nodes"][:3]]
            out.append(f"{violation['id']} ({violation['impact']}): {targets}")
    return out


def budget(
    p: Personas,
    queue: str = "inbox",
    *,
    max_in_flight: int | None = None,
    max_claims_per_window: int | None = None,
    tz: str = "America/Los_Angeles",
    posture: str = "enforce",
) -> AdmissionPolicy:
    """A budget on the owner's endpoint ``agent``, set through the service."""
    window = None
    if max_claims_per_window is not None:
        window = {"period": "day", "tz": tz, "start": "00:00"}
    return admission_services.policy_set(
        actor=p.as_human(),
        endpoint=p.agent,
        queue=queue,
        max_in_flight=max_in_flight,
        max_claims_per_window=max_claims_per_window,
        window=window,
        posture=posture,
    )


def api_post(base: str, path: str, token: str, body: dict[str, Any] | None = None) -> Any:
    """POST JSON to the live server's API with a bearer token (as an agent would)."""
    request = urllib.request.Request(
        base + path,
        data=json.dumps(body or {}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def small_fleet(p: Personas) -> dict[str, Any]:
    """A fleet with something in every condition, made through the services: pending work,
    a claim in progress (``claimed``, after an ended attempt of its own), a dead letter with a
    structured error, a paused queue, a budget used up, ledger rows."""
    from queues import pauses, services

    inbox = push(p, 4)
    push(p, 2, queue="outbox")
    push(p, 1, endpoint=p.agent2)
    agent = p.as_agent()
    services.claim(actor=agent, todo_id=inbox[0].id, claimant="worker-0")
    services.release(actor=agent, todo_id=inbox[0].id)
    services.claim(actor=agent, todo_id=inbox[0].id, claimant="worker-1")
    dead = push(p, 1, queue="outbox", max_attempts=1)[0]
    services.claim(actor=agent, todo_id=dead.id, claimant="worker-2")
    services.fail(
        actor=agent,
        todo_id=dead.id,
        error={"type": "TimeoutError", "traceback": 'File "agent.py", line 3\nTimeoutError'},
    )
    budget(p, "inbox", max_in_flight=1)
    pauses.queue_pause(actor=p.as_human(p.admin), queue="outbox", reason="upgrading the consumer")
    return {"todo": inbox[1], "claimed": inbox[0], "dead": dead}


def console_pages(p: Personas, fleet: dict[str, Any]) -> list[str]:
    """Every page of the console an operator reaches from the top bar and the board."""
    return [
        "/",
        "/queues",
        "/queues/inbox",
        f"/todos/{fleet['todo'].id}",
        f"/todos/{fleet['claimed'].id}",
        f"/todos/{fleet['dead'].id}",
        "/budgets/agent/inbox",
        "/budgets/agent/inbox/clear",
        "/ledger",
        "/prefs/tz",
        "/?state=dead_letter",
        "/todos/bulk/retry?state=dead_letter",
        "/todos/bulk/discard?queue=inbox",
        "/throughput",
        "/limits/occupancy",
        "/agents",
    ]
