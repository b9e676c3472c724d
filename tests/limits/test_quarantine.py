"""Quarantine of a pool or a tag: one transaction sets the limit to 0, expires every claim naming
it and writes one ledger row carrying the whole manifest, which the ledger alone replays."""

from __future__ import annotations

import threading
import time

import pytest

from admission.limits import selectors
from admission.limits.models import Pool, TagLimit
from admission.limits.services import limit_quarantine
from queues import services
from queues.models import Attempt, Todo, TodoState
from queues.services import Claimed, NothingClaimable
from switchboard.core.errors import Conflict, Deferred, Forbidden, InvalidArgument, NotFound
from switchboard.ledger import chain
from switchboard.ledger.models import LedgerEntry, LedgerKind
from tests.conftest import Personas, audit_rows, run_threads
from tests.limits.conftest import pool, push_named, tag


def claim_fenced(p: Personas) -> Claimed:
    claimed = services.claim_next(actor=p.as_agent(), require_fence=True, claimant="worker-1")
    assert isinstance(claimed, Claimed)
    return claimed


def quarantine(p: Personas, kind: str, name: str) -> dict[str, object]:
    return limit_quarantine(actor=p.as_human(p.admin), kind=kind, name=name)


def test_quarantining_a_pool_expires_its_claims_and_records_one_manifest(
    personas: Personas,
) -> None:
    pool("gpu", slots=3, posture="advise")
    todos = push_named(personas, 5, pool="gpu")
    first, second = claim_fenced(personas), claim_fenced(personas)

    done = quarantine(personas, "pool", "gpu")

    assert Pool.objects.get().slots == 0 and Pool.objects.get().posture == "enforce"
    assert Todo.objects.filter(state=TodoState.CLAIMED).count() == 0
    manifest = done["manifest"]
    assert isinstance(manifest, dict)
    expired = {(e["todo"], e["holder"], e["attempt"]) for e in manifest["expired"]}
    assert expired == {(str(c.todo.id), "worker-1", 1) for c in (first, second)}
    claimed_ids = {first.todo.id, second.todo.id}
    assert manifest["queued"] == sorted(str(t.id) for t in todos if t.id not in claimed_ids)
    [row] = audit_rows().filter(kind=LedgerKind.LIMITS_QUARANTINE)
    assert row.entry_hash == done["entry_hash"]
    assert row.before is not None and row.before["slots"] == 3
    assert set(Attempt.objects.filter(outcome="expired").values_list("todo_id", flat=True)) == (
        claimed_ids
    )


def test_the_stale_holders_complete_is_a_conflict_and_nothing_is_claimed_after(
    personas: Personas,
) -> None:
    pool("gpu", slots=2)
    push_named(personas, 3, pool="gpu")
    stale = claim_fenced(personas)
    quarantine(personas, "pool", "gpu")
    with pytest.raises(Conflict):
        services.complete(
            actor=personas.as_agent(),
            todo_id=stale.todo.id,
            lease_token=stale.lease_token,
            result={"ok": True},
        )
    after = services.claim_next(actor=personas.as_agent())
    assert isinstance(after, NothingClaimable)
    assert [d["reason"] for d in after.deferred] == ["limit_quarantined"]
    assert after.deferred[0]["next_eligible_at"] is None


def test_quarantining_a_tag_expires_every_claim_carrying_it(personas: Personas) -> None:
    tag("vendor.a", 5)
    tag("vendor.b", 5)
    [both] = push_named(personas, 1, tags=["vendor.b", "vendor.a"])
    [other] = push_named(personas, 1, tags=["vendor.b"])
    claim_fenced(personas)
    claim_fenced(personas)
    done = quarantine(personas, "tag", "vendor.a")
    manifest = done["manifest"]
    assert isinstance(manifest, dict)
    assert [e["todo"] for e in manifest["expired"]] == [str(both.id)]
    assert Todo.objects.get(id=other.id).state == TodoState.CLAIMED
    assert TagLimit.objects.get(tag="vendor.a").limit == 0


