"""The ledger: an HMAC chain that names the exact row where it was tampered with, a signed head,
and every live policy equal to its last audited state."""

from __future__ import annotations

import json
import secrets
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from admission.models import AdmissionPolicy
from switchboard.ledger import chain as ledger
from switchboard.ledger.models import LedgerEntry, LedgerHead, LedgerKind
from tests.admission.conftest import budget
from tests.conftest import Personas, run_threads

KINDS = [LedgerKind.QUEUE_PAUSE, LedgerKind.QUEUE_RESUME, LedgerKind.ADMISSION_WAIVER]
FAR = 10**12  # a free seq for moving rows around


def build_chain(n: int) -> None:
    for i in range(n):
        ledger.append(
            kind=KINDS[i % len(KINDS)],
            actor=ledger.Actor(human_id=i, human_name=f"human-{i}"),
            scope="queue",
            queue=f"q{i}",
            before=None,
            after={"n": i, "reason": "because"},
        )


def sql(statement: str, params: list[Any] | None = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params or [])


def clear_ledger() -> None:
    sql("DELETE FROM admission_ledgerentry")
    sql("DELETE FROM admission_ledgerhead")


# Changes to one row, each certain to change a hashed value.
MUTATIONS = {
    "queue": "queue = queue || 'x'",
    "kind": "kind = CASE WHEN kind = 'queue.pause' THEN 'queue.resume' ELSE 'queue.pause' END",
    "actor": "actor_human_name = actor_human_name || 'x'",
    "actor_id": "actor_human_id = coalesce(actor_human_id, 0) + 1",
    "after": "after = jsonb_set(coalesce(after, '{}'::jsonb), '{tampered}', 'true')",
    "before": "before = '{\"invented\": 1}'::jsonb",
    "at": "at = at + interval '1 microsecond'",
    "prev_hash": "prev_hash = md5(random()::text) || md5(random()::text)",
    "entry_hash": "entry_hash = md5(random()::text) || md5(random()::text)",
}


def mutate(seq: int, how: str) -> None:
    sql(f"UPDATE admission_ledgerentry SET {MUTATIONS[how]} WHERE seq = %s", [seq])


def delete(seq: int) -> None:
    sql("DELETE FROM admission_ledgerentry WHERE seq = %s", [seq])


def swap(a: int, b: int) -> None:
    sql("UPDATE admission_ledgerentry SET seq = %s WHERE seq = %s", [FAR, a])
    sql("UPDATE admission_ledgerentry SET seq = %s WHERE seq = %s", [a, b])
    sql("UPDATE admission_ledgerentry SET seq = %s WHERE seq = %s", [b, FAR])


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_verify_names_the_exact_position_of_any_tampering(db: None, data: st.DataObject) -> None:
    n = data.draw(st.integers(min_value=2, max_value=25), label="rows")
    op = data.draw(st.sampled_from(["mutate", "delete", "swap"]), label="op")
    build_chain(n)
    try:
        assert ledger.verify().ok
        if op == "mutate":
            at = data.draw(st.integers(1, n), label="row")
            mutate(at, data.draw(st.sampled_from(sorted(MUTATIONS)), label="how"))
            expected = ("mutated", at, at)
        elif op == "delete":
            at = data.draw(st.integers(1, n), label="row")
            delete(at)
            expected = ("deleted", at, at)
        else:
            a = data.draw(st.integers(1, n - 1), label="first")
            b = data.draw(st.integers(a + 1, n), label="second")
            swap(a, b)
            expected = ("reordered", a, a)
        report = ledger.verify(batch=data.draw(st.sampled_from([1, 3, 1000]), label="batch"))
        assert not report.ok
        assert report.chain is not None
        assert (report.chain.problem, report.chain.seq, report.chain.position) == expected
    finally:
        clear_ledger()


def test_a_sound_ledger_verifies(personas: Personas) -> None:
    p = personas
    set_up = LedgerEntry.objects.count()  # the personas' endpoints, vended by the fixture
    budget(p, per="day", limit=3)
    budget(p, per="day", limit=4)
    budget(p, "outbox", max_in_flight=1)
    from admission import services

    services.policy_clear(actor=p.as_human(), endpoint=p.agent, queue="outbox")
    build_chain(5)
    report = ledger.verify()
    assert report.ok, report.as_dict()
    assert report.rows == set_up + 9 and report.head_seq == set_up + 9 and report.policies == 1


def test_an_empty_ledger_verifies(db: None) -> None:
    assert ledger.verify().ok


def test_deleting_the_last_row_is_caught_by_the_signed_head(db: None) -> None:
    build_chain(4)
    delete(4)
    chain = ledger.verify().chain
    assert chain is not None
    assert (chain.problem, chain.seq, chain.position) == ("deleted", 4, 4)


def test_deleting_every_row_is_caught_by_the_signed_head(db: None) -> None:
    build_chain(3)
    sql("DELETE FROM admission_ledgerentry")
    chain = ledger.verify().chain
    # The head names the last row's seq; it belonged first in seq order, nothing being left.
    assert chain is not None and (chain.problem, chain.seq, chain.position) == ("deleted", 3, 1)
    assert chain.detail == (
        "all 3 rows of the chain, up to seq 3, are missing: its signed head is seq 3 "
        "(chain position 3)"
    )


def test_a_head_rewound_without_the_key_is_caught(db: None) -> None:
    build_chain(4)
    last = LedgerEntry.objects.get(seq=3)
    delete(4)
    LedgerHead.objects.update(seq=3, entry_hash=last.entry_hash)
    chain = ledger.verify().chain
    assert chain is not None and chain.problem == "mutated"
    assert "signature" in chain.detail


