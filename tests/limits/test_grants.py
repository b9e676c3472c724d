"""Grants are ledger facts: a claim through a named limit writes a ``limits.grant`` row whose
entry_hash is the grant's identity (returned with the claim, kept on the todo while the claim
lasts), and whatever ends the claim writes a ``limits.end`` row naming it."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any
from uuid import uuid4

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from admission.limits.models import Pool
from admission.limits.services import limit_quarantine, limit_set
from admission.limits.verify import limits_verify, replay_grants
from queues import services, sql
from queues.models import Todo
from queues.services import Claimed
from queues.services.sweeps import reap_expired
from switchboard.core.errors import Conflict, Deferred
from switchboard.ledger import chain
from switchboard.ledger.models import LedgerEntry, LedgerKind
from tests.api.conftest import Api, human_token
from tests.conftest import Personas, lapse, push, run_threads
from tests.limits.conftest import pool, push_named, rate, tag
from tests.web.conftest import signed_in


def grants() -> list[Any]:
    return list(LedgerEntry.objects.filter(kind=LedgerKind.LIMITS_GRANT).order_by("seq"))


def ends() -> list[Any]:
    return list(LedgerEntry.objects.filter(kind=LedgerKind.LIMITS_END).order_by("seq"))


def claim_next(p: Personas, **kwargs: Any) -> Claimed:
    claimed = services.claim_next(actor=p.as_agent(), **kwargs)
    assert isinstance(claimed, Claimed)
    return claimed


def assert_the_chain_verifies() -> None:
    report = chain.verify()
    assert report.ok, report.as_dict()


def test_a_claim_through_a_pool_and_tags_on_the_fast_path_writes_one_grant_naming_them(
    personas: Personas,
) -> None:
    pool("gpu", slots=3)
    tag("vendor.a", 2)
    tag("vendor.b", 5, posture="off")
    [todo] = push_named(personas, pool="gpu", tags=["vendor.b", "vendor.a"])

    claimed = claim_next(personas, claimant="worker-7")

    [row] = grants()
    assert claimed.grant == row.entry_hash
    assert Todo.objects.get(pk=todo.id).grant_hash == row.entry_hash
    assert row.after == {
        "todo": str(todo.id),
        "attempt": 1,
        "holder": "worker-7",
        "supersedes": None,
        "limits": [
            {"kind": "pool", "name": "gpu", "limit": 3, "held": 0, "posture": "enforce"},
            {"kind": "tag", "name": "vendor.a", "limit": 2, "held": 0, "posture": "enforce"},
        ],
    }
    assert row.queue == todo.queue and row.scope == f"endpoint:{personas.agent.slug}"
    assert row.actor_endpoint_slug == personas.agent.slug
    assert row.actor_human_name == personas.agent.owner.get_username()
    assert_the_chain_verifies()


def test_a_claim_naming_nothing_or_only_limits_that_are_off_writes_no_grant(
    personas: Personas,
) -> None:
    pool("gpu", slots=3, posture="off")
    push(personas, 1)
    push_named(personas, pool="gpu")

    first, second = claim_next(personas), claim_next(personas)

    assert first.grant is None and second.grant is None
    assert grants() == []


def test_the_locked_path_writes_the_grant_with_occupancy_and_the_waiver_names_it(
    personas: Personas,
) -> None:
    pool("gpu", slots=1, posture="advise")
    rate("openai", base_limit=100)
    a, b = push_named(personas, 2, pool="gpu", rate_limit="openai")

    services.claim(actor=personas.as_agent(), todo_id=a.id)
    over = services.claim(actor=personas.as_agent(), todo_id=b.id)

    first, second = grants()
    assert over.grant == second.entry_hash == Todo.objects.get(pk=b.id).grant_hash
    assert [(i["kind"], i["held"], i["limit"]) for i in second.after["limits"]] == [
        ("pool", 1, 1),
        ("rate", 1, 100),
    ]
    [(waived, seq)] = LedgerEntry.objects.filter(kind=LedgerKind.LIMITS_WAIVER).values_list(
        "after", "seq"
    )
    assert waived is not None and waived["grant"] == second.entry_hash and seq > second.seq
    assert first.after["todo"] == str(a.id)
    assert_the_chain_verifies()


def test_completion_release_and_the_reaper_each_end_the_grant_they_held(
    personas: Personas,
) -> None:
    pool("gpu", slots=5)
    done, released, lapsed = push_named(personas, 3, pool="gpu")
    c1 = services.claim(actor=personas.as_agent(), todo_id=done.id)
    c2 = services.claim(actor=personas.as_agent(), todo_id=released.id)
    c3 = services.claim(actor=personas.as_agent(), todo_id=lapsed.id)

    services.complete(actor=personas.as_agent(), todo_id=done.id, result={"ok": 1})
    services.release(actor=personas.as_agent(), todo_id=released.id)
    Todo.objects.filter(pk=lapsed.id).update(lease_expires_at=timezone.now() - timedelta(1))
    reap_expired()

    completed, release, expiry = ends()
    assert completed.after == {
        "todo": str(done.id),
        "attempt": 1,
        "grant": c1.grant,
        "ended": "completed",
    }
    assert release.after["grant"] == c2.grant and release.after["ended"] == "released"
    assert expiry.after == {
        "ended": "expired",
        "grants": [{"todo": str(lapsed.id), "attempt": 1, "grant": c3.grant}],
    }
    assert expiry.actor_human_name == "system:reaper"
    assert Todo.objects.filter(grant_hash__isnull=False).count() == 0
    assert_the_chain_verifies()


def test_a_takeover_names_the_grant_it_supersedes(personas: Personas) -> None:
    tag("vendor.a", 3)
    [todo] = push_named(personas, tags=["vendor.a"])
    first = claim_next(personas)
    Todo.objects.filter(pk=todo.id).update(lease_expires_at=timezone.now() - timedelta(1))

    second = claim_next(personas)

    assert second.todo.id == todo.id and second.attempt == 2
    assert grants()[-1].after["supersedes"] == first.grant
    assert grants()[-1].after["limits"][0]["held"] == 0  # the lapsed claim is this todo's own
    assert second.grant != first.grant
    assert_the_chain_verifies()


@pytest.mark.parametrize("by_id", [True, False], ids=["claim", "claim_next"])
def test_a_takeover_that_writes_no_grant_ends_the_one_it_supersedes(
    personas: Personas, by_id: bool
) -> None:
    """The pool goes ``off`` while a granted claim lapses: the takeover is admitted with no grant
    of its own, so it ends the old one in a row; otherwise the replay would hold it open and
    judge the next grant, once the pool is enforced again, over its one slot."""
    admin, agent = personas.as_human(personas.admin), personas.as_agent()
    limit_set(actor=admin, kind="pool", name="gpu", slots=1, posture="enforce")
    lapsed, later = push_named(personas, 2, pool="gpu")
    first = services.claim(actor=agent, todo_id=lapsed.id)
    lapse(lapsed)
    limit_set(actor=admin, kind="pool", name="gpu", slots=1, posture="off")

    taken = services.claim(actor=agent, todo_id=lapsed.id) if by_id else claim_next(personas)

    assert taken.todo.id == lapsed.id and taken.attempt == 2 and taken.grant is None
    [end] = ends()
    assert end.after == {
        "attempt": 1,
        "ended": "superseded",
        "grant": first.grant,
        "todo": str(lapsed.id),
    }
    services.complete(actor=agent, todo_id=lapsed.id)
    limit_set(actor=admin, kind="pool", name="gpu", slots=1, posture="enforce")
    services.claim(actor=agent, todo_id=later.id)
    replay = replay_grants()
    assert replay.drift == [] and replay.held("pool", "gpu") == 1
    assert limits_verify().ok
    assert_the_chain_verifies()


def test_the_sql_append_is_the_pythons_byte_for_byte(personas: Personas) -> None:
    """A row written through the SQL function verifies in Python, and a forged byte fails."""
    h = chain.append_one_trip(
        kind=LedgerKind.LIMITS_GRANT,
        actor=chain.Actor(human_id=7, human_name='Zoë "quoted" \\ back', endpoint_slug="e-1"),
        scope="endpoint:e-1",
        queue="inbox",
        after={"todo": "x", "limits": [{"name": "gpu", "held": 1}], "note": "ünïcode \n"},
    )
    row = LedgerEntry.objects.get(entry_hash=h)
    assert chain.compute_hash(row) == h
    assert_the_chain_verifies()
    LedgerEntry.objects.filter(pk=row.pk).update(after={"todo": "y"})
    assert chain.verify().chain is not None


def test_the_statements_read_the_grant_column(personas: Personas) -> None:
    assert "grant_hash" in sql.TODO_COLUMNS


def forge_grant(todo: str, **item: Any) -> str:
    """A grant written through the ledger's own append: chain-consistent, but never admitted."""
    return chain.append_one_trip(
        kind=LedgerKind.LIMITS_GRANT,
        actor=chain.Actor(human_name="mallory"),
        scope="endpoint:forged",
        queue="inbox",
        after={
            "todo": todo,
            "attempt": 1,
            "holder": "mallory",
            "supersedes": None,
            "limits": [{"kind": "pool", "held": 0, "posture": "enforce", **item}],
        },
    )


