"""Grant chains: grant and end rows go to one of several hash chains beside chain 0, each with
its own lock, gapless ``chain_pos``, links and signed head; ``verify`` checks every chain and
every head and still names the exact row a tampering broke; the replays read all chains in seq
order."""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from io import StringIO
from typing import Any
from uuid import uuid4

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from queues import services
from queues.services import Claimed
from switchboard.ledger import chain
from switchboard.ledger.models import GRANT_CHAINS, LedgerEntry, LedgerHead, LedgerKind
from tests.conftest import Personas, push, run_threads
from tests.limits.conftest import pool, tag
from tests.web.conftest import signed_in


def sql(statement: str, params: list[Any] | None = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params or [])


def new_transaction_chain() -> None:
    """Forget the chain this (test's one) transaction holds, as a new transaction would: its
    next grant row takes a grant chain, not chain 0 held by the set-up's appends."""
    sql("SELECT set_config(%s, '', true)", [chain.HELD_CHAIN_SETTING])


def grant_row(i: int) -> str:
    return chain.append_one_trip(
        kind=LedgerKind.LIMITS_GRANT,
        actor=chain.Actor(human_name=f"worker-{i}"),
        scope="endpoint:e-1",
        queue="inbox",
        after={"todo": str(uuid4()), "attempt": 1, "holder": f"w{i}", "limits": []},
    )


def build(n_chain0: int = 2, n_grants: int = 5) -> list[LedgerEntry]:
    """Chain-0 rows, then ``n_grants`` grant rows: all in one grant chain (one transaction)."""
    for i in range(n_chain0):
        chain.append(kind=LedgerKind.QUEUE_PAUSE, actor=chain.Actor(human_name="h"), queue=f"q{i}")
    new_transaction_chain()
    hashes = [grant_row(i) for i in range(n_grants)]
    rows = list(LedgerEntry.objects.filter(entry_hash__in=hashes).order_by("seq"))
    assert len({r.chain for r in rows}) == 1 and rows[0].chain >= 1
    assert [r.chain_pos for r in rows] == list(range(1, n_grants + 1))
    assert chain.verify().ok
    return rows


def position(row: LedgerEntry) -> int:
    """The row's 1-based place in seq order."""
    return LedgerEntry.objects.filter(seq__lte=row.seq).count()