def test_a_head_whose_position_was_lowered_is_caught_before_appends_break(db: None) -> None:
    # Chain 0's head signs its seq and hash, not its position: lowered, it passed verify (and
    # moved the stored mark to a false anchor), then every append collided with a row already
    # at the position it took, and the next check called it a rollback.
    build_chain(5)
    LedgerHead.objects.filter(id=0).update(chain_pos=3)
    chain = ledger.verify().chain
    assert chain is not None and (chain.problem, chain.seq, chain.position) == ("mutated", 5, 5)
    assert chain.detail == (
        "the signed head records chain position 3, but its row (seq 5) is at position 5"
    )


def test_a_row_appended_past_the_head_is_caught_as_inserted(db: None) -> None:
    build_chain(3)
    tail = LedgerEntry.objects.get(seq=3)
    forged = LedgerEntry(
        seq=4,
        prev_hash=tail.entry_hash,
        kind=LedgerKind.QUEUE_RESUME,
        scope="queue",
        queue="q",
        at=tail.at,
        entry_hash=secrets.token_hex(32),
    )
    forged.save(force_insert=True)
    chain = ledger.verify().chain
    assert chain is not None and (chain.problem, chain.seq, chain.position) == ("inserted", 4, 4)


def test_concurrent_appends_never_fork_the_chain(transactional_db: None) -> None:
    def append_ten(i: int) -> None:
        for j in range(10):
            ledger.append(
                kind=LedgerKind.QUEUE_PAUSE,
                actor=ledger.Actor(human_name=f"writer-{i}"),
                queue=f"q{i}-{j}",
            )

    run_threads(8, append_ten)
    assert list(LedgerEntry.objects.values_list("seq", flat=True)) == list(range(1, 81))
    report = ledger.verify()
    assert report.ok and report.head_seq == 80


def test_a_policy_changed_outside_the_audited_path_is_drift(personas: Personas) -> None:
    p = personas
    set_up = LedgerEntry.objects.count()
    policy = budget(p, per="day", limit=3)
    AdmissionPolicy.objects.filter(pk=policy.pk).update(max_claims_per_window=300)
    report = ledger.verify()
    assert report.chain is None and not report.ok
    (drift,) = report.drift
    assert drift.problem == "changed_outside_audit"
    assert (drift.scope, drift.queue) == (f"endpoint:{p.agent.slug}", "inbox")
    assert "max_claims_per_window audited 3, now 300" in drift.detail
    assert drift.seq == set_up + 1


def test_a_policy_the_ledger_never_saw_is_drift(personas: Personas) -> None:
    p = personas
    AdmissionPolicy.objects.create(
        endpoint=p.agent, queue="inbox", max_in_flight=1, created_by=p.owner, updated_by=p.owner
    )
    (drift,) = ledger.verify().drift
    assert drift.problem == "no_create_row" and drift.queue == "inbox"


def test_a_policy_deleted_outside_the_audited_path_is_drift(personas: Personas) -> None:
    p = personas
    budget(p, max_in_flight=1)
    sql("DELETE FROM admission_admissionpolicy")
    (drift,) = ledger.verify().drift
    assert drift.problem == "deleted_outside_audit"
    assert drift.as_dict()["policy"] == f"endpoint:{p.agent.slug}/inbox"


def test_a_policy_alive_after_its_audited_delete_is_drift(personas: Personas) -> None:
    p = personas
    from admission import services

    set_up = LedgerEntry.objects.count()
    budget(p, max_in_flight=1)
    services.policy_clear(actor=p.as_human(), endpoint=p.agent, queue="inbox")
    AdmissionPolicy.objects.create(
        endpoint=p.agent, queue="inbox", max_in_flight=1, created_by=p.owner, updated_by=p.owner
    )
    (drift,) = ledger.verify().drift
    assert drift.problem == "exists_after_delete" and drift.seq == set_up + 2


def run_verify(*args: str) -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("ledger", "verify", *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue()
    return 0, out.getvalue()


def test_ledger_verify_exits_zero_when_sound(personas: Personas) -> None:
    set_up = LedgerEntry.objects.count()
    budget(personas, max_in_flight=2)
    code, out = run_verify("--json")
    assert code == 0
    assert json.loads(out)["ok"] is True
    code, out = run_verify()
    assert code == 0 and f"chain: ok ({set_up + 1} rows" in out


def test_ledger_verify_exits_three_naming_the_row_and_the_drift(personas: Personas) -> None:
    p = personas
    budget(p, max_in_flight=2)
    build_chain(3)
    mutate(3, "queue")
    AdmissionPolicy.objects.update(max_in_flight=9)
    code, out = run_verify("--json")
    assert code == 3
    report = json.loads(out)
    assert report["ok"] is False
    assert report["chain"]["problem"] == {
        "seq": 3,
        "position": 3,
        "problem": "mutated",
        "detail": report["chain"]["problem"]["detail"],
    }
    assert report["drift"][0]["policy"] == f"endpoint:{p.agent.slug}/inbox"
    assert report["drift"][0]["problem"] == "changed_outside_audit"
    code, text = run_verify()
    assert code == 3
    assert "BROKEN at seq 3, position 3: mutated" in text
    assert f"endpoint:{p.agent.slug}/inbox: changed_outside_audit" in text


def test_ledger_without_a_subcommand_is_a_usage_error(db: None) -> None:
    with pytest.raises(CommandError) as caught:
        call_command("ledger")
    assert caught.value.returncode == 2