def test_verify_fails_at_the_row_of_a_forged_grant_over_an_enforced_pool(
    personas: Personas,
) -> None:
    pool("gpu", slots=1)
    push_named(personas, pool="gpu")
    claim_next(personas)
    assert limits_verify().ok

    forged = forge_grant(str(uuid4()), name="gpu", limit=1)

    report = limits_verify()
    assert report.ledger.ok, "the forged row is consistent with the chain"
    [drift] = report.drift
    row = LedgerEntry.objects.get(entry_hash=forged)
    assert (drift.seq, drift.grant, drift.problem) == (row.seq, forged, "over_enforced_limit")
    assert (drift.held, drift.recorded, drift.limit) == (1, 0, 1)
    out = StringIO()
    with pytest.raises(CommandError) as refused:
        call_command("limits", "verify", stdout=out)
    assert refused.value.returncode == 3 and f"grant at row {row.seq}" in out.getvalue()


def test_verify_names_a_limit_changed_behind_the_ledgers_back(personas: Personas) -> None:
    """``limits verify`` said "policies: 1 differ from the ledger" and not which; ``ledger
    verify`` named it."""
    pool("gpu", slots=5)
    Pool.objects.filter(name="gpu").update(slots=9)
    out = StringIO()
    with pytest.raises(CommandError) as refused:
        call_command("limits", "verify", stdout=out)
    assert refused.value.returncode == 3
    said = out.getvalue()
    assert "policies: 1 differ from the ledger" in said
    assert "limits/pool gpu: changed_outside_audit:" in said and "audited 5, now 9" in said


