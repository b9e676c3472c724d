"""The claim, top to bottom: pick a candidate, let every gate admit it, write the claim.

``claim_next`` (an agent's next todo) and ``claim`` (one todo, by an agent or an operator) run
the same steps; the gates (``queues.gates``: admission's budgets, later pools, tags and rate
limits) are asked in their lock order and never named here.

1. The candidate: the oldest claimable todo (``FOR UPDATE SKIP LOCKED``; with a queue priority
   registered for some of the queues, the highest score first: ``queues.gates.Priority``), or the one todo
   (``FOR UPDATE``). The statement folds in each gate's probe and claims at once when no gate
   claims the row: one statement, committed on its own. claim_next first tries the bare form
   of that statement (no gate's skip or verdict in its plan, so the cheapest to run); only a
   candidate some gate claims sends it to the full form, and the endpoint's next claims go
   there directly for a while (a hint; each statement decides for itself).
   The statement passes over the rows a per-todo gate (a pool, tags, a rate limit) would
   refuse now, so a todo held by its own limit never hides the next one behind it.
2. Otherwise, before any lock, each gate's pre-read excludes the queues it refuses now.
3. In one transaction, for each gated candidate: a savepoint; each gate admits under its own
   lock; a refusal rolls back to the savepoint (releasing every gate lock taken for it), passes
   over that queue (a per-todo gate's refusal: that todo) and tries again. ``claim_next`` never
   answers empty while a claimable todo sits in a queue every gate admits and names no limit
   that is full.
4. The claim is written; each admitting gate charges for it in the same transaction.
5. After the transaction: counters, and the refusals recorded (holding no gate lock).
"""

from __future__ import annotations

import logging
import unicodedata
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from django.db import DatabaseError, connection, transaction

from queues import access, gates, metrics, selectors, sql
from queues.access import HUMAN_PREFIX, Actor, AgentActor, HumanActor, acting_endpoint_ids
from queues.models import QUARANTINE_QUEUE, Endpoint, Todo, TodoState, check_queue_name
from queues.services.endpoints import resolve_lease_ttl
from queues.sql import gated
from switchboard.core import availability, tokens, validation
from switchboard.core.errors import Conflict, InvalidArgument, NotFound
from switchboard.core.times import iso
from switchboard.core.tokens import LEASE_TOKEN_PREFIX, hash_token
from switchboard.ledger import chain as ledger
from switchboard.ledger.models import LedgerKind

log = logging.getLogger(__name__)


@dataclass
class Claimed:
    todo: Todo
    attempt: int
    lease_token: str | None = None
    # What the gates report of the claim (admission: the headroom left), or None if ungated.
    admission: dict[str, Any] | None = None

    @property
    def grant(self) -> str | None:
        """The claim's grant: its ``limits.grant`` ledger row's entry_hash (None: no named limit
        passed)."""
        return self.todo.grant_hash


@dataclass
class NothingClaimable:
    """claim_next found nothing: empty, or only deferred work (listed)."""

    deferred: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class _Refused:
    gate: gates.ClaimGate
    refusal: gates.Refusal


