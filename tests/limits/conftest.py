"""Helpers for the named-limit tests."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from admission.limits import services as limit_services
from admission.limits.models import Pool, RateLimit, TagLimit
from queues import services
from queues.access import SystemActor
from tests.conftest import Personas, push
from tests.mcp.conftest import js_clients, live_url  # noqa: F401  (a live server, the TS SDK)
from tests.web.conftest import budget

# Declared through the service, as every surface declares them: with their ledger row (a
# declaration the ledger never saw is a finding of ``ledger verify``: admission.limits.audit).
DECLARER = SystemActor(via="test")


def pool(name: str = "gpu", slots: int = 2, posture: str = "enforce") -> Pool:
    limit_services.limit_set(actor=DECLARER, kind="pool", name=name, slots=slots, posture=posture)
    return Pool.objects.get(name=name)


def tag(name: str, limit: int, posture: str = "enforce") -> TagLimit:
    limit_services.limit_set(actor=DECLARER, kind="tag", name=name, limit=limit, posture=posture)
    return TagLimit.objects.get(tag=name)


def rate(name: str, base_limit: int, **fields: Any) -> RateLimit:
    limit_services.limit_set(
        actor=DECLARER, kind="rate", name=name, base_limit=base_limit, **fields
    )
    return RateLimit.objects.get(name=name)


def push_named(p: Personas, n: int = 1, queue: str = "inbox", **names: Any) -> list[Any]:
    return push(p, n, queue=queue, **names)


def clear_of_a_minute_boundary(margin: int = 10) -> None:
    """Rate limits count per wall-clock minute: a test that claims several times waits out the
    last seconds of a minute, so all its claims land in one."""
    now = datetime.now(UTC)
    if now.second >= 60 - margin:
        time.sleep(60 - now.second - now.microsecond / 1e6 + 0.05)


NAMES: dict[str, Any] = {"pool": "gpu", "tags": ["vendor.a", "vendor.b"], "rate_limit": "openai"}


def everything_full(p: Personas) -> Any:
    """One claimed todo fills pool gpu (1 slot), tag vendor.a (enforce, 1), tag vendor.b (advise,
    1) and rate limit openai (1 a minute), not its queue's budget (5 in flight); returns a
    second todo naming the same limits, held by them."""
    clear_of_a_minute_boundary()
    budget(p, max_in_flight=5)
    pool("gpu", slots=1)
    tag("vendor.a", 1)
    tag("vendor.b", 1, posture="advise")
    rate("openai", base_limit=1)
    first, second = push(p, 2, **NAMES)
    services.claim(actor=p.as_agent(), todo_id=first.id, lease_ttl_seconds=600)
    return second