def test_verify_counts_ended_grants_out_so_a_freed_slot_granted_again_is_no_drift(
    personas: Personas,
) -> None:
    pool("gpu", slots=1)
    first, second, third = push_named(personas, 3, pool="gpu")
    services.claim(actor=personas.as_agent(), todo_id=first.id)
    services.complete(actor=personas.as_agent(), todo_id=first.id)
    services.claim(actor=personas.as_agent(), todo_id=second.id)
    Todo.objects.filter(pk=second.id).update(lease_expires_at=timezone.now() - timedelta(1))
    reap_expired()
    services.claim(actor=personas.as_agent(), todo_id=third.id)

    replay = replay_grants()
    assert replay.grants == 3 and replay.drift == [] and replay.held("pool", "gpu") == 1
    # Without the reaper's end row, the third grant would find the pool full.
    LedgerEntry.objects.filter(kind=LedgerKind.LIMITS_END, after__ended="expired").delete()
    [drift] = replay_grants().drift
    assert drift.todo == str(third.id)


def test_racing_claims_on_a_pool_leave_exactly_one_grant_each_and_a_verifying_chain(
    tx_personas: Personas,
) -> None:
    p = tx_personas
    pool("gpu", slots=6)
    tag("vendor.a", 4, posture="advise")
    push_named(p, 10, pool="gpu", tags=["vendor.a"])
    push_named(p, 4, queue="outbox", pool="gpu")

    def claim(i: int) -> object:
        if i % 2:
            return services.claim_next(actor=p.as_agent(), lease_ttl_seconds=600)
        todo = Todo.objects.filter(pool="gpu", state="pending").order_by("-created_at")[i]
        try:
            return services.claim(actor=p.as_agent(), todo_id=todo.id, lease_ttl_seconds=600)
        except (Deferred, Conflict) as refused:
            return refused

    results = run_threads(10, claim)

    claimed = [r for r in results if isinstance(r, Claimed)]
    assert len(claimed) == 6, results
    rows = grants()
    assert len(rows) == 6
    assert {c.grant for c in claimed} == {r.entry_hash for r in rows}
    held = Todo.objects.filter(state="claimed")
    assert {t.grant_hash for t in held} == {r.entry_hash for r in rows}
    assert sorted(r.after["limits"][0]["held"] for r in rows) == [0, 1, 2, 3, 4, 5]
    waivers = LedgerEntry.objects.filter(kind=LedgerKind.LIMITS_WAIVER).values_list(
        "after", flat=True
    )
    assert {w["grant"] for w in waivers if w} <= {r.entry_hash for r in rows}
    report = limits_verify()
    assert report.ok, report.as_dict()
    assert replay_grants().held("pool", "gpu") == 6