def claim_next(
    *,
    actor: AgentActor,
    queue: str | None = None,
    lease_ttl_seconds: int | None = None,
    require_fence: bool = False,
    claimant: str | None = None,
) -> Claimed | NothingClaimable:
    """Claim the oldest claimable todo of the caller's granted queues (or of one of them)."""
    access.check_actor(actor)
    endpoint = actor.endpoint
    granted = [q for q in endpoint.scope_queues if q != QUARANTINE_QUEUE]
    if queue is not None:
        check_queue_name(queue)
        access.check_scope(actor, queue)
        granted = [queue] if queue != QUARANTINE_QUEUE else []
    ttl = resolve_lease_ttl(lease_ttl_seconds, endpoint)
    lease_token, fence_hash = _fence(require_fence)
    who = _claimant(actor, claimant)
    if not granted:
        return NothingClaimable()
    prioritised = gates.prioritised(granted)
    if not sql.recently_gated(endpoint.id):
        # (1) The common path: one statement that commits on its own. It claims at once when no
        # gate claims the candidate or every gate that does admits it inside the statement.
        # First, unless this endpoint met gated work lately, the bare statement: it carries no
        # gate's skip or verdict, so it is the cheapest plan; it claims only a candidate no gate
        # claims and takes over no lapsed claim; any other candidate goes to the full statement
        # below (one some gate claims sends this endpoint's next claims there for a while).
        db = sql.default_connection()  # once for the statement and the counters
        with sql.hot_cursor(db) as cursor:
            availability.check_deadline()  # the connection is in hand: late means no claim
            cand: sql.Candidate | sql.NoCandidate | None = None
            limited = sql.recently_limited(endpoint.id)
            if not limited:
                cand = sql.claim_bare(
                    cursor,
                    endpoint_id=endpoint.id,
                    queues=granted,
                    claimant=who,
                    via=actor.via,
                    ttl=ttl,
                    fence_hash=fence_hash,
                    prioritised=prioritised,
                )
                if isinstance(cand, sql.Candidate) and cand.todo is None:
                    # Gated work marks the endpoint; a takeover is for the full statement.
                    if cand.held:
                        sql.mark_limited(endpoint.id)
                        limited = True
                    cand = None
            if cand is None and limited:
                # Gated work: the lean statement decides a candidate only a budget (a gate on
                # its whole queue identity) claims; anything else (None) is the full one's.
                cand = sql.claim_next_lean(
                    cursor,
                    endpoint_id=endpoint.id,
                    queues=granted,
                    claimant=who,
                    via=actor.via,
                    ttl=ttl,
                    fence_hash=fence_hash,
                    prioritised=prioritised,
                )
            if cand is None:
                # The grant parameters only the full statement binds (its grant row, or the
                # end row of a grant a takeover supersedes).
                ledger = sql.grant_params(access.claim_ledger_actor(actor), who)
                cand = sql.claim_next_candidate(
                    cursor,
                    endpoint_id=endpoint.id,
                    queues=granted,
                    excluded=[],
                    passed=[],
                    claimant=who,
                    via=actor.via,
                    ttl=ttl,
                    fence_hash=fence_hash,
                    prioritised=prioritised,
                    fast=True,
                    ledger=ledger,
                )
        if isinstance(cand, sql.NoCandidate):
            return NothingClaimable(
                deferred=_pause_first(
                    _held_entries(endpoint.id, granted, [], cand)
                    + _paused_entries(endpoint.id, granted)
                )
            )
        if cand.todo is not None:
            report = _fast_report(cand.verdicts) if cand.verdicts else None
            metrics.claimed(
                cand.todo.queue, cand.todo.attempt, charged=report is not None, connection=db
            )
            return Claimed(
                todo=cand.todo,
                attempt=cand.todo.attempt,
                lease_token=lease_token,
                admission=report,
            )
        # A gate said no (or cannot decide in the statement): the locked path decides, and
        # this endpoint's next claims go there directly for a while. Stale parameters alone
        # (a policy just changed) send only this claim there.
        if not any(v is not None and v.get("stale") for v in cand.verdicts):
            sql.mark_gated(endpoint.id)
    # (2) The unlocked pre-read: queues a gate refuses now are excluded without its lock.
    refusals = [
        _Refused(gate, refusal)
        for gate in gates.gates()
        for refusal in gate.pre_read(endpoint.id, granted)
    ]
    excluded = list(dict.fromkeys(r.refusal.queue for r in refusals))
    passed: list[UUID] = []
    granted_open = [q for q in granted if q not in excluded]
    result: Claimed | None = None
    last: sql.Candidate | sql.NoCandidate = sql.NoCandidate(skipped=False)
    ledger = sql.grant_params(access.claim_ledger_actor(actor), who)
    # (3)-(4) One transaction: candidates in turn, each through every gate.
    with transaction.atomic(), sql.hot_cursor() as cursor:
        availability.check_deadline()  # the connection is in hand: late means no claim
        while granted_open:
            last = cand = sql.claim_next_candidate(
                cursor,
                endpoint_id=endpoint.id,
                queues=granted,
                excluded=excluded,
                passed=passed,
                claimant=who,
                via=actor.via,
                ttl=ttl,
                fence_hash=fence_hash,
                prioritised=prioritised,
                ledger=ledger,
            )
            if isinstance(cand, sql.NoCandidate):
                break
            if cand.todo is not None:
                result = Claimed(todo=cand.todo, attempt=cand.todo.attempt, lease_token=lease_token)
                break
            admitted = _admit_and_claim(
                cursor, cand.keys, cand.todo_id, who, actor, ttl, fence_hash
            )
            if isinstance(admitted, _Refused):
                # Each turn passes over one more todo or queue, so the loop ends. The passed
                # todo stays locked by this transaction (others skip it) but no gate lock does.
                if admitted.gate.per_todo:
                    passed.append(cand.todo_id)
                else:
                    excluded.append(cand.queue)
                refusals.append(admitted)
                continue
            admitted.lease_token = lease_token
            result = admitted
            break
        if result is not None:
            metrics.claimed(result.todo.queue, result.attempt, charged=result.admission is not None)
    # (5) A queue the pre-read excluded counts as refused only if it holds pending work: a
    # deferred queue with nothing waiting refuses nobody, and `{"empty": true}` alone means no work.
    per_queue = [r for r in refusals if not r.gate.per_todo]
    entries = [(r, r.gate.deferred_entry(r.refusal, endpoint.id)) for r in per_queue]
    entries = [(r, entry) for r, entry in entries if entry["pending"] > 0]
    if result is not None:
        _record_refusals([r for r, _ in entries] + [r for r in refusals if r.gate.per_todo])
        return result
    # Empty: per-todo refusals are answered by what those gates hold now (their refusals under
    # lock in this claim are among it, unless a slot has freed since).
    _record_refusals([r for r, _ in entries])
    return NothingClaimable(
        deferred=_pause_first(
            [entry for _, entry in entries]
            + _held_entries(endpoint.id, granted_open, passed, last)
            + _paused_entries(endpoint.id, granted, listed={entry["queue"] for _, entry in entries})
        )
    )


