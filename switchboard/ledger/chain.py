"""The ledger: one append-only, hash-chained table of decisions.

Each row's ``entry_hash`` is an HMAC-SHA256, under ``settings.LEDGER_KEY``, of the canonical JSON
of the row (every column but the hash) including ``prev_hash``, the previous row's hash. A database
writer without the key cannot forge a consistent chain. Appends take one transaction-scoped
advisory lock, so ``seq`` has no gaps and the chain never forks; the append happens in the same
transaction as the change it records (a rolled-back change leaves no row).

A chain whose last rows were deleted is still a consistent chain, so every append also signs the
chain's head (``LedgerHead``: the last seq and its hash, under the same key). ``verify`` compares
the chain with the head, which catches a deleted tail.

``verify()`` is the full check that ``manage.py ledger verify`` and the console's chain badge run:
the chain, streamed in seq order in batches, then every registered trail (admission's compares
each live policy with its last audited ``after``).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from django.conf import settings
from django.db import connection, transaction

from switchboard.ledger.models import LedgerCheck, LedgerEntry, LedgerHead

GENESIS_HASH = "0" * 64
# pg_advisory_xact_lock key for appends: "ledger" in ASCII.
APPEND_LOCK_KEY = 0x6C6564676572
# Rows read per query while verifying: the chain is streamed, never loaded whole.
VERIFY_BATCH = 2000
# How far back verify follows prev_hash links to tell a moved row from a changed one.
_REORDER_DEPTH = 16


@dataclass(frozen=True)
class Actor:
    """Who is accountable: always a human when one exists, and the endpoint that acted, if any."""

    human_id: int | None = None
    human_name: str = ""
    endpoint_id: Any = None
    endpoint_slug: str = ""


def canonical(entry: dict[str, Any]) -> bytes:
    return canonical_json(entry).encode()


def canonical_json(value: Any) -> str:
    """Any JSON value as the chain writes it: keys sorted, no spaces, ASCII."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _hashed_fields(row: LedgerEntry) -> dict[str, Any]:
    return {
        "seq": row.seq,
        "prev_hash": row.prev_hash,
        "kind": row.kind,
        "actor_human_id": row.actor_human_id,
        "actor_human_name": row.actor_human_name,
        "actor_endpoint_id": str(row.actor_endpoint_id) if row.actor_endpoint_id else None,
        "actor_endpoint_slug": row.actor_endpoint_slug,
        "scope": row.scope,
        "queue": row.queue,
        "before": row.before,
        "after": row.after,
        "at": row.at.astimezone(UTC).isoformat(timespec="microseconds"),
    }


def _mac(message: bytes) -> str:
    return hmac.new(settings.LEDGER_KEY.encode(), message, hashlib.sha256).hexdigest()


def compute_hash(row: LedgerEntry) -> str:
    return _mac(canonical(_hashed_fields(row)))


def head_mac(seq: int, entry_hash: str) -> str:
    """The signature of the chain's head (``LedgerHead.mac``)."""
    return _mac(f"ledger-head:{seq}:{entry_hash}".encode())


def append(
    *,
    kind: str,
    actor: Actor,
    scope: str = "",
    queue: str = "",
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> LedgerEntry:
    """Append one row in the caller's transaction (opened here if there is none).

    Lock order: a caller holding an admission policy row lock may append (policy, then ledger);
    nothing that holds the ledger lock takes a policy lock.
    """
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [APPEND_LOCK_KEY])
            cursor.execute(
                "SELECT seq, entry_hash FROM admission_ledgerentry ORDER BY seq DESC LIMIT 1"
            )
            last = cursor.fetchone()
        seq, prev_hash = (last[0] + 1, last[1]) if last else (1, GENESIS_HASH)
        row = LedgerEntry(
            seq=seq,
            prev_hash=prev_hash,
            kind=kind,
            actor_human_id=actor.human_id,
            actor_human_name=actor.human_name,
            actor_endpoint_id=actor.endpoint_id,
            actor_endpoint_slug=actor.endpoint_slug,
            scope=scope,
            queue=queue,
            # JSON round-trips through jsonb; normalise now so the hash sees what is stored.
            before=_normalise(before),
            after=_normalise(after),
            at=datetime.now(UTC),
        )
        row.entry_hash = compute_hash(row)
        row.save(force_insert=True)
        with connection.cursor() as cursor:
            cursor.execute(
                """
                INSERT INTO admission_ledgerhead (id, seq, entry_hash, mac) VALUES (1, %s, %s, %s)
                ON CONFLICT (id) DO UPDATE
                SET seq = EXCLUDED.seq, entry_hash = EXCLUDED.entry_hash, mac = EXCLUDED.mac
                """,
                [seq, row.entry_hash, head_mac(seq, row.entry_hash)],
            )
        return row


