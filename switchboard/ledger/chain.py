"""The ledger: one append-only table of hash-chained decisions, in several chains.

Each row's ``entry_hash`` is an HMAC-SHA256, under ``settings.LEDGER_KEY``, of the canonical JSON
of the row (every column but the hash) including ``prev_hash``, the hash of the previous row of
its chain. A database writer without the key cannot forge a consistent chain. The append happens
in the same transaction as the change it records (a rolled-back change leaves no row).

Chains. Chain 0 holds every declaration and decision the Python ``append`` writes (policies,
pauses, limits, quarantines, waivers, endpoints, tokens, todos). The ``limits.grant`` and
``limits.end`` rows the claim and ending statements write (``ledger_append_row``, ledger
migrations 0008 and 0009) go to one of ``GRANT_CHAINS`` grant chains: the statement takes the
first grant chain whose lock it can get, starting at ``pg_backend_pid() % GRANT_CHAINS``, and
waits on one only when all are busy, so named claims no longer queue on one lock held through
each other's commits. (A transaction already holding a chain's lock appends there again: a
transaction holding chain 0 writes its grant and end rows to chain 0, so no one holding chain 0
ever waits for a grant chain and the locks cannot deadlock.) Each chain has its own advisory
lock (``APPEND_LOCK_KEY + chain``), its own gapless position (``chain_pos``: 1, 2, 3...), its own
``prev_hash`` links, and its own signed head (``LedgerHead``, ``id`` = the chain). Rows of a
grant chain hash two members more, ``chain`` and ``chain_pos``; rows of chain 0 hash exactly
what they always did, so a ledger written before the grant chains verifies byte for byte.

``seq`` is the table's one order across chains: drawn from the sequence ``ledger_seq`` under the
chain's lock, so it rises along each chain; the rows of the other chains take the numbers in
between, and an append that rolls back leaves its number unused, so ``seq`` has gaps (by design;
``verify`` checks ``chain_pos`` for gaps instead).

That order is causal for every replay that reads the ledger in ``seq`` order (``limits verify``,
the quarantine manifests, the admission trail): a row's ``seq`` is drawn late in its
transaction, after every lock its statement takes and while the chain's lock is held to commit.
- A grant's ``seq`` is drawn inside its claim statement after its gates' locks on the limits it
  names (their advisory locks, ``admission.limits.locks``); a ``limits.set`` / ``limits.delete`` /
  ``limits.quarantine`` row draws its ``seq`` holding the limit's lock exclusively. So a grant
  and a change of a limit it names never overlap: the one that locked first also drew first,
  and committed before the other could lock. The grant's row follows every change its gate saw.
- An end row names a grant already committed (it ends the claim that holds it, read from the
  todo row), so its ``seq`` was drawn after the grant's transaction ended: end follows grant. A
  takeover's end and new grant come from one statement, end first.
- Two grants of one limit whose gates ran at once (shared locks, far from the cap) may take
  their seqs in either order; neither gate counted the other, and both fit (that is what "far
  from the cap" means), so the replay's count at either row is still within the limit.

A chain whose last rows were deleted is still a consistent chain, so every append also signs its
chain's head (the last seq, chain_pos and hash). ``verify`` compares each chain with its head,
which catches a deleted tail; every chain's head exists from the start (the migration makes
them, or the first append on an empty ledger), so a missing head is a deleted chain.

``verify()`` is the full check that ``manage.py ledger verify`` and the console's chain badge run:
the rows, streamed in seq order in batches, each checked against its chain; then every head;
then every registered trail (admission's compares each live policy with its last audited
``after``).
"""

from __future__ import annotations

import decimal
import functools
import hashlib
import hmac
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from django.conf import settings
from django.db import connection, transaction

from switchboard.ledger.models import GRANT_CHAINS, LedgerCheck, LedgerEntry, LedgerHead

