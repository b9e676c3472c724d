"""Helpers for the browser tests: budgets and API calls against the live server."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import Page

from admission import services as admission_services
from admission.models import AdmissionPolicy
from tests.conftest import FIXTURE, Personas, lapse, push

AXE = Axe()
# ms: how long the live board may take to show a change before a test fails. The expectations
# wait on the page's state and return as soon as it shows; the bound only ends a wait that will
# never succeed. Six seconds was too short on a loaded CI machine (a snapshot read, a render
# and an event through a server thread competing with the browser and the test for 2 cores).
LIVE = 30_000


def until(page: Page, predicate: str, message: str = "") -> None:
    """Wait until ``predicate`` (a function, run in the page) is true, at most ``LIVE``. Polled
    with evaluate: the console's Content-Security-Policy forbids the eval that
    wait_for_function uses."""
    deadline = time.monotonic() + LIVE / 1000
    while not page.evaluate(predicate):
        assert time.monotonic() < deadline, message or f"never true: {predicate}"
        page.wait_for_timeout(20)


def sideways_overflow(page: Page) -> int:
    """How many pixels the page is wider than the window (0 when it does not scroll sideways)."""
    return int(
        page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    )


def findings(page: Page, within: str | None = None) -> list[str]:
    """Every axe violation on the page, whatever its impact, one line each (rule, impact,
    where). Only critical and serious ones counted once; the moderate and minor ones this let
    through were a heading level skipped, two regions of one name, and blank column headers.

    ``within``: a CSS selector; only what it selects is checked (the part of a page an action
    changed, when the whole page was checked before it)."""
    results: Any = AXE.run(page, context=within)
    out = []
    for violation in results.response["violations"]:
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
    structured error, a paused queue, a budget used up, ledger rows; and the todos whose pages
    say what is not offered and why (a lapsed lease, a paused queue's, a revoked endpoint's)."""
    from queues import pauses, services

    inbox = push(p, 4)
    outbox = push(p, 2, queue="outbox")
    push(p, 1, endpoint=p.agent2)
    agent = p.as_agent()
    services.claim(actor=agent, todo_id=inbox[0].id, claimant="worker-0")
    services.release(actor=agent, todo_id=inbox[0].id)
    services.claim(actor=agent, todo_id=inbox[0].id, claimant="worker-1")
    services.claim(actor=agent, todo_id=inbox[2].id, claimant="worker-3")
    lapse(inbox[2])
    dead = push(p, 1, queue="outbox", max_attempts=1)[0]
    services.claim(actor=agent, todo_id=dead.id, claimant="worker-2")
    services.fail(
        actor=agent,
        todo_id=dead.id,
        error={"type": "TimeoutError", "traceback": 'File "agent.py", line 3\nTimeoutError'},
    )
    budget(p, "inbox", max_in_flight=1)
    pauses.queue_pause(actor=p.as_human(p.admin), queue="outbox", reason="upgrading the consumer")
    # Shown dimmed: a discarded todo and a revoked endpoint (its dead letter with it).
    services.todo_discard(actor=p.as_human(), todo_id=inbox[3].id)
    retired, _ = services.endpoint_vend(
        actor=p.as_human(), owner=p.owner, name="Retired", queues=["inbox"], rps=0
    )
    [orphan] = push(p, 1, endpoint=retired)
    services.endpoint_revoke(actor=p.as_human(), endpoint=retired)
    return {
        "todo": inbox[1],
        "claimed": inbox[0],
        "dead": dead,
        "lapsed": inbox[2],
        "paused": outbox[0],
        "orphan": orphan,
    }


def console_pages(p: Personas, fleet: dict[str, Any]) -> list[str]:
    """Every page of the console an operator reaches from the top bar and the board."""
    return [
        "/",
        "/queues",
        "/queues/inbox",
        f"/todos/{fleet['todo'].id}",
        f"/todos/{fleet['claimed'].id}",
        f"/todos/{fleet['dead'].id}",
        f"/todos/{fleet['lapsed'].id}",
        f"/todos/{fleet['paused'].id}",
        f"/todos/{fleet['orphan'].id}",
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


LONG_QUEUE = "q" + "x" * 63  # the longest queue name
LONG_SLUG = "s" + "y" * 62  # the longest endpoint slug


def long_fleet(p: Personas) -> dict[str, Any]:
    """Every name and text at its longest, with no space to break at: a 64-character queue,
    pool, rate limit and eight tags, a 63-character slug, a 500-character title, a 200-character
    claimant, an error with lines of thousands, three stacked windows in a long zone name, a
    500-character pause reason. Made through the services, as agents and operators would."""
    from admission.limits import services as limit_services
    from queues import pauses, services

    endpoint, _ = services.endpoint_vend(
        actor=FIXTURE,
        owner=p.owner,
        name="N" * 200,
        queues=[LONG_QUEUE, "inbox"],
        rps=0,
        slug=LONG_SLUG,
    )
    actor = p.as_human(p.admin)
    pool, rate = "p" + "o" * 63, "r" + "a" * 63
    tags = [f"t{i}" + "a" * 62 for i in range(8)]
    limit_services.limit_set(actor=actor, kind="pool", name=pool, slots=1)
    limit_services.limit_set(actor=actor, kind="rate", name=rate, base_limit=5)
    for tag in tags:
        limit_services.limit_set(actor=actor, kind="tag", name=tag, limit=1)
    agent = p.as_agent(endpoint)
    todos = [
        services.todo_create(
            actor=agent,
            endpoint=endpoint,
            queue=LONG_QUEUE,
            title="W" * 500,
            kind="K" * 100,
            payload={"k" * 300: "v" * 3000},
            idempotency_key=f"{i}" + "i" * 199,
            pool=pool,
            tags=tags,
            rate_limit=rate,
        ).todo
        for i in range(3)
    ]
    services.claim(actor=agent, todo_id=todos[0].id, claimant="c" * 200)
    services.fail(
        actor=agent, todo_id=todos[0].id, error={"e" * 200: "x" * 5000, "traceback": "T" * 5000}
    )
    zone = "America/Argentina/ComodRivadavia"
    admission_services.policy_set(
        actor=actor,
        endpoint=endpoint,
        queue=LONG_QUEUE,
        max_in_flight=1,
        max_claims_per_window=None,
        window=None,
        windows=[
            {"limit": 100, "period": "week", "tz": zone, "start": "00:00", "weekday": "Mon"},
            {"limit": 1000, "period": "day", "tz": zone, "start": "00:00"},
        ],
    )
    pauses.queue_pause(actor=actor, queue=LONG_QUEUE, reason="R" * 500, create=True)
    return {"failed": todos[0], "pending": todos[1]}


def long_pages(fleet: dict[str, Any]) -> list[str]:
    """The pages that show ``long_fleet``'s names and texts."""
    q, slug = LONG_QUEUE, LONG_SLUG
    return [
        "/",
        f"/?queue={q}",
        f"/?q={'W' * 500}",
        "/queues",
        f"/queues/{q}",
        f"/todos/{fleet['failed'].id}",
        f"/todos/{fleet['pending'].id}",
        f"/budgets/{slug}/{q}",
        f"/budgets/{slug}/{q}/clear",
        "/ledger",
        f"/ledger?queue={q}",
        f"/todos/bulk/retry?queue={q}",
        f"/todos/bulk/discard?queue={q}",
        "/throughput",
        "/limits/occupancy",
        "/agents",
    ]