def claim(
    *,
    actor: Actor,
    todo_id: UUID,
    lease_ttl_seconds: int | None = None,
    require_fence: bool = False,
    claimant: str | None = None,
) -> Claimed:
    """Claim one todo (the agent's claim, or the operator's board claim on an owned endpoint).

    Locks the row with FOR UPDATE (waiting for another holder), then the same gates as
    claim_next. A refusing gate answers ``deferred`` and nothing changes.
    """
    access.check_actor(actor)
    access.check_writes(actor, "auditors read; they do not claim")
    # A person's claim is always fenced, with a token no agent has: an agent's ending without
    # one (complete with the todo id alone, which matches any unfenced claim of its endpoint)
    # does not end it. The person's own endings, as every operator's, need no token.
    lease_token, fence_hash = _fence(require_fence or isinstance(actor, HumanActor))
    who = _claimant(actor, claimant)
    refused: _Refused | None = None
    result: Claimed | None = None
    with transaction.atomic(), sql.hot_cursor() as cursor:
        availability.check_deadline()  # the connection is in hand: late means no claim
        locked = sql.lock_one(cursor, todo_id=todo_id, endpoint_ids=acting_endpoint_ids(actor))
        if locked is None:
            raise NotFound("no such todo", id=str(todo_id))
        endpoint = Endpoint.objects.get(pk=locked.endpoint_id)
        access.check_scope(actor, locked.queue)
        ttl = resolve_lease_ttl(lease_ttl_seconds, endpoint)
        if locked.paused:
            pause = selectors.pause_of(locked.queue)
            raise Conflict(
                f"queue {locked.queue!r} is paused",
                reason="queue_paused",
                queue=locked.queue,
                # Who, when and why, as an empty claim_next's deferred entry says it.
                **({"pause": {**pause.as_dict(), "at": iso(pause.at)}} if pause else {}),
            )
        if not locked.claimable:
            raise _not_claimable(locked)
        outcome = _admit_and_claim(cursor, locked.keys, todo_id, who, actor, ttl, fence_hash)
        if isinstance(outcome, _Refused):
            refused = outcome
        else:
            outcome.lease_token = lease_token
            result = outcome
            metrics.claimed(result.todo.queue, result.attempt, charged=result.admission is not None)
            if isinstance(actor, HumanActor):
                _ledger_human_claim(actor, endpoint, locked, result)
    if refused is not None:
        _record_refusals([refused])
        raise refused.gate.deferred_error(refused.refusal)
    assert result is not None
    return result


