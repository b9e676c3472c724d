"""A negative zero in a ledger row. jsonb's numeric has none: a row hashed with -0.0 read back
as 0.0 and no longer matched its hash, so a rate of -0.0 (a legal value: not below 0) set by
any endpoint owner left the ledger reporting itself tampered with, for good. Rows are hashed as
jsonb keeps them now, and a row hashed the old way still verifies (only the key makes a hash
that matches with some zeros negative)."""

from __future__ import annotations

import math

from queues import services
from queues.models import Endpoint
from switchboard.ledger import chain as ledger
from switchboard.ledger.models import LedgerEntry, LedgerHead, LedgerKind
from tests.conftest import Personas


def test_a_negative_zero_in_a_row_verifies(db: None) -> None:
    ledger.append(
        kind=LedgerKind.QUEUE_PAUSE,
        actor=ledger.Actor(human_id=1, human_name="olive"),
        scope="queue",
        queue="inbox",
        before={"rate": -0.0},
        after={"rate": -0.0, "list": [-0.0, 1.5, {"deep": -0.0}]},
    )
    # numeric writes an exponent out in digits: 1e16 reads back as an int.
    ledger.append(
        kind=LedgerKind.QUEUE_PAUSE,
        actor=ledger.Actor(human_id=1, human_name="olive"),
        scope="queue",
        queue="inbox",
        before=None,
        after={"big": 1e16, "bigger": -2.5e20, "small": 1e-05, "tiny": 5e-324},
    )
    report = ledger.verify()
    assert report.ok, report.chain


def test_a_rate_of_negative_zero_is_zero_and_the_ledger_stays_sound(personas: Personas) -> None:
    p = personas
    endpoint, _ = services.endpoint_vend(
        actor=p.as_human(p.owner), owner=p.owner, name="Zero", queues=["inbox"], rps=-0.0
    )
    services.endpoint_update(endpoint=endpoint, actor=p.as_human(p.owner), rps=-0.0, burst=3)
    stored = Endpoint.objects.get(pk=endpoint.pk).rate_limit_rps
    assert stored == 0.0 and math.copysign(1.0, stored) == 1.0
    report = ledger.verify()
    assert report.ok, report.chain


def _hashed_the_old_way(row: LedgerEntry, zero_at: str) -> None:
    """Re-sign ``row`` (the last of chain 0) as rows were hashed before the fix: with -0.0 at
    ``zero_at`` of its ``after``, where jsonb keeps 0.0."""
    assert isinstance(row.after, dict)
    row.after[zero_at] = -0.0
    entry_hash = ledger.compute_hash(row)
    LedgerEntry.objects.filter(pk=row.pk).update(entry_hash=entry_hash)
    LedgerHead.objects.filter(pk=0).update(
        entry_hash=entry_hash, mac=ledger.head_mac(row.seq, entry_hash)
    )


def test_a_row_hashed_with_a_negative_zero_before_the_fix_still_verifies(db: None) -> None:
    ledger.append(
        kind=LedgerKind.QUEUE_PAUSE,
        actor=ledger.Actor(human_id=1, human_name="olive"),
        scope="queue",
        queue="inbox",
        before=None,
        after={"rps": 0.0, "other": 0.0, "n": 1},
    )
    row = LedgerEntry.objects.get()
    _hashed_the_old_way(row, "rps")
    assert ledger.verify().ok
    # Anything else changed in it is still caught.
    row.refresh_from_db()
    assert isinstance(row.after, dict)
    LedgerEntry.objects.filter(pk=row.pk).update(after={**row.after, "n": 2})
    report = ledger.verify()
    assert not report.ok and report.chain is not None
    assert "does not match its hash" in report.chain.detail