def test_replaying_the_ledger_reproduces_the_manifest_byte_for_byte(personas: Personas) -> None:
    pool("gpu", slots=4)
    push_named(personas, 3, pool="gpu")
    claim_fenced(personas)
    done = quarantine(personas, "pool", "gpu")
    manifest = done["manifest"]
    assert isinstance(manifest, dict)

    [replayed] = selectors.quarantines()
    assert selectors.manifest_bytes(replayed["manifest"]) == selectors.manifest_bytes(manifest)
    row = LedgerEntry.objects.get(entry_hash=done["entry_hash"])
    assert chain.compute_hash(row) == row.entry_hash  # the manifest is the hashed payload
    assert chain.verify().ok


def test_a_quarantine_is_refused_naming_the_field_with_nothing_changed(
    personas: Personas,
) -> None:
    pool("gpu", slots=2)
    push_named(personas, 1, pool="gpu")
    claim_fenced(personas)
    with pytest.raises(Forbidden):
        limit_quarantine(actor=personas.as_human(personas.owner), kind="pool", name="gpu")
    with pytest.raises(NotFound) as missing:
        quarantine(personas, "pool", "cpu")
    assert missing.value.details["field"] == "name"
    with pytest.raises(InvalidArgument) as kind:
        quarantine(personas, "rate", "gpu")
    assert kind.value.details["field"] == "kind"
    with pytest.raises(InvalidArgument) as name:
        quarantine(personas, "pool", "Not A Name")
    assert name.value.details["field"] == "name"
    assert Pool.objects.get().slots == 2
    assert Todo.objects.filter(state=TodoState.CLAIMED).count() == 1
    assert not audit_rows().filter(kind=LedgerKind.LIMITS_QUARANTINE).exists()


def test_no_claim_racing_a_quarantine_holds_a_slot_after_it_commits(
    tx_personas: Personas,
) -> None:
    p = tx_personas
    pool("gpu", slots=100)
    push_named(p, 60, pool="gpu")
    push_named(p, 20, endpoint=p.agent2, pool="gpu")
    done: dict[str, object] = {}
    first_claim, quarantined = threading.Event(), threading.Event()

    def claim_once(i: int) -> object:
        agent = p.agent if i % 2 else p.agent2
        if i % 3:
            return services.claim_next(actor=p.as_agent(agent))
        pending = Todo.objects.filter(endpoint=agent, state=TodoState.PENDING).first()
        if pending is None:
            return None
        try:
            return services.claim(actor=p.as_agent(agent), todo_id=pending.id)
        except (Conflict, Deferred) as exc:
            return exc

    def act(i: int) -> list[tuple[bool, object]]:
        if i == 0:
            assert first_claim.wait(60)  # claims are landing: quarantine among them
            done.update(quarantine(p, "pool", "gpu"))
            quarantined.set()
            return []
        out: list[tuple[bool, object]] = []
        # Claims before, during and (two each) after the quarantine commits: a thread keeps
        # trying until it has made two attempts after the commit, however slow the quarantine.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            after = quarantined.is_set()
            out.append((after, claim_once(i)))
            if isinstance(out[-1][1], Claimed):
                first_claim.set()
            if sum(a for a, _ in out) >= 2:
                break
        return out

    results = [x for rs in run_threads(8, act) for x in rs]
    claimed = {str(r.todo.id) for _, r in results if isinstance(r, Claimed)}
    manifest = done["manifest"]
    assert isinstance(manifest, dict)
    expired = {e["todo"] for e in manifest["expired"]}
    # Every claim that landed was expired by the quarantine; none started after it landed.
    assert claimed and claimed <= expired
    assert Todo.objects.filter(state=TodoState.CLAIMED, pool="gpu").count() == 0
    later = [r for after, r in results if after and r is not None]
    assert later and not any(isinstance(r, Claimed) for r in later)
    reasons = {d["reason"] for r in later if isinstance(r, NothingClaimable) for d in r.deferred}
    reasons |= {r.details["reason"] for r in later if isinstance(r, Deferred)}
    assert reasons == {"limit_quarantined"}
