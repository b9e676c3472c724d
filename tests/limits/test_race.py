"""Pools and tags under real concurrency: processes and threads racing real connections."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings

from queues import services
from queues.models import Todo, TodoState
from queues.services import Claimed
from tests.admission.conftest import budget
from tests.admission.racer import race
from tests.conftest import Personas, database_url, push, run_threads
from tests.limits.conftest import pool, push_named, tag


def test_thirty_racers_in_two_processes_never_hold_more_than_an_enforced_pool_or_tag(
    tx_personas: Personas, tmp_path: Path
) -> None:
    p = tx_personas
    pool("gpu", slots=3)
    tag("vendor.a", 2)
    push_named(p, 20, pool="gpu")
    push_named(p, 20, queue="outbox", tags=["vendor.a"])
    reports = race(p.agent.id, 15, tmp_path, database_url(), settings.REDIS_URL)
    assert [r["errors"] for r in reports] == [[], []]
    claimed = [t for r in reports for t in r["claimed"]]
    assert len(claimed) == 5 and len(set(claimed)) == 5
    assert set(r for rep in reports for r in rep["deferred"]) <= {"pool_full", "tag_full"}
    assert Todo.objects.filter(state=TodoState.CLAIMED, pool="gpu").count() == 3
    assert Todo.objects.filter(state=TodoState.CLAIMED, tags__contains=["vendor.a"]).count() == 2


# Well under an enforce limit a claim decides inside its statement (limits_tags_check); under
# advise it takes the locked path (the gates' admit, one lock per tag): both lock tags sorted.
@pytest.mark.parametrize("posture", ["enforce", "advise"])
def test_claims_naming_overlapping_tags_a_pool_and_a_budget_never_deadlock(
    tx_personas: Personas, posture: str
) -> None:
    p = tx_personas
    budget(p, max_in_flight=100)
    pool("gpu", slots=100, posture=posture)
    for name in ("a", "b", "c", "d"):
        tag(name, 100, posture=posture)
    # Pairs of tags in both orders as given (the claim locks them sorted): half claimed by id
    # on one endpoint, half by claim_next on another, all at once.
    pairs = [["a", "b"], ["b", "a"], ["c", "a"], ["d", "b"], ["b", "c"], ["d", "c"]] * 2
    by_id = [push_named(p, 1, pool="gpu", tags=pair)[0] for pair in pairs]
    for pair in pairs:
        push(p, 1, endpoint=p.agent2, pool="gpu", tags=pair)

    def claim(i: int) -> object:
        if i < len(by_id):
            return services.claim(actor=p.as_agent(), todo_id=by_id[i].id)
        return services.claim_next(actor=p.as_agent(p.agent2))

    results = run_threads(2 * len(pairs), claim)
    assert all(isinstance(r, Claimed) for r in results)
    assert Todo.objects.filter(state=TodoState.CLAIMED).count() == 2 * len(pairs)
