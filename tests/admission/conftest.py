"""Helpers for the admission tests: budgets set through the service, clocks moved in SQL."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db.models import Sum
from django.utils import timezone

from admission import services, windows
from admission.models import AdmissionPolicy, AdmissionWindow
from queues.models import Attempt, Endpoint
from queues.selectors import ClaimInProgress
from switchboard.core import counters
from tests.conftest import Personas, every_attempt
from tests.mcp.conftest import js_clients, live_url  # noqa: F401  (for the MCP tests)


def budget(
    p: Personas,
    queue: str = "inbox",
    *,
    endpoint: Endpoint | None = None,
    max_in_flight: int | None = None,
    per: str | None = None,
    limit: int | None = None,
    tz: str = "UTC",
    start: str = "00:00",
    weekday: str | None = None,
    posture: str = "enforce",
) -> AdmissionPolicy:
    """Set a budget as the owner (a superuser for a foreign endpoint) through the service."""
    endpoint = endpoint or p.agent
    window: dict[str, Any] | None = None
    if per is not None:
        window = {"period": per, "tz": tz, "start": start}
        if weekday is not None:
            window["weekday"] = weekday
    actor = p.as_human(p.owner if endpoint.owner_id == p.owner.pk else p.admin)
    return services.policy_set(
        actor=actor,
        endpoint=endpoint,
        queue=queue,
        max_in_flight=max_in_flight,
        max_claims_per_window=limit,
        window=window,
        posture=posture,
    )


def window_total(policy: AdmissionPolicy, column: str = "used") -> int:
    """The current first window's ``used`` (or ``refused``) count: its shard rows summed
    (migration 0007; no one row holds a window's count)."""
    start = windows.window_start(policy, timezone.now())
    rows = AdmissionWindow.objects.filter(policy=policy, window_key="", window_start=start)
    return rows.aggregate(n=Sum(column))["n"] or 0


def over_cap(endpoint_id: Any, new: list[Attempt | ClaimInProgress], cap: int) -> list[str]:
    """Claims among ``new`` that found ``cap`` or more other claims open when they started."""
    spans = [(a.claimed_at, a.ended_at) for a in every_attempt(endpoint_id=endpoint_id)]
    over = []
    for attempt in new:
        t = attempt.claimed_at
        open_then = sum(1 for start, end in spans if start <= t and (end is None or end > t))
        if open_then > cap:
            over.append(f"{attempt.todo_id}#{attempt.number} with {open_then} open")
    return over


@pytest.fixture(autouse=True)
def _generous_policy_writes(settings: Any) -> None:
    """Tests write many budgets; the per-human write limit has its own test."""
    settings.POLICY_WRITE_RATE_LIMIT = (0, 0)


@pytest.fixture(autouse=True)
def _counters_start_clean() -> Iterator[None]:
    """Counter increments are buffered in-process and flushed by a thread; send the previous
    test's before wiping Redis, and this test's before the next one starts."""
    counters.flush()
    counters.client().flushdb()
    yield
    counters.flush()