def test_the_rest_claim_get_todo_the_operator_api_and_the_console_show_the_same_grant(
    personas: Personas,
) -> None:
    pool("gpu", slots=2)
    [todo] = push_named(personas, pool="gpu")
    api = Api(Client(), personas.agent_token)

    claimed = api.verb("claim_next", {}).json()

    [row] = grants()
    assert claimed["grant"] == claimed["todo"]["grant"] == row.entry_hash
    got = api.verb("get_todo", {"id": str(todo.id)}).json()
    assert got["todo"]["grant"] == row.entry_hash
    token = human_token(personas.owner)
    operator = Client().get(
        f"/api/v1/todos/{todo.id}", headers={"Authorization": f"Bearer {token}"}
    )
    assert operator.json()["todo"]["grant"] == row.entry_hash
    page = signed_in(personas.owner).get(f"/todos/{todo.id}").content.decode()
    assert row.entry_hash in page
    api.verb("complete", {"id": str(todo.id), "attempt": 1})
    assert api.verb("get_todo", {"id": str(todo.id)}).json()["todo"]["grant"] is None
    assert row.entry_hash not in signed_in(personas.owner).get(f"/todos/{todo.id}").content.decode()


def test_a_revoke_ends_the_grants_of_the_claims_it_dead_letters_in_one_row(
    personas: Personas,
) -> None:
    pool("gpu", slots=4)
    push_named(personas, 3, pool="gpu")
    held = {claim_next(personas).grant for _ in range(2)}

    services.endpoint_revoke(endpoint=personas.agent, actor=personas.as_human(personas.owner))

    [row] = ends()
    assert row.after["ended"] == "revoked"
    assert {g["grant"] for g in row.after["grants"]} == held
    assert replay_grants().held("pool", "gpu") == 0
    assert_the_chain_verifies()


def test_a_quarantine_names_the_grants_it_expired_and_the_replay_counts_them_out(
    personas: Personas,
) -> None:
    tag("vendor.a", 3)
    push_named(personas, 2, tags=["vendor.a"])
    claimed = claim_next(personas)

    done = limit_quarantine(actor=personas.as_human(personas.admin), kind="tag", name="vendor.a")

    manifest = done["manifest"]
    assert [e["grant"] for e in manifest["expired"]] == [claimed.grant]
    assert replay_grants().held("tag", "vendor.a") == 0
    assert limits_verify().ok
