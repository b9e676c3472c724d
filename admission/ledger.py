"""The ledger: one append-only, hash-chained table of decisions.

Each row's ``entry_hash`` is an HMAC-SHA256, under ``settings.LEDGER_KEY``, of the canonical JSON
of the row (every column but the hash) including ``prev_hash``, the previous row's hash. A database
writer without the key cannot forge a consistent chain. Appends take one transaction-scoped
advisory lock, so ``seq`` has no gaps and the chain never forks; the append happens in the same
transaction as the change it records (a rolled-back change leaves no row).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from admission.models import LedgerEntry

GENESIS_HASH = "0" * 64
# pg_advisory_xact_lock key for appends: "ledger" in ASCII.
APPEND_LOCK_KEY = 0x6C6564676572


@dataclass(frozen=True)
class Actor:
    """Who is accountable: always a human when one exists, and the endpoint that acted, if any."""

    human_id: int | None = None
    human_name: str = ""
    endpoint_id: Any = None
    endpoint_slug: str = ""


def canonical(entry: dict[str, Any]) -> bytes:
    return json.dumps(entry, sort_keys=True, separators=(",", ":"), default=str).encode()


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


def compute_hash(row: LedgerEntry) -> str:
    key = settings.LEDGER_KEY.encode()
    return hmac.new(key, canonical(_hashed_fields(row)), hashlib.sha256).hexdigest()


def append(
    *,
    kind: str,
    actor: Actor,
    scope: str = "",
    queue: str = "",
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> LedgerEntry:
    """Append one row in the caller's transaction (opened here if there is none)."""
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
        return row


def _normalise(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is None:
        return None
    loaded: dict[str, Any] = json.loads(json.dumps(value, default=str))
    return loaded


@dataclass(frozen=True)
class ChainProblem:
    seq: int
    position: int  # 1-based position in seq order
    problem: str  # mutated | deleted | reordered | inserted | policy_drift
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "position": self.position,
            "problem": self.problem,
            "detail": self.detail,
        }


def verify_chain(rows: list[LedgerEntry]) -> ChainProblem | None:
    """Recompute the chain over rows in seq order; name the first row that breaks it."""
    prev = GENESIS_HASH
    expected_seq = 1
    for position, row in enumerate(rows, start=1):
        if row.seq != expected_seq:
            if row.seq > expected_seq:
                return ChainProblem(
                    row.seq,
                    position,
                    "deleted",
                    f"row {expected_seq} is missing: seq jumps from {expected_seq - 1} to {row.seq}",
                )
            return ChainProblem(
                row.seq, position, "reordered", f"seq {row.seq} appears where {expected_seq} belongs"
            )
        recomputed = compute_hash(row)
        if row.prev_hash != prev:
            problem = "reordered" if recomputed == row.entry_hash else "mutated"
            return ChainProblem(
                row.seq,
                position,
                problem,
                f"row {row.seq} links to {row.prev_hash[:12]}…, "
                f"but the row before it hashes to {prev[:12]}…",
            )
        if recomputed != row.entry_hash:
            return ChainProblem(
                row.seq,
                position,
                "mutated",
                f"row {row.seq} ({row.kind}) does not match its hash: its content was changed",
            )
        prev = row.entry_hash
        expected_seq += 1
    return None