# --- the one-round-trip append (SQL function ledger_append_row, ledger migration 0008) ---------


def hmac_pads() -> tuple[bytes, bytes]:
    """The key's inner and outer HMAC pads (RFC 2104), for ``ledger_append_row``: the database
    computes the same HMAC-SHA256 as ``_mac`` from them, with its built-in sha256()."""
    return _pads(settings.LEDGER_KEY)


@functools.lru_cache(maxsize=4)
def _pads(secret: str) -> tuple[bytes, bytes]:
    key = secret.encode()
    if len(key) > hashlib.sha256().block_size:
        key = hashlib.sha256(key).digest()
    key = key.ljust(hashlib.sha256().block_size, b"\0")
    return bytes(b ^ 0x36 for b in key), bytes(b ^ 0x5C for b in key)


def actor_members(actor: Actor) -> str:
    """The actor's canonical JSON members (no braces), as ``canonical`` writes them."""
    return canonical(
        {
            "actor_human_id": actor.human_id,
            "actor_human_name": actor.human_name,
            "actor_endpoint_id": str(actor.endpoint_id) if actor.endpoint_id else None,
            "actor_endpoint_slug": actor.endpoint_slug,
        }
    ).decode()[1:-1]


def row_params(actor: Actor | None) -> dict[str, Any]:
    """The parameters of ``ledger_append_row`` a statement binds for one actor
    (``append_row_sql`` names them): everything but the kind, scope, queue and ``after``. None:
    the statement will append nothing (bound all the same, as NULLs)."""
    if actor is None:
        return dict.fromkeys(_ROW_PARAMS)
    ipad, opad = hmac_pads()
    return {
        "lg_actor": actor_members(actor),
        "lg_human_id": actor.human_id,
        "lg_human_name": actor.human_name,
        "lg_endpoint_id": actor.endpoint_id,
        "lg_endpoint_slug": actor.endpoint_slug,
        "lg_ipad": ipad,
        "lg_opad": opad,
    }


_ROW_PARAMS = (
    "lg_actor",
    "lg_human_id",
    "lg_human_name",
    "lg_endpoint_id",
    "lg_endpoint_slug",
    "lg_ipad",
    "lg_opad",
)


def append_row_sql(kind: str, *, scope: str, queue: str, after: str) -> str:
    """An SQL call appending one row (its ``entry_hash``) with ``row_params``' parameters bound:
    ``scope``, ``queue`` and ``after`` are SQL text expressions, ``after`` already canonical JSON
    (a row whose text is not canonical fails ``verify``: a test of each caller's shape guards
    it). The chain's lock is taken inside the call and held to the end of the transaction."""
    return (
        f"ledger_append_row('{kind}', %(lg_actor)s, %(lg_human_id)s, %(lg_human_name)s, "
        f"%(lg_endpoint_id)s, %(lg_endpoint_slug)s, {scope}, {queue}, {after}, "
        "%(lg_ipad)s, %(lg_opad)s)"
    )


def append_one_trip(
    *, kind: str, actor: Actor, scope: str = "", queue: str = "", after: dict[str, Any]
) -> str:
    """``append`` in one round trip (the row written by ``ledger_append_row``); its entry_hash.
    In the caller's transaction, which must be READ COMMITTED (the function reads the chain's
    last row with a fresh snapshot)."""
    params = {
        **row_params(actor),
        "lg_scope": scope,
        "lg_queue": queue,
        "lg_after": canonical_text(after),
    }
    sql = append_row_sql(kind, scope="%(lg_scope)s", queue="%(lg_queue)s", after="%(lg_after)s")
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + sql, params)
        (entry_hash,) = cursor.fetchone()
    return str(entry_hash)


def canonical_text(value: dict[str, Any]) -> str:
    """``value`` as the canonical JSON the chain hashes once stored (jsonb round trip)."""
    return canonical(_normalise(value) or {}).decode()


def _normalise(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is None:
        return None
    loaded: dict[str, Any] = json.loads(json.dumps(value, default=str))
    return loaded


# --- verification -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ChainProblem:
    """The first place the chain breaks.

    ``seq`` names the row at fault (for a deletion, the missing seq); ``position`` is the 1-based
    place in seq order where that row is, or should be.
    """

    seq: int
    position: int
    problem: str  # mutated | deleted | reordered | inserted
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "position": self.position,
            "problem": self.problem,
            "detail": self.detail,
        }