def _ledger_human_claim(
    actor: HumanActor, endpoint: Endpoint, locked: sql.LockedTodo, claimed: Claimed
) -> None:
    """A human's claim takes work an agent would have had: a decision, so one chain-0 row in the
    claim's transaction, as a human's ending of a claim is (``todos._end``: the same lock
    order, a grant chain's, if the claim wrote a grant, then chain 0's). An agent's own claim
    is not ledgered; a limited one's grant row records it."""
    todo = claimed.todo
    ledger.append(
        kind=LedgerKind.TODO_CLAIM,
        actor=access.ledger_actor(actor),
        scope=f"endpoint:{endpoint.slug}",
        queue=todo.queue,
        before={"state": locked.state, "attempt": locked.attempt},
        after={
            "state": todo.state,
            "owner": todo.owner,
            "attempt": claimed.attempt,
            "lease_expires_at": iso(todo.lease_expires_at),
            "count": 1,
            "todos": [str(todo.id)],
        },
    )


def _admit_and_claim(
    cursor: Any,
    keys: tuple[Any, ...],
    todo_id: UUID,
    who: str,
    actor: Actor,
    ttl: int,
    fence_hash: str | None,
) -> Claimed | _Refused:
    """Steps 3-4 for a candidate this transaction holds locked: every gate that claims it admits
    it under its own lock, in lock order, then the claim is written and charged.

    A refusal rolls back to the savepoint, releasing the gate locks taken for this candidate, so
    a claimer never holds a gate lock while it waits for another todo.
    """
    held = [(gate, key) for gate, key in zip(gates.gates(), keys, strict=True) if key is not None]
    admissions: list[gates.Admission] = []
    sid = transaction.savepoint() if held else ""
    for gate, key in held:
        verdict = gate.admit(cursor, key=key, todo_id=todo_id)
        if not isinstance(verdict, gates.Admission):
            transaction.savepoint_rollback(sid)
            return _Refused(gate, verdict)
        admissions.append(verdict)
    # The grant row is written by the claim's statement, after every gate's lock: the chain's
    # lock is the last one a claim takes.
    items = ",".join(ledger.canonical_json(i) for a in admissions for i in a.granted())
    cand = sql.claim_locked(
        cursor,
        todo_id=todo_id,
        claimant=who,
        via=actor.via,
        ttl=ttl,
        fence_hash=fence_hash,
        grant_items=items or None,
        # Bound even with no grant to write: a takeover ends the grant it supersedes.
        ledger=sql.grant_params(access.claim_ledger_actor(actor), who),
    )
    assert cand.todo is not None
    report: dict[str, Any] | None = None
    for admission in admissions:
        charged = admission.charge(cursor, todo=cand.todo, actor=actor)
        if charged is not None:
            report = {**(report or {}), **charged}
    # No RELEASE: the transaction's COMMIT releases the savepoint, one round trip fewer while the
    # gate locks are held.
    return Claimed(todo=cand.todo, attempt=cand.todo.attempt, admission=report)


def _fast_report(verdicts: tuple[dict[str, Any] | None, ...]) -> dict[str, Any] | None:
    """What the gates report of a claim admitted on the fast path (None: no gate charged it)."""
    report: dict[str, Any] | None = None
    for gate, verdict in zip(gates.gates(), verdicts, strict=True):
        charged = gate.fast_report(verdict) if verdict is not None else None
        if charged is not None:
            report = {**(report or {}), **charged}
    return report


def _held_entries(
    endpoint_id: UUID, queues: list[str], passed: list[UUID], last: sql.Candidate | sql.NoCandidate
) -> list[dict[str, Any]]:
    """An empty claim_next's deferred items for work per-todo gates hold: asked only when the
    statement passed some todo over (or a gate refused one under its lock), and recorded as
    refusals."""
    if not passed and not (isinstance(last, sql.NoCandidate) and last.skipped):
        return []
    held = [
        _Refused(gate, refusal)
        for gate in gates.gates()
        if gate.per_todo
        for refusal in gate.holding(endpoint_id, queues)
    ]
    _record_refusals(held)
    return [r.gate.deferred_entry(r.refusal, endpoint_id) for r in held]


