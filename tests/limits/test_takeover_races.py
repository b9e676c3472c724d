"""Takeovers racing on lapsed granted claims whose pool went ``off``: each lapsed claim is taken
over exactly once and its grant ended exactly once, as ``superseded``, by the one takeover that
won it; the replay then holds nothing and both verifications pass."""

from __future__ import annotations

from typing import Any

from admission.limits.services import limit_set
from admission.limits.verify import limits_verify, replay_grants
from queues import services
from queues.services import Claimed
from switchboard.core.errors import Conflict
from switchboard.ledger import chain
from switchboard.ledger.models import LedgerEntry, LedgerKind
from tests.conftest import Personas, lapse, run_threads
from tests.limits.conftest import push_named

LAPSED = 6
CLAIMERS = 12


def test_racing_takeovers_each_end_the_superseded_grant_exactly_once(
    tx_personas: Personas,
) -> None:
    p = tx_personas
    admin, agent = p.as_human(p.admin), p.as_agent()
    limit_set(actor=admin, kind="pool", name="gpu", slots=LAPSED, posture="enforce")
    todos = push_named(p, LAPSED, pool="gpu")
    first = {t.id: services.claim(actor=agent, todo_id=t.id) for t in todos}
    assert all(c.grant for c in first.values())
    for t in todos:
        lapse(t)
    limit_set(actor=admin, kind="pool", name="gpu", slots=LAPSED, posture="off")

    def take(i: int) -> Any:
        # Half take the next claimable todo, half name one of the lapsed todos (two per todo).
        if i % 2:
            return services.claim_next(actor=p.as_agent(), claimant=f"w{i}")
        try:
            return services.claim(actor=p.as_agent(), todo_id=todos[i // 2 % LAPSED].id)
        except Conflict as lost:
            return lost

    results = run_threads(CLAIMERS, take)

    won = [r for r in results if isinstance(r, Claimed) and r.todo is not None]
    assert sorted(str(c.todo.id) for c in won) == sorted(str(t.id) for t in todos), results
    assert all(c.attempt == 2 and c.grant is None for c in won)
    ended: list[dict[str, Any]] = [
        e.after or {} for e in LedgerEntry.objects.filter(kind=LedgerKind.LIMITS_END)
    ]
    assert sorted((e["todo"], e["grant"], e["ended"]) for e in ended) == sorted(
        (str(t.id), first[t.id].grant, "superseded") for t in todos
    )
    assert (
        not LedgerEntry.objects.filter(kind=LedgerKind.LIMITS_GRANT)
        .exclude(entry_hash__in=[c.grant for c in first.values()])
        .exists()
    )
    assert replay_grants().held("pool", "gpu") == 0
    report = limits_verify()
    assert report.ok, report.as_dict()
    assert chain.verify().ok