def run_ledger_verify() -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("ledger", "verify", stdout=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue()
    return 0, out.getvalue()


def broken() -> chain.ChainProblem:
    report = chain.verify(batch=2)
    assert not report.ok and report.chain is not None
    return report.chain


def test_grant_rows_hash_their_chain_and_position_and_chain_zero_rows_hash_as_before(
    db: None,
) -> None:
    rows = build(n_chain0=1, n_grants=2)
    zero = LedgerEntry.objects.get(chain=0)
    assert zero.chain_pos == 1
    assert "chain" not in chain._hashed_fields(zero)
    fields = chain._hashed_fields(rows[1])
    assert (fields["chain"], fields["chain_pos"]) == (rows[1].chain, 2)
    assert chain.compute_hash(rows[1]) == rows[1].entry_hash
    heads = {h.id: h for h in LedgerHead.objects.all()}
    assert sorted(heads) == list(range(GRANT_CHAINS + 1))
    assert (heads[rows[0].chain].chain_pos, heads[rows[0].chain].seq) == (2, rows[1].seq)
    assert all(h.chain_pos == 0 for c, h in heads.items() if c not in (0, rows[0].chain))


def test_a_changed_grant_row_is_named(db: None) -> None:
    rows = build()
    LedgerEntry.objects.filter(pk=rows[2].pk).update(after={"todo": "forged"})
    problem = broken()
    assert (problem.problem, problem.seq, problem.chain) == ("mutated", rows[2].seq, rows[0].chain)
    assert problem.position == position(rows[2])


def test_a_grant_row_moved_in_seq_is_named(db: None) -> None:
    rows = build()
    a, b = rows[1].seq, rows[3].seq
    sql("UPDATE admission_ledgerentry SET seq = 10^12 WHERE seq = %s", [a])
    sql("UPDATE admission_ledgerentry SET seq = %s WHERE seq = %s", [a, b])
    sql("UPDATE admission_ledgerentry SET seq = %s WHERE seq = 10^12", [b])
    problem = broken()
    assert (problem.problem, problem.seq) == ("reordered", a)
    assert "chain's row 4, where row 2 belongs" in problem.detail


def test_a_grant_row_moved_to_another_chain_is_caught(db: None) -> None:
    rows = build()
    other = rows[0].chain % GRANT_CHAINS + 1
    LedgerEntry.objects.filter(pk=rows[2].pk).update(chain=other, chain_pos=1)
    problem = broken()
    # The other chain is empty: its signed head says no row was ever written there.
    assert (problem.problem, problem.seq, problem.chain) == ("inserted", rows[2].seq, other)


def test_a_deleted_middle_grant_row_is_named(db: None) -> None:
    rows = build()
    LedgerEntry.objects.filter(pk=rows[2].pk).delete()
    problem = broken()
    assert (problem.problem, problem.chain) == ("deleted", rows[0].chain)
    assert problem.seq == rows[1].seq + 1 and problem.position == position(rows[3])
    assert "the row at chain position 3 is missing" in problem.detail


def test_a_deleted_grant_chain_tail_is_caught_by_its_head(db: None) -> None:
    rows = build()
    LedgerEntry.objects.filter(pk=rows[-1].pk).delete()
    problem = broken()
    assert (problem.problem, problem.seq, problem.chain) == (
        "deleted",
        rows[-2].seq + 1,
        rows[0].chain,
    )
    assert f"chain {rows[0].chain}: row {rows[-1].seq} is missing" in problem.detail


def test_a_grant_chain_whose_rows_are_all_deleted_is_located_at_its_heads_row(
    db: None,
) -> None:
    # Every row of a grant chain gone, its head kept: the problem pointed at seq 1, position 1,
    # a sound row of chain 0.
    rows = build()
    LedgerEntry.objects.filter(chain=rows[0].chain).delete()
    problem = broken()
    assert (problem.problem, problem.chain, problem.seq) == ("deleted", rows[0].chain, rows[-1].seq)
    assert problem.position == LedgerEntry.objects.filter(seq__lt=rows[-1].seq).count() + 1
    assert f"all 5 rows of the chain, up to seq {rows[-1].seq}, are missing" in problem.detail


def test_a_deleted_grant_chain_head_is_caught(db: None) -> None:
    rows = build()
    LedgerHead.objects.filter(pk=rows[0].chain).delete()
    problem = broken()
    assert problem.problem == "deleted"
    assert f"the signed head of chain {rows[0].chain} is missing" in problem.detail


def test_a_whole_grant_chain_deleted_with_its_head_is_caught(db: None) -> None:
    rows = build()
    LedgerEntry.objects.filter(chain=rows[0].chain).delete()
    LedgerHead.objects.filter(pk=rows[0].chain).delete()
    problem = broken()
    assert problem.problem == "deleted" and problem.chain == rows[0].chain
    # No row is left to point at (it pointed at seq 1, a sound row of chain 0): no place.
    assert (problem.seq, problem.position) == (0, 0)
    code, out = run_ledger_verify()
    assert code == 3
    assert f"chain: BROKEN: deleted: the signed head of chain {rows[0].chain} is missing" in out
    # And the next grant on that chain refuses rather than start it again.
    new_transaction_chain()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT set_config(%s, %s, true)", [chain.HELD_CHAIN_SETTING, str(rows[0].chain)]
        )
    with pytest.raises(Exception, match=f"signed head of chain {rows[0].chain} is missing"):
        grant_row(99)


def test_a_head_taken_from_another_chain_is_caught(db: None) -> None:
    rows = build()
    empty = next(c for c in range(1, GRANT_CHAINS + 1) if c != rows[0].chain)
    donor = LedgerHead.objects.get(pk=rows[0].chain)
    LedgerHead.objects.filter(pk=empty).update(
        seq=donor.seq, chain_pos=donor.chain_pos, entry_hash=donor.entry_hash, mac=donor.mac
    )
    problem = broken()
    assert problem.problem == "mutated" and "signature" in problem.detail


def test_a_forged_chain_zero_head_is_placed_in_seq_order(db: None) -> None:
    # Its position was the head's chain position (3 here), where every other problem's is the
    # row's place in seq order, as ChainProblem says (8).
    build()
    chain.append(kind=LedgerKind.QUEUE_PAUSE, actor=chain.Actor(human_name="h"), queue="late")
    last = LedgerEntry.objects.filter(chain=0).order_by("-seq").first()
    assert last is not None and last.chain_pos == 3 and position(last) == 8
    LedgerHead.objects.filter(pk=0).update(mac="0" * 64)
    problem = broken()
    assert problem.problem == "mutated" and "signature" in problem.detail
    assert (problem.seq, problem.position, problem.chain) == (last.seq, 8, 0)