def _not_claimable(locked: sql.LockedTodo) -> Conflict:
    """Why a todo claimed by id cannot be, and when it could be, in the holder's terms."""
    if locked.queue == QUARANTINE_QUEUE:
        return Conflict(
            f"todo is {locked.state} and cannot be claimed (quarantine is never delivered)",
            state=locked.state,
        )
    todo = Todo.objects.only("state", "next_retry_at", "lease_expires_at", "owner").get(
        pk=locked.id
    )
    if locked.state == TodoState.FAILED and todo.next_retry_at is not None:
        return Conflict(
            f"todo is failed; its retry is due at {iso(todo.next_retry_at)}",
            state=locked.state,
            reason="retry_not_due",
            next_retry_at=iso(todo.next_retry_at),
        )
    if locked.state == TodoState.FAILED:
        return Conflict(
            "todo is a dead letter (it failed its last attempt): an operator may retry it",
            state=locked.state,
            reason="dead_letter",
        )
    if locked.state == TodoState.CLAIMED and locked.attempt >= locked.max_attempts:
        # Claimable otherwise: a lapsed lease with attempts left is taken over.
        lease = (
            f"its lease lapsed at {iso(todo.lease_expires_at)}: no takeover is left; the "
            "reaper dead-letters it"
            if todo.lease_lapsed
            else f"its lease until {iso(todo.lease_expires_at)}: no takeover is left; when it "
            "lapses the reaper dead-letters it"
        )
        return Conflict(
            f"todo is claimed at its last attempt ({locked.attempt} of {locked.max_attempts}), "
            + lease,
            state=locked.state,
            reason="last_attempt",
            lease_expires_at=iso(todo.lease_expires_at),
            owner=todo.owner,
        )
    if locked.state == TodoState.CLAIMED:
        # Who holds it, as an ending refused for a person's claim names them (held_by_person).
        return Conflict(
            f"todo is claimed (attempt {locked.attempt}) by {todo.owner}, its lease until "
            f"{iso(todo.lease_expires_at)}",
            state=locked.state,
            reason="held",
            lease_expires_at=iso(todo.lease_expires_at),
            owner=todo.owner,
        )
    return Conflict(f"todo is {locked.state} and cannot be claimed", state=locked.state)


def _paused_entries(
    endpoint_id: UUID, queues: list[str], *, listed: set[str] | frozenset[str] = frozenset()
) -> list[dict[str, Any]]:
    """An empty claim_next's deferred items for the paused queues among ``queues`` that hold
    this endpoint's claimable work (the claim statement passes a paused queue by): without them,
    an agent could not tell a pause from an empty queue.

    Each such queue a gate holds as a whole (its budget: ``queues.gates.statuses``) also gets
    that gate's item after the pause's, with its reason and time, unless ``listed`` (the queues
    the pre-read already listed) has it: a resume alone does not let that work through, and only
    the budget's item says until when. Asked only when a granted queue is paused."""
    paused = selectors.paused_names().intersection(queues)
    if not paused:
        return []
    pauses = selectors.pauses_of(paused)
    with connection.cursor() as cursor:  # a lapsed claim or a due retry waits as pending work does
        pending = gated.claimable_counts(cursor, endpoint_id, list(pauses))
    held = [queue for queue in pauses if pending.get(queue)]
    statuses = gates.statuses((endpoint_id, queue) for queue in held if queue not in listed)
    out: list[dict[str, Any]] = []
    for queue in held:
        out.append(
            {
                "queue": queue,
                "reason": "queue_paused",
                "pending": pending[queue],
                "next_eligible_at": None,
                "exact": False,
                "pause": pauses[queue].as_dict(),
            }
        )
        status = statuses.get((endpoint_id, queue))
        if status is not None and status["state"] != "admitted":
            out.append(
                {
                    "queue": queue,
                    "reason": status["reason"],
                    "pending": pending[queue],
                    "next_eligible_at": status["next_eligible_at"],
                    "exact": status["exact"],
                    "window": status.get("window"),
                }
            )
    return out