GENESIS_HASH = "0" * 64
# pg_advisory_xact_lock key for appends to chain 0: "ledger" in ASCII; chain k's is this + k.
APPEND_LOCK_KEY = 0x6C6564676572
# Taken by the first append to a chain with no rows yet (SQL function ledger_genesis).
GENESIS_LOCK_KEY = APPEND_LOCK_KEY + 0x100
CHAINS = tuple(range(GRANT_CHAINS + 1))
# The transaction-local setting naming the chain whose lock the transaction holds.
HELD_CHAIN_SETTING = "switchboard.ledger_chain"
# Rows read per query while verifying: the chain is streamed, never loaded whole.
VERIFY_BATCH = 2000
# The problem of a chain that does not hold an anchor given from outside (``--expect``).
ANCHOR_MISMATCH = "anchor_mismatch"
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
    fields = {
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
    if row.chain:
        # Grant chains only: chain 0's rows hash what they always did.
        fields |= {"chain": row.chain, "chain_pos": row.chain_pos}
    return fields


def _mac(message: bytes) -> str:
    return hmac.new(settings.LEDGER_KEY.encode(), message, hashlib.sha256).hexdigest()


def keyed_digest(purpose: str, text: str) -> str:
    """A short digest of a value the ledger must not keep (a hook URL may hold a secret), keyed
    by the ledger key: rows show that it changed, and nobody without the key can test guesses
    of it against them. ``purpose`` keeps it apart from every other keyed value."""
    return _mac(f"digest:{purpose}:".encode() + text.encode())[:16]


def compute_hash(row: LedgerEntry) -> str:
    return _mac(canonical(_hashed_fields(row)))


def head_mac(seq: int, entry_hash: str, *, chain: int = 0, chain_pos: int = 0) -> str:
    """The signature of a chain's head (``LedgerHead.mac``): chain 0's as it always was, a grant
    chain's naming the chain and the position too (a head cannot pass for another chain's)."""
    if chain == 0:
        return _mac(f"ledger-head:{seq}:{entry_hash}".encode())
    return _mac(f"ledger-head:{chain}:{chain_pos}:{seq}:{entry_hash}".encode())


class LedgerHeadMissing(RuntimeError):
    """A chain's signed head is gone while the ledger has rows: appends refuse (fail closed)."""


def append(
    *,
    kind: str,
    actor: Actor,
    scope: str = "",
    queue: str = "",
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> LedgerEntry:
    """Append one row to chain 0 in the caller's transaction (opened here if there is none).

    Lock order: a caller holding an admission policy row lock may append (policy, then ledger);
    nothing that holds the ledger lock takes a policy lock. A transaction holding a grant chain
    may append here (grant chain, then chain 0); one holding chain 0 writes its own grant and end
    rows to chain 0, never waiting for a grant chain.
    """
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_advisory_xact_lock(%s), set_config(%s, '0', true)",
                [APPEND_LOCK_KEY, HELD_CHAIN_SETTING],
            )
            # A statement of its own (a snapshot after the lock): the head the last holder wrote,
            # and the row's seq, drawn under the lock (none drawn for a chain with no rows yet).
            cursor.execute(_HEAD_SQL)
            head = cursor.fetchone()
            if head is None or head[2] is None:
                cursor.execute("SELECT ledger_genesis(%s, %s)", list(hmac_pads()))
                cursor.execute(_HEAD_SQL.replace("chain_pos > 0", "true"))
                head = cursor.fetchone()
                if head is None:
                    raise LedgerHeadMissing(
                        "the signed head of ledger chain 0 is missing: see manage.py ledger verify"
                    )
        chain_pos, prev_hash, seq = head[0] + 1, head[1], head[2]
        row = LedgerEntry(
            seq=seq,
            chain=0,
            chain_pos=chain_pos,
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
                "UPDATE admission_ledgerhead SET seq = %s, chain_pos = %s, entry_hash = %s, "
                "mac = %s WHERE id = 0",
                [seq, chain_pos, row.entry_hash, head_mac(seq, row.entry_hash)],
            )
        return row


# Chain 0's head and, unless the chain has no rows yet (ledger_genesis first, which may restart
# the sequence), the next seq.
_HEAD_SQL = (
    "SELECT chain_pos, entry_hash, CASE WHEN chain_pos > 0 THEN nextval('ledger_seq') END "
    "FROM admission_ledgerhead WHERE id = 0"
)


# --- the one-round-trip append (SQL function ledger_append_row, ledger migration 0009) ---------


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
    it). ``kind`` is ``limits.grant`` or ``limits.end``: the row goes to a grant chain (or to the
    chain this transaction holds already), whose lock is taken inside the call and held to the
    end of the transaction."""
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
    """``value`` as jsonb gives it back: JSON types only, and no negative zero (jsonb's numeric
    has none: a rate of -0.0 hashed as written read back as 0.0, and its row no longer matched
    its hash, a false alarm anyone allowed to set a rate could raise)."""
    if value is None:
        return None
    loaded: dict[str, Any] = json.loads(json.dumps(value, default=str), parse_float=_jsonb_float)
    return loaded


def _jsonb_float(text: str) -> float | int:
    """A JSON number with a fraction or an exponent, as it reads back from jsonb: numeric
    writes ``1e+16`` out in digits, which read back as an int, and has no negative zero."""
    if "e" in text.lower():
        exact = decimal.Decimal(text)
        if exact == exact.to_integral_value():
            return int(exact)
    return float(text) + 0.0  # -0.0 + 0.0 is 0.0


# Rows written before ``_normalise`` dropped negative zeros: a row whose hash matches once some
# of its zeros are negative again is sound (only the key makes a matching hash). Past this many
# zeros in one row the variants are not tried.
_NEGATIVE_ZERO_TRIES = 6


def _hashed_with_negative_zeros(row: LedgerEntry) -> bool:
    """Whether ``row`` matches its hash with some of its float zeros written as -0.0, as rows
    were hashed before the fix."""
    zeros: list[tuple[Any, Any]] = []

    def walk(node: Any) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, item in items:
            if isinstance(item, float) and item == 0.0:
                zeros.append((node, key))
            elif isinstance(item, dict | list):
                walk(item)

    for side in (row.before, row.after):
        if isinstance(side, dict | list):
            walk(side)
    if not zeros or len(zeros) > _NEGATIVE_ZERO_TRIES:
        return False
    try:
        for mask in range(1, 2 ** len(zeros)):
            for bit, (node, key) in enumerate(zeros):
                node[key] = -0.0 if mask >> bit & 1 else 0.0
            if compute_hash(row) == row.entry_hash:
                return True
        return False
    finally:
        for node, key in zeros:
            node[key] = 0.0


# --- verification -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ChainProblem:
    """The first place the ledger breaks.

    ``seq`` names the row at fault (for a deletion, the first seq the missing row could have had:
    the seq after its chain's previous row); ``position`` is the 1-based place in seq order where
    that row is, or should be. ``chain`` is the chain it belongs to (the detail names a grant
    chain; ``as_dict`` keeps its shape).
    """

    seq: int
    position: int
    problem: str  # mutated | deleted | reordered | inserted | anchor_mismatch
    detail: str
    chain: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "position": self.position,
            "problem": self.problem,
            "detail": self.detail,
        }

    @property
    def said(self) -> str:
        """The problem in one line, for the commands: where (when there is a row to point at),
        what and why."""
        if self.problem == ANCHOR_MISMATCH:
            # Not a verdict on the chain: the anchor may be the one at fault (its detail says so).
            return f"MISMATCH: {self.detail}"
        where = f" at seq {self.seq}, position {self.position}" if self.seq else ""
        return f"BROKEN{where}: {self.problem}: {self.detail}"


def _lookup_seq(entry_hash: str) -> LedgerEntry | None:
    return LedgerEntry.objects.filter(entry_hash=entry_hash).first()


def _lookup_pos(chain: int, chain_pos: int) -> bool:
    """Whether chain ``chain`` has a row at ``chain_pos`` anywhere (a moved row, not a lost one)."""
    return LedgerEntry.objects.filter(chain=chain, chain_pos=chain_pos).exists()


def _written_seq(
    row: LedgerEntry, lookup: Callable[[str], LedgerEntry | None], depth: int = 0
) -> int | None:
    """The seq a chain-0 row was written with, if it can be proven: the row hashes correctly
    under it.

    A row's predecessor is the row whose hash it links to; the row was written right after it
    (chain 0's rows from before the grant chains have consecutive seqs). The predecessor may
    itself have moved, so its own written seq is found the same way.
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


@dataclass
class _ChainState:
    """One chain as the stream has shown it so far."""

    prev: str = GENESIS_HASH
    pos: int = 0  # the last chain_pos seen
    seq: int = 0  # the seq of the last row seen
    position: int = 0  # its place in the stream


def _named(chain: int, text: str) -> str:
    return text if chain == 0 else f"chain {chain}: {text}"


def verify_chain(
    rows: Iterable[LedgerEntry],
    *,
    heads: dict[int, LedgerHead] | None = None,
    lookup: Callable[[str], LedgerEntry | None] = _lookup_seq,
    lookup_pos: Callable[[int, int], bool] = _lookup_pos,
    states: dict[int, _ChainState] | None = None,
) -> ChainProblem | None:
    """Recompute every chain over rows in seq order; name the first row that breaks one.

    Rows may be any iterable (``verify`` streams them) and mix the chains: each row must be the
    next of its own chain (``chain_pos`` one more, ``prev_hash`` the last row's hash) and hash
    correctly. ``heads``, when known, are the signed heads: rows past their chain's head were
    not written by an append. ``states`` (filled in) is each chain as last seen.
    """
    chains: dict[int, _ChainState] = {} if states is None else states
    for position, row in enumerate(rows, start=1):
        c = row.chain
        state = chains.setdefault(c, _ChainState())
        expected = state.pos + 1
        # (A chain's missing head is named after the stream, by _check_heads.)
        if heads is not None and ((c in heads and row.seq > heads[c].seq) or c not in CHAINS):
            signed = f"the signed head (seq {heads[c].seq})" if c in heads else "no signed head"
            return ChainProblem(
                row.seq,
                position,
                "inserted",
                _named(
                    c,
                    f"row {row.seq} ({row.kind}) is past {signed}: "
                    "it was not written by the ledger",
                ),
                c,
            )
        if row.chain_pos != expected:
            if row.chain_pos > expected and not lookup_pos(c, expected):
                missing = (
                    f"the row at chain position {expected} is missing"
                    if row.chain_pos == expected + 1
                    else f"the rows at chain positions {expected}-{row.chain_pos - 1} are missing"
                )
                return ChainProblem(
                    state.seq + 1,
                    position,
                    "deleted",
                    _named(
                        c,
                        f"{missing}: after seq {state.seq} the chain goes on at seq {row.seq} "
                        f"(chain position {row.chain_pos})",
                    ),
                    c,
                )
            return ChainProblem(
                row.seq,
                position,
                "reordered",
                _named(
                    c,
                    f"the row at seq {row.seq} is the chain's row {row.chain_pos}, where row "
                    f"{expected} belongs: rows were moved",
                ),
                c,
            )
        recomputed = compute_hash(row)
        if recomputed != row.entry_hash and _hashed_with_negative_zeros(row):
            recomputed = row.entry_hash
        if row.prev_hash != state.prev or recomputed != row.entry_hash:
            return _classify(row, position, state.prev, recomputed, lookup)
        state.prev, state.pos, state.seq, state.position = (
            row.entry_hash,
            row.chain_pos,
            row.seq,
            position,
        )
    return None


def _classify(
    row: LedgerEntry,
    position: int,
    prev: str,
    recomputed: str,
    lookup: Callable[[str], LedgerEntry | None],
) -> ChainProblem:
    c = row.chain
    if recomputed == row.entry_hash:
        # The row is authentic but does not follow the row before it.
        return ChainProblem(
            row.seq,
            position,
            "reordered",
            _named(
                c,
                f"row {row.seq} ({row.kind}) is intact but links to {row.prev_hash[:12]}…, "
                f"not to the row before it ({prev[:12]}…)",
            ),
            c,
        )
    if row.prev_hash != prev:
        written = _written_seq(row, lookup) if c == 0 else None
        if written is not None and written != row.seq:
            return ChainProblem(
                row.seq,
                position,
                "reordered",
                f"the row at seq {row.seq} is the row written as seq {written} ({row.kind}): "
                "rows were moved",
                c,
            )
        return ChainProblem(
            row.seq,
            position,
            "mutated",
            _named(
                c,
                f"row {row.seq} ({row.kind}) links to {row.prev_hash[:12]}…, but the row "
                f"before it hashes to {prev[:12]}…, and its content does not match its hash",
            ),
            c,
        )
    return ChainProblem(
        row.seq,
        position,
        "mutated",
        _named(c, f"row {row.seq} ({row.kind}) does not match its hash: its content was changed"),
        c,
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


def differences(audited: dict[str, Any], current: dict[str, Any]) -> str:
    """What a live row's state differs in from its last audited one, field by field (a trail's
    ``changed_outside_audit`` detail)."""
    keys = sorted(set(audited) | set(current))
    return "; ".join(
        f"{k} audited {audited.get(k)!r}, now {current.get(k)!r}"
        for k in keys
        if audited.get(k) != current.get(k)
    )


def register_trail(factory: Callable[[], Trail]) -> None:
    if factory not in TRAILS:
        TRAILS.append(factory)


@dataclass
class VerifyReport:
    rows: int = 0
    # The highest seq a signed head records: the ledger's last row (seq has gaps: see above).
    head_seq: int | None = None
    chain: ChainProblem | None = None
    drift: list[Any] = field(default_factory=list)
    # Live rows the trails compared with the chain (admission's: its policies).
    policies: int = 0
    # Per chain: its rows (the last chain_pos its signed head records), its head's seq and hash.
    chains: dict[int, dict[str, Any]] = field(default_factory=dict)
    # Per chain, the furthest head any stored check has seen (``check``): a head behind it was
    # rolled back.
    high_water: dict[int, dict[str, Any]] = field(default_factory=dict)

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
            "chains": {str(c): dict(v) for c, v in sorted(self.chains.items())},
            "high_water": {str(c): dict(v) for c, v in sorted(self.high_water.items())},
            "drift": [d.as_dict() for d in self.drift],
        }


def stream_rows(batch: int = VERIFY_BATCH) -> Iterator[LedgerEntry]:
    """Every ledger row in seq order, every chain, read ``batch`` rows at a time (keyset
    pagination)."""
    after = 0
    while True:
        rows = list(LedgerEntry.objects.filter(seq__gt=after).order_by("seq")[:batch])
        yield from rows
        if len(rows) < batch:
            return
        after = rows[-1].seq


def verify(batch: int = VERIFY_BATCH) -> VerifyReport:
    """The full check: every chain and its signed head, then every policy against its audit.

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
    heads = {head.id: head for head in LedgerHead.objects.all()}
    report.head_seq = max((h.seq for h in heads.values()), default=None)
    report.chains = {
        c: {"rows": h.chain_pos, "head_seq": h.seq, "head_hash": h.entry_hash}
        for c, h in sorted(heads.items())
    }
    trails = [factory() for factory in TRAILS]
    states: dict[int, _ChainState] = {}

    def tap(rows: Iterable[LedgerEntry]) -> Iterator[LedgerEntry]:
        for row in rows:
            report.rows += 1
            for trail in trails:
                trail.see(row)
            yield row

    rows = tap(stream_rows(batch))
    # No heads at all is an empty ledger (rows without heads are caught below, by chain 0).
    report.chain = verify_chain(rows, heads=heads or None, states=states)
    for _ in rows:  # the rest of the chain still feeds the trails
        pass
    if report.chain is None:
        report.chain = _check_heads(heads, states, report.rows)
    report.drift = [problem for trail in trails for problem in trail.finish(report)]
    return report


def _check_heads(
    heads: dict[int, LedgerHead], states: dict[int, _ChainState], rows: int
) -> ChainProblem | None:
    """Each chain against its signed head, chain 0 first; every chain has a head (the migration
    made them all) unless the ledger is empty."""
    if not heads:
        if not states:
            return None
        c = min(states)
        return ChainProblem(
            states[c].seq,
            rows,
            "deleted",
            _named(c, "the signed chain head is missing: it was deleted"),
            c,
        )
    for c in CHAINS:
        problem = _check_head(c, heads.get(c), states.get(c, _ChainState()), rows)
        if problem is not None:
            return problem
    return None


def _check_head(
    c: int, head: LedgerHead | None, last: _ChainState, rows: int
) -> ChainProblem | None:
    if head is None:
        # With its rows gone too there is no row to point at: seq and position 0 (no place).
        return ChainProblem(
            last.seq,
            last.position,
            "deleted",
            f"the signed head of chain {c} is missing: it was deleted"
            + (f" (the chain's rows end at seq {last.seq})" if last.pos else " with its rows"),
            c,
        )
    expected_mac = head_mac(head.seq, head.entry_hash, chain=c, chain_pos=head.chain_pos)
    if not hmac.compare_digest(head.mac, expected_mac):
        return ChainProblem(
            head.seq,
            _place_of(head.seq),
            "mutated",
            _named(c, f"the signed chain head (seq {head.seq}) does not match its signature"),
            c,
        )
    if head.chain_pos > last.pos:
        # One row missing, or every row: the head names the last one's seq, and the problem
        # points where it belonged. More after a row left: they lie after that row.
        single = head.chain_pos == last.pos + 1
        if single or not last.pos:
            seq, position = head.seq, _place_of(head.seq)
        else:
            seq, position = last.seq + 1, last.position + 1
        missing = (
            f"row {head.seq} is missing"
            if single
            else f"all {head.chain_pos} rows of the chain, up to seq {head.seq}, are missing"
            if not last.pos
            else f"the {head.chain_pos - last.pos} rows after seq {last.seq} up to seq "
            f"{head.seq} are missing"
        )
        return ChainProblem(
            seq,
            position,
            "deleted",
            _named(
                c,
                f"{missing}: "
                + (f"the chain ends at seq {last.seq} but " if last.pos else "")
                + f"its signed head is seq {head.seq} (chain position {head.chain_pos})",
            ),
            c,
        )
    if last.pos and (head.seq != last.seq or head.entry_hash != last.prev):
        return ChainProblem(
            last.seq,
            last.position,
            "mutated",
            _named(c, f"row {last.seq} is not the row the signed head records"),
            c,
        )
    if last.pos and head.chain_pos != last.pos:
        # Chain 0's signature covers its seq and hash only (as it always did): a position
        # lowered under it passed, and each append then took a position a row already had.
        return ChainProblem(
            last.seq,
            last.position,
            "mutated",
            _named(
                c,
                f"the signed head records chain position {head.chain_pos}, but its row "
                f"(seq {last.seq}) is at position {last.pos}",
            ),
            c,
        )
    return None


def _place_of(seq: int) -> int:
    """The 1-based place in seq order a row of ``seq`` has, or would have."""
    return LedgerEntry.objects.filter(seq__lt=seq).count() + 1


def check(
    batch: int = VERIFY_BATCH, *, expect: Sequence[tuple[int, dict[str, Any]]] = ()
) -> VerifyReport:
    """Verify now and keep the result (the beat task, "verify now" and ``ledger verify``).

    Beyond ``verify``: every chain's head must be at or past the furthest head a stored check
    has seen (the report's ``high_water``, kept across checks, never lowered, and moved only by
    a check that finds the chain sound, so a rollback stays reported until someone resets the
    mark: ``ledger verify --reset-mark``). A database writer
    who saved an earlier signed head can delete the rows after it and put it back: the chain
    then verifies on its own, and only a record of the later head shows the rollback. The stored
    check is such a record, in the same database (so a writer who also rolls it back, or deletes
    it, is not caught here); ``expect`` (``ledger verify --expect``) holds heads recorded
    outside it (``anchor_mark``'s pairs; a chain may have several, and each is checked) the same
    way, and answered to the caller only: the stored check (the
    console's badge, ``/metrics``) is what the database itself shows. An anchor is its holder's
    evidence: a mistyped one would otherwise raise everyone's alarm, which the next check,
    without it, cleared again.
    """
    stored = LedgerCheck.objects.filter(pk=1).values_list("report", flat=True).first()
    report = verify(batch)
    seen, unreadable = _high_water(stored)
    if report.chain is None:
        report.chain = unreadable or rolled_back(report, seen)
    with transaction.atomic():
        # Under the row's lock, with what a check that ran meanwhile stored: a slower check
        # (an earlier snapshot) never lowers the mark a faster one raised.
        latest = (
            LedgerCheck.objects.select_for_update()
            .filter(pk=1)
            .values_list("report", flat=True)
            .first()
        )
        marks = _furthest(_high_water(latest)[0], seen)
        # Only a sound chain moves the mark: past a rollback found now, the heads are the
        # rolled-back ones, and taking them as the mark would clear the alarm at the next check.
        report.high_water = _furthest(marks, report.chains) if report.chain is None else marks
        LedgerCheck.objects.update_or_create(
            pk=1,
            defaults={
                "checked_at": datetime.now(UTC),
                "ok": report.ok,
                "report": report.as_dict(),
            },
        )
    # Every anchor given, the earliest place first. (They were kept by chain, so of a chain's
    # anchors only the last given was checked: one mistyped or from another ledger passed.)
    for chain, mark in sorted(expect, key=lambda anchor: (anchor[0], anchor[1]["rows"])):
        if report.chain is not None:
            break
        report.chain = rolled_back(report, {chain: mark}, anchors=True)
    return report


def _high_water(
    stored: dict[str, Any] | None,
) -> tuple[dict[int, dict[str, Any]], ChainProblem | None]:
    """The furthest heads a stored report records (a report from before ``high_water`` existed
    records its own heads, without their hashes), and, when a mark is not one a check writes,
    the problem that is: only a writer outside Switchboard makes one. Such a mark crashed every
    check (so ``--expect`` too) and left the verdict as that writer put it; its well-formed
    marks still count."""
    if not stored:
        return {}, None
    marks = stored.get("high_water") or stored.get("chains") or {}
    if not isinstance(marks, dict):
        return {}, _unreadable_mark(f"high_water is {type(marks).__name__}, not an object")
    out: dict[int, dict[str, Any]] = {}
    bad: list[str] = []
    for c, mark in marks.items():
        if _is_mark(c, mark):
            out[int(c)] = dict(mark)
        else:
            bad.append(f"chain {c!r}: {json.dumps(mark)[:80]}")
    return out, _unreadable_mark("; ".join(bad)) if bad else None


def _is_mark(chain: Any, mark: Any) -> bool:
    def count(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    return (
        isinstance(chain, str)
        and chain.isascii()
        and chain.isdigit()
        and int(chain) in CHAINS
        and isinstance(mark, dict)
        and count(mark.get("rows"))
        and count(mark.get("head_seq", 0))
        and isinstance(mark.get("head_hash", ""), str | None)
    )


def _unreadable_mark(what: str) -> ChainProblem:
    return ChainProblem(
        0,
        0,
        "mutated",
        f"the stored check's mark of the furthest heads seen is not one a check writes ({what}):"
        " it was written outside Switchboard, and a rollback it recorded may be hidden; once "
        "that is dealt with, `ledger verify --reset-mark` records the heads as they are",
    )


def _furthest(
    seen: dict[int, dict[str, Any]], now: dict[int, dict[str, Any]]
) -> dict[int, dict[str, Any]]:
    out = dict(seen)
    for c, head in now.items():
        if c not in out or head["rows"] >= out[c]["rows"]:
            out[c] = dict(head)
    return out


def _apart(shown: str, other: str, least: int = 12) -> str:
    """``shown`` cut short, but past where it first differs from ``other``: an anchor mistyped in
    its last digit read "(hash 30eb12a1016d…) … is another row (30eb12a1016d…)"."""
    same = next((i for i, (a, b) in enumerate(zip(shown, other, strict=False)) if a != b), 0)
    return shown[: max(least, same + 4)]


def anchor_mark(chain: int, position: int, entry_hash: str) -> tuple[int, dict[str, Any]]:
    """An anchor kept outside the database (``CHAIN:POSITION:HASH``, as ``ledger verify``
    prints a head) as a mark for ``check(expect=...)``: with the seq of the row at that place
    now, if there is one (0: none, so the problem names no place)."""
    seq = (
        LedgerEntry.objects.filter(chain=chain, chain_pos=position)
        .values_list("seq", flat=True)
        .first()
    )
    return chain, {"rows": position, "head_seq": seq or 0, "head_hash": entry_hash}


def rolled_back(
    report: VerifyReport, marks: dict[int, dict[str, Any]], *, anchors: bool = False
) -> ChainProblem | None:
    """The first chain that no longer holds a head recorded earlier: ``marks`` is chain ->
    ``rows`` (a chain position), ``head_seq`` and, when known, ``head_hash``.

    ``anchors``: the marks are anchors given from outside (``ledger verify --expect``), typed or
    pasted by a person, so a mismatch may be the anchor's fault as well as the ledger's: the
    problem is ``anchor_mismatch`` and says both. A mark the stored check kept is the database's
    own record, so not holding it is a rollback (``deleted``).

    A chain that verifies and whose signed head is at or past the mark still holds the marked
    row, unless the chain was rolled back and has grown again since: so the row now at the
    mark's position must be the marked one (its hash; one indexed read per chain). Without
    the key nothing else can write a row that verifies."""
    for c, mark in sorted(marks.items()):
        head = report.chains.get(c)
        rows = head["rows"] if head else 0
        marked = mark.get("head_hash")
        now: str | None = None  # the hash at the marked position, when the chain reaches it
        if rows >= mark["rows"]:
            if not marked or not mark["rows"]:
                continue
            now = (
                LedgerEntry.objects.filter(chain=c, chain_pos=mark["rows"])
                .values_list("entry_hash", flat=True)
                .first()
            )
            if now == marked:
                continue
            found = (
                f"the row at chain position {mark['rows']} is another row "
                f"({_apart(now or '', marked)}…)"
            )
        else:
            found = (
                f"its signed head is at chain position {rows} (seq {head['head_seq']})"
                if head
                else "it has no signed head"
            )
        # An anchor from outside (``--expect``) past the rows left has no seq to name: 0.
        seq = mark.get("head_seq") or 0
        facts = [f"seq {seq}"] if seq else []
        facts += [f"hash {marked[:12]}…"] if marked else []
        recorded = f"chain position {mark['rows']}" + (f" ({', '.join(facts)})" if facts else "")
        if anchors:
            # The anchor's own seq is not known (it is not part of it): say what it names.
            anchor = f"chain position {mark['rows']} (hash {_apart(marked or '', now or '')}…)"
            return ChainProblem(
                seq,
                _place_of(seq) if seq else 0,
                ANCHOR_MISMATCH,
                _named(
                    c,
                    f"the anchor given, {anchor}, does not match this ledger: {found}. Either "
                    "the anchor was mistyped or taken from another ledger, or rows were deleted "
                    "and an earlier signed head put back",
                ),
                c,
            )
        return ChainProblem(
            seq,
            _place_of(seq) if seq else 0,
            "deleted",
            _named(
                c,
                f"rolled back: {found}, but {recorded} was recorded before: rows were deleted "
                "and an earlier signed head put back",
            ),
            c,
        )
    return None


def last_check() -> LedgerCheck:
    """The stored result; the first ever read runs the check once."""
    stored = LedgerCheck.objects.filter(pk=1).first()
    if stored is None:
        check()
        stored = LedgerCheck.objects.get(pk=1)
    return stored
