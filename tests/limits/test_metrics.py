"""The named-limit series at /metrics: pool slots and claims held, tag claims held, a rate
limit's effective limit, and refusals and waivers counted by gate across processes (Redis)."""

from __future__ import annotations

from admission.limits.models import RateLimit
from admission.limits.services import limit_quarantine
from queues import services
from queues.services import Claimed, NothingClaimable
from tests.admission.test_metrics import scrape, series
from tests.conftest import Personas
from tests.limits.conftest import pool, push_named, tag


def gate_counts(name: str) -> dict[str, float]:
    return {dict(k)["gate"]: v for k, v in series(scrape(), name).items()}


def test_pool_tag_and_rate_series_and_the_refusal_and_waiver_counters(
    tx_personas: Personas,
) -> None:
    p = tx_personas
    refusals = gate_counts("switchboard_limit_refusals_total")
    waivers = gate_counts("switchboard_waivers_total")
    pool("gpu", slots=1)
    tag("vendor.a", 1, posture="advise")
    RateLimit.objects.create(name="openai", base_limit=8)
    push_named(p, 2, pool="gpu")
    push_named(p, 2, queue="outbox", tags=["vendor.a"], rate_limit="openai")
    assert isinstance(services.claim_next(actor=p.as_agent(), queue="inbox"), Claimed)
    assert isinstance(services.claim_next(actor=p.as_agent(), queue="inbox"), NothingClaimable)
    assert isinstance(services.claim_next(actor=p.as_agent(), queue="outbox"), Claimed)
    assert isinstance(services.claim_next(actor=p.as_agent(), queue="outbox"), Claimed)

    samples = scrape()
    assert series(samples, "switchboard_pool_slots") == {(("pool", "gpu"),): 1.0}
    assert series(samples, "switchboard_pool_held") == {(("pool", "gpu"),): 1.0}
    assert series(samples, "switchboard_tag_held") == {(("tag", "vendor.a"),): 2.0}
    assert series(samples, "switchboard_rate_effective_limit") == {(("rate_limit", "openai"),): 8.0}
    after = gate_counts("switchboard_limit_refusals_total")
    assert after["pool"] == refusals.get("pool", 0) + 1
    assert gate_counts("switchboard_waivers_total")["tags"] == waivers.get("tags", 0) + 1

    limit_quarantine(actor=p.as_human(p.admin), kind="pool", name="gpu")
    samples = scrape()
    assert series(samples, "switchboard_pool_slots") == {(("pool", "gpu"),): 0.0}
    assert series(samples, "switchboard_pool_held") == {(("pool", "gpu"),): 0.0}