def _pause_first(deferred: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``deferred`` with each paused queue's other entries right after its pause's: the locked
    path's pre-read lists a budget's entry before the pause's is added, so the same claim
    listed the two in either order by the path it took."""
    paused = {e["queue"] for e in deferred if e["reason"] == "queue_paused"}
    if not paused:
        return deferred
    out: list[dict[str, Any]] = []
    for entry in deferred:
        if entry["reason"] == "queue_paused":
            out.append(entry)
            out.extend(
                e
                for e in deferred
                if e["queue"] == entry["queue"] and e["reason"] != "queue_paused"
            )
        elif entry["queue"] not in paused:
            out.append(entry)
    return out


def _record_refusals(refusals: list[_Refused]) -> None:
    """After the claim transaction, holding no gate lock (no lock-order cycle).

    A refusal's count is history: one that cannot be written is logged and dropped, never the
    request's failure. claim_next records them after a claim of another queue has committed,
    and its answer is that claim (races11: a budget cleared meanwhile refused the count, and the
    agent heard a 500 for a claim it then held without knowing)."""
    for r in refusals:
        try:
            r.gate.refused([r.refusal])
        except DatabaseError:
            log.warning("could not count a refusal of queue %s", r.refusal.queue, exc_info=True)


# Characters that draw nothing (Unicode puts them in letter or symbol categories): Hangul
# fillers, the braille blank, the combining grapheme joiner.
_BLANK = frozenset("\u115f\u1160\u3164\uffa0\u2800\u034f")
# Letters and colons drawn as those of "operator:" (some of Unicode's confusables, TR 39: the
# Cyrillic, Greek, Coptic and Latin look-alikes of its letters, and colon-like signs NFKC leaves
# alone; two outside testers' finds among them). Not the whole list: a page tells a person's
# claim by its "via board" as well.
_LOOKALIKE = str.maketrans(
    {
        "\u0430": "a", "\u0435": "e", "\u043e": "o", "\u0440": "p", "\u0442": "t",
        "\u03b1": "a", "\u03b5": "e", "\u03bf": "o", "\u03c1": "p", "\u03c4": "t",
        "\u0585": "o", "\u1d0f": "o", "\u2c9f": "o", "\u2ca3": "p", "\u04bd": "e",
        "\u0433": "r", "\u0251": "a",
        "\u2236": ":", "\ua789": ":", "\u02d0": ":", "\u02f8": ":", "\u0589": ":",
        "\u05c3": ":", "\u2806": ":", "\ua4fd": ":", "\u0903": ":", "\u1804": ":",
        "\u205a": ":", "\u0704": ":", "\ufe30": ":",
    }
)  # fmt: skip


def _reads_as_a_person(claimant: str) -> bool:
    """Whether ``claimant`` reads as a person's claim (``operator:<username>``, HumanActor.label)
    on a page: what draws nothing left out (format characters such as zero-width spaces and
    direction marks, "\u200boperator:…" in round 9; combining marks, fillers and blanks, spaces
    and line breaks, which persons11 put in and around the prefix), compatibility forms folded
    (NFKC: full-width letters), and look-alike letters and colons read as the prefix's own.
    Elsewhere a name may hold any of them: pages isolate it (<bdi>)."""
    drawn = "".join(
        c
        for c in claimant
        if c not in _BLANK
        and unicodedata.category(c)[0] not in "CZ"
        and unicodedata.category(c) not in ("Mn", "Me")
    )
    # Before NFKC too: it spells some look-alikes otherwise (U+FE30, a vertical colon, as "..").
    folded = unicodedata.normalize("NFKC", drawn.translate(_LOOKALIKE)).casefold()
    read = folded.translate(_LOOKALIKE)
    return read.startswith(HUMAN_PREFIX)


def _fence(require_fence: bool) -> tuple[str | None, str | None]:
    if not require_fence:
        return None, None
    token = tokens.mint(LEASE_TOKEN_PREFIX, 24)
    return token, hash_token(token)


def _claimant(actor: Actor, claimant: str | None) -> str:
    if claimant is not None:
        claimant = validation.check_text(claimant, "claimant").strip()
        if not claimant or len(claimant) > 200:
            raise InvalidArgument("claimant must be 1-200 characters", field="claimant")
        if _reads_as_a_person(claimant) and not isinstance(actor, HumanActor):
            # A person's claim is held as operator:<username> (HumanActor.label): an agent
            # naming itself so read as a person on every page (round 8).
            raise InvalidArgument(
                f"claimant may not start with {HUMAN_PREFIX!r}: it names a person's claim",
                field="claimant",
            )
        return claimant
    return actor.label