def _lookup_seq(entry_hash: str) -> LedgerEntry | None:
    return LedgerEntry.objects.filter(entry_hash=entry_hash).first()


def _written_seq(
    row: LedgerEntry, lookup: Callable[[str], LedgerEntry | None], depth: int = 0
) -> int | None:
    """The seq a row was written with, if it can be proven: the row hashes correctly under it.

    A row's predecessor is the row whose hash it links to; the row was written right after it.
    The predecessor may itself have moved, so its own written seq is found the same way.
    """
    if compute_hash(row) == row.entry_hash:
        return row.seq
    if depth >= _REORDER_DEPTH:
        return None
    if row.prev_hash == GENESIS_HASH:
        candidate = 1
    else:
        before = lookup(row.prev_hash)
        if before is None:
            return None
        written = _written_seq(before, lookup, depth + 1)
        if written is None:
            return None
        candidate = written + 1
    if compute_hash(_with_seq(row, candidate)) == row.entry_hash:
        return candidate
    return None


def _with_seq(row: LedgerEntry, seq: int) -> LedgerEntry:
    copy = LedgerEntry(**{f.attname: getattr(row, f.attname) for f in LedgerEntry._meta.fields})
    copy.seq = seq
    return copy


def verify_chain(
    rows: Iterable[LedgerEntry],
    *,
    head_seq: int | None = None,
    lookup: Callable[[str], LedgerEntry | None] = _lookup_seq,
) -> ChainProblem | None:
    """Recompute the chain over rows in seq order; name the first row that breaks it.

    Rows may be any iterable (``verify`` streams them). ``head_seq``, when known, is the seq the
    signed head records: rows past it were not written by ``append``.
    """
    prev = GENESIS_HASH
    expected_seq = 1
    for position, row in enumerate(rows, start=1):
        if row.seq != expected_seq:
            if row.seq > expected_seq:
                missing = (
                    f"row {expected_seq} is missing"
                    if row.seq == expected_seq + 1
                    else f"rows {expected_seq}-{row.seq - 1} are missing"
                )
                return ChainProblem(
                    expected_seq,
                    position,
                    "deleted",
                    f"{missing}: seq jumps from {expected_seq - 1} to {row.seq}",
                )
            return ChainProblem(
                row.seq,
                position,
                "reordered",
                f"seq {row.seq} appears where {expected_seq} belongs",
            )
        if head_seq is not None and row.seq > head_seq:
            return ChainProblem(
                row.seq,
                position,
                "inserted",
                f"row {row.seq} ({row.kind}) is past the signed head (seq {head_seq}): "
                "it was not written by the ledger",
            )
        recomputed = compute_hash(row)
        if row.prev_hash != prev or recomputed != row.entry_hash:
            return _classify(row, position, prev, recomputed, lookup)
        prev = row.entry_hash
        expected_seq += 1
    return None


def _classify(
    row: LedgerEntry,
    position: int,
    prev: str,
    recomputed: str,
    lookup: Callable[[str], LedgerEntry | None],
) -> ChainProblem:
    if recomputed == row.entry_hash:
        # The row is authentic but does not follow the row before it.
        return ChainProblem(
            row.seq,
            position,
            "reordered",
            f"row {row.seq} ({row.kind}) is intact but links to {row.prev_hash[:12]}…, "
            f"not to the row before it ({prev[:12]}…)",
        )
    if row.prev_hash != prev:
        written = _written_seq(row, lookup)
        if written is not None and written != row.seq:
            return ChainProblem(
                row.seq,
                position,
                "reordered",
                f"the row at seq {row.seq} is the row written as seq {written} ({row.kind}): "
                "rows were moved",
            )
        return ChainProblem(
            row.seq,
            position,
            "mutated",
            f"row {row.seq} ({row.kind}) links to {row.prev_hash[:12]}…, but the row before it "
            f"hashes to {prev[:12]}…, and its content does not match its hash",
        )
    return ChainProblem(
        row.seq,
        position,
        "mutated",
        f"row {row.seq} ({row.kind}) does not match its hash: its content was changed",
    )