def test_a_row_past_a_grant_chains_head_is_caught_as_inserted(db: None) -> None:
    rows = build()
    LedgerHead.objects.filter(pk=rows[0].chain).update(seq=0)  # a stale head, re-signed...
    head = LedgerHead.objects.get(pk=rows[0].chain)
    mac = chain.head_mac(
        rows[-2].seq, rows[-2].entry_hash, chain=rows[0].chain, chain_pos=rows[-2].chain_pos
    )
    LedgerHead.objects.filter(pk=head.pk).update(
        seq=rows[-2].seq, chain_pos=rows[-2].chain_pos, entry_hash=rows[-2].entry_hash, mac=mac
    )  # ...as if the key had signed it before the last row: that row is past it
    problem = broken()
    assert (problem.problem, problem.seq) == ("inserted", rows[-1].seq)


def run(command: str, *args: str) -> tuple[int, str]:
    out = StringIO()
    try:
        call_command(command, *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue()
    return 0, out.getvalue()


def test_racing_named_claims_and_completions_spread_over_grant_chains_that_all_verify(
    tx_personas: Personas,
) -> None:
    p = tx_personas
    threads, cycles = 8, 6
    pool("gpu", slots=1000)
    tag("vendor.a", 1000)
    tag("vendor.b", 1000)
    push(p, threads * cycles, pool="gpu", tags=["vendor.a", "vendor.b"])

    def work(i: int) -> list[str]:
        done = []
        for _ in range(cycles):
            claimed = services.claim_next(actor=p.as_agent(), lease_ttl_seconds=600)
            assert isinstance(claimed, Claimed) and claimed.grant
            services.complete(actor=p.as_agent(), todo_id=claimed.todo.id)
            done.append(claimed.grant)
        return done

    granted = [g for done in run_threads(threads, work) for g in done]

    grant_rows = list(LedgerEntry.objects.filter(kind=LedgerKind.LIMITS_GRANT))
    end_rows = list(LedgerEntry.objects.filter(kind=LedgerKind.LIMITS_END))
    assert sorted(r.entry_hash for r in grant_rows) == sorted(granted)
    assert len(grant_rows) == threads * cycles
    ended = {r.seq: (r.after or {})["grant"] for r in end_rows}
    assert Counter(ended.values()) == Counter(granted)
    chains_used = {r.chain for r in grant_rows + end_rows}
    assert chains_used <= set(range(1, GRANT_CHAINS + 1)) and len(chains_used) >= 2
    for c in chains_used:
        positions = list(
            LedgerEntry.objects.filter(chain=c).order_by("seq").values_list("chain_pos", flat=True)
        )
        assert positions == list(range(1, len(positions) + 1))
    # Every end follows its grant in seq order (the replay's order is causal).
    seq_of = {r.entry_hash: r.seq for r in grant_rows}
    assert all(seq > seq_of[grant] for seq, grant in ended.items())

    code, out = run("ledger", "verify", "--json")
    assert code == 0, out
    assert json.loads(out)["chains"][str(min(chains_used))]["rows"] >= 1
    code, out = run("limits", "verify", "--json")
    assert code == 0, out
    assert json.loads(out)["grants"] == threads * cycles

    tampered = max(grant_rows, key=lambda r: r.seq)
    sql(
        "UPDATE admission_ledgerentry SET after = jsonb_set(after, '{holder}', '\"mallory\"') "
        "WHERE seq = %s",
        [tampered.seq],
    )
    code, out = run("limits", "verify", "--json")
    report = json.loads(out)
    assert code == 3 and report["ok"] is False
    assert report["ledger"]["chain"]["problem"]["seq"] == tampered.seq
    assert report["ledger"]["chain"]["problem"]["problem"] == "mutated"
    assert f"chain {tampered.chain}:" in report["ledger"]["chain"]["problem"]["detail"]


def test_the_ledger_list_and_its_csv_show_a_grant_rows_chain(personas: Personas) -> None:
    new_transaction_chain()
    row = LedgerEntry.objects.get(entry_hash=grant_row(1))
    assert row.chain >= 1
    auditor = signed_in(personas.auditor)
    response: Any = auditor.get("/ledger.csv")
    body = b"".join(response.streaming_content).decode()
    [exported] = [r for r in csv.DictReader(io.StringIO(body)) if r["entry_hash"] == row.entry_hash]
    assert (exported["chain"], exported["chain_pos"]) == (str(row.chain), "1")
    page = auditor.get("/ledger?action=limits.grant").content.decode()
    assert f"chain {row.chain}·1" in page
