"""What the cheaper named claim cycle keeps (ledger migration 0010, limits migration 0007): the
ledger's CHECKs in their compact forms refuse and accept what they did, by name, in the database
and in model validation; and an ending's reopen ring reads the limit's occupancy after its shared
lock, so a claim that filled the limit while the ending waited for that lock is counted.

The rows the new append writes are checked byte for byte by every test that runs ``ledger
verify`` over grant chains (``test_grant_chains.py``: the HMAC is recomputed in Python)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import psycopg
import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from queues import services
from queues.services import Claimed
from switchboard.ledger import chain
from switchboard.ledger.models import LedgerEntry
from tests.conftest import Personas
from tests.limits.conftest import pool, push_named, tag

pytestmark = pytest.mark.django_db

_INSERT = (
    "INSERT INTO admission_ledgerentry (seq, chain, chain_pos, prev_hash, kind, actor_human_name,"
    " actor_endpoint_slug, scope, queue, at, entry_hash)"
    " VALUES (%s, %s, %s, %s, %s, '', '', '', '', now(), %s)"
)


def _insert(kind: str, chain_number: int) -> None:
    n = 10**9 + uuid.uuid4().int % 10**9  # far past any seq or position a test writes
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_INSERT, [n, chain_number, n, "0" * 64, kind, uuid.uuid4().hex * 2])
        transaction.set_rollback(True)


@pytest.mark.parametrize(
    ("kind", "chain_number", "refused_by"),
    [
        ("policy.nonsense", 0, "ledger_kind_valid"),
        ("", 0, "ledger_kind_valid"),
        ("limits.grant ", 0, "ledger_kind_valid"),
        ("policy.create", 3, "ledger_chain_valid"),
        ("limits.waiver", 8, "ledger_chain_valid"),
        ("limits.grant", 9, "ledger_chain_valid"),
    ],
)
def test_the_compact_ledger_checks_refuse_by_name(
    kind: str, chain_number: int, refused_by: str
) -> None:
    with pytest.raises(IntegrityError, match=refused_by):
        _insert(kind, chain_number)


@pytest.mark.parametrize(
    ("kind", "chain_number"),
    [
        ("policy.create", 0),
        ("todo.discard", 0),
        ("endpoint.hook_secret_rotate", 0),
        ("limits.grant", 0),
        ("limits.grant", 1),
        ("limits.end", 8),
    ],
)
def test_the_compact_ledger_checks_accept_what_they_accepted(kind: str, chain_number: int) -> None:
    _insert(kind, chain_number)


def test_model_validation_still_runs_the_compact_ledger_checks() -> None:
    row = LedgerEntry(
        seq=1, chain=0, chain_pos=1, prev_hash="0" * 64, kind="policy.create", at=timezone.now()
    )
    row.validate_constraints()
    row.kind = "nonsense"
    with pytest.raises(ValidationError, match="ledger_kind_valid"):
        row.validate_constraints()
    row.kind, row.chain = "policy.create", 2
    with pytest.raises(ValidationError, match="ledger_chain_valid"):
        row.validate_constraints()


def _ring_after_a_claim_lands(
    p: Personas, lock_class: int, name: str, reopens_sql: str, **names: Any
) -> list[str]:
    """A (claimed) ends while B's claim holds the limit's lock exclusive, uncommitted, and fills
    the limit (2); C waits. The ending's reopen read waits for the lock, then answers."""
    a, b, _c = push_named(p, 3, **names)
    assert isinstance(services.claim(actor=p.as_agent(), todo_id=a.id), Claimed)
    params = connection.get_connection_params()
    holder = psycopg.connect(**params)
    holder.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [lock_class, name])
    holder.execute(
        "UPDATE queues_todo SET state = 'claimed', attempt = 1, owner = 'b',"
        " claimed_at = now(), lease_expires_at = now() + interval '5 minutes' WHERE id = %s",
        [b.id],
    )
    answer: dict[str, Any] = {}

    def end_a() -> None:
        with psycopg.connect(**params) as ending:
            answer["reopens"] = ending.execute(reopens_sql, [a.id]).fetchone()[0]  # type: ignore[index]

    worker = threading.Thread(target=end_a)
    worker.start()
    deadline = time.monotonic() + 20
    with psycopg.connect(**params, autocommit=True) as probe:
        while not probe.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        ).fetchone()[0]:  # type: ignore[index]
            assert time.monotonic() < deadline, "the reopen read never waited on the lock"
            time.sleep(0.02)
    holder.commit()
    holder.close()
    worker.join(timeout=20)
    return list(answer["reopens"])


@pytest.mark.django_db(transaction=True)
def test_a_pool_ending_rings_for_a_claim_that_filled_it_while_the_ending_waited(
    tx_personas: Personas,
) -> None:
    """Fails on limits migration 0006, whose count ran on the snapshot taken before the lock:
    it missed B, saw the pool one below its cap, and rang no one, though the unit A frees is
    the one C waits for."""
    pool("gpu", slots=2)
    rung = _ring_after_a_claim_lands(
        tx_personas, 19536, "gpu", "SELECT limits_pool_reopens('gpu', %s)", pool="gpu"
    )
    assert rung == [f"{tx_personas.agent.id}:inbox"]


@pytest.mark.django_db(transaction=True)
def test_a_tag_ending_rings_for_a_claim_that_filled_it_while_the_ending_waited(
    tx_personas: Personas,
) -> None:
    tag("vendor.a", 2)
    tag("vendor.b", 100)
    rung = _ring_after_a_claim_lands(
        tx_personas,
        19540,
        "vendor.a",
        "SELECT limits_tags_reopens(ARRAY['vendor.a', 'vendor.b']::varchar[], %s)",
        tags=["vendor.a", "vendor.b"],
    )
    assert rung == [f"{tx_personas.agent.id}:inbox"]


@pytest.mark.django_db(transaction=True)
def test_grant_and_end_rows_hash_as_python_writes_them(tx_personas: Personas) -> None:
    """A named cycle's two rows, recomputed in Python (canonical JSON, HMAC), and every chain
    checked against its signed head."""
    pool("gpu", slots=5)
    tag("vendor.a", 5)
    (todo,) = push_named(tx_personas, 1, pool="gpu", tags=["vendor.a"])
    claimed = services.claim_next(actor=tx_personas.as_agent())
    assert isinstance(claimed, Claimed) and claimed.todo.id == todo.id
    services.complete(actor=tx_personas.as_agent(), todo_id=todo.id)
    rows = list(LedgerEntry.objects.filter(kind__in=["limits.grant", "limits.end"]))
    assert [r.kind for r in rows] == ["limits.grant", "limits.end"]
    for row in rows:
        assert row.chain >= 1 and chain.compute_hash(row) == row.entry_hash
    assert chain.verify().ok