class Trail(Protocol):
    """A check that reads the chain as it streams past, then compares it with live rows.

    The chain knows nothing of what it audits; an app that wants its live rows checked against
    their last audited state registers a trail (``register_trail``) from its ``AppConfig.ready()``.
    """

    def see(self, row: LedgerEntry) -> None: ...

    def finish(self, report: VerifyReport) -> list[Any]:
        """The problems found (each with ``as_dict()``), after the whole chain was seen."""
        ...


TRAILS: list[Callable[[], Trail]] = []


def register_trail(factory: Callable[[], Trail]) -> None:
    if factory not in TRAILS:
        TRAILS.append(factory)


@dataclass
class VerifyReport:
    rows: int = 0
    head_seq: int | None = None
    chain: ChainProblem | None = None
    drift: list[Any] = field(default_factory=list)
    # Live rows the trails compared with the chain (admission's: its policies).
    policies: int = 0

    @property
    def ok(self) -> bool:
        return self.chain is None and not self.drift

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "rows": self.rows,
            "head_seq": self.head_seq,
            "policies": self.policies,
            "chain": {
                "ok": self.chain is None,
                "problem": self.chain.as_dict() if self.chain else None,
            },
            "drift": [d.as_dict() for d in self.drift],
        }


def stream_rows(batch: int = VERIFY_BATCH) -> Iterator[LedgerEntry]:
    """Every ledger row in seq order, read ``batch`` rows at a time (keyset pagination)."""
    after = 0
    while True:
        rows = list(LedgerEntry.objects.filter(seq__gt=after).order_by("seq")[:batch])
        yield from rows
        if len(rows) < batch:
            return
        after = rows[-1].seq


def verify(batch: int = VERIFY_BATCH) -> VerifyReport:
    """The full check: the chain and its signed head, then every policy against its audit.

    Runs in one REPEATABLE READ snapshot when called outside a transaction, so appends that
    commit meanwhile are not mistaken for tampering.
    """
    if connection.in_atomic_block:
        return _verify(batch)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        return _verify(batch)


def _verify(batch: int) -> VerifyReport:
    report = VerifyReport()
    head = LedgerHead.objects.filter(pk=1).first()
    report.head_seq = head.seq if head else None
    trails = [factory() for factory in TRAILS]
    last: list[LedgerEntry] = []

    def tap(rows: Iterable[LedgerEntry]) -> Iterator[LedgerEntry]:
        for row in rows:
            report.rows += 1
            for trail in trails:
                trail.see(row)
            last[:] = [row]
            yield row

    rows = tap(stream_rows(batch))
    report.chain = verify_chain(rows, head_seq=report.head_seq)
    for _ in rows:  # the rest of the chain still feeds the trails
        pass
    if report.chain is None:
        report.chain = _check_head(head, last[0] if last else None, report.rows)
    report.drift = [problem for trail in trails for problem in trail.finish(report)]
    return report


def _check_head(
    head: LedgerHead | None, last: LedgerEntry | None, rows: int
) -> ChainProblem | None:
    if head is None:
        if last is None:
            return None
        return ChainProblem(
            last.seq, rows, "deleted", "the signed chain head is missing: it was deleted"
        )
    if not hmac.compare_digest(head.mac, head_mac(head.seq, head.entry_hash)):
        return ChainProblem(
            head.seq,
            head.seq,
            "mutated",
            f"the signed chain head (seq {head.seq}) does not match its signature",
        )
    last_seq = last.seq if last else 0
    if head.seq > last_seq:
        missing = (
            f"row {head.seq} is missing"
            if head.seq == last_seq + 1
            else f"rows {last_seq + 1}-{head.seq} are missing"
        )
        return ChainProblem(
            last_seq + 1,
            rows + 1,
            "deleted",
            f"{missing}: the chain ends at seq {last_seq} but its signed head is seq {head.seq}",
        )
    if last is not None and head.seq == last.seq and head.entry_hash != last.entry_hash:
        return ChainProblem(
            last.seq,
            rows,
            "mutated",
            f"row {last.seq} is not the row the signed head records",
        )
    return None


def check(batch: int = VERIFY_BATCH) -> VerifyReport:
    """Verify now and keep the result (the beat task, "verify now" and ``ledger verify``)."""
    report = verify(batch)
    LedgerCheck.objects.update_or_create(
        pk=1,
        defaults={"checked_at": datetime.now(UTC), "ok": report.ok, "report": report.as_dict()},
    )
    return report


def last_check() -> LedgerCheck:
    """The stored result; the first ever read runs the check once."""
    stored = LedgerCheck.objects.filter(pk=1).first()
    if stored is None:
        check()
        stored = LedgerCheck.objects.get(pk=1)
    return stored
