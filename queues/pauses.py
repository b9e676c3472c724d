"""Pause and resume a queue by name, fleet-wide.

A pause stops delivery and never intake: the claim predicate (queues/sql.py) excludes paused
queue names inside the statement that picks or locks the row, and the wakes skip them. These two
services are the only writers of ``QueuePause``; the API, the CLI and the admin call them.

Why the pause locks the whole pause table. Every claim statement reads ``queues_queuepause``,
which takes ACCESS SHARE on it until the claim's transaction ends. The pause takes ACCESS
EXCLUSIVE before it inserts its row, so:

- it waits until every claim transaction that has already read the table commits, and
- a claim statement arriving meanwhile queues behind the pause's lock; once granted (after the
  pause commits) the statement takes its snapshot (READ COMMITTED takes it after parse-time
  locks are granted) and sees the pause.

So a pause commits strictly after every claim that could have missed it and strictly before
every claim that could see it: no claim is handed out on a paused queue once the pause has
returned, and ``paused_at`` (the clock after the lock was granted) is later than the
``claimed_at`` of every attempt committed on that queue before it. tests/pause/ races real
connections to check exactly that.

A resume takes no such lock: a claim that read the pause a statement too early merely hands
out nothing, which is the safe direction.

Lock order: the pause table, then ledger chain 0's append lock. A pause locks the table and then
appends; a resume locks its row (a lock on the table) and then appends and rings; a person's
claim reads the table in its claim statement and then appends. So no transaction may take chain
0 and only then touch the pause table, as a ring's gate does (``queues.ring_gate``): it would
wait for a pause's lock while the pause waits for chain 0. A write that appends to chain 0
without having touched the table rings after its commit (an operator's release and retry,
``queues.services.todos``). The grant chains likewise: a claim naming a limit reads the table
and then takes a grant chain, so the sweeps, whose statements take one for their ``limits.end``
rows, ring after their commit (``queues.services.sweeps``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from django.db import OperationalError, connection, transaction

from queues import access, ring_gate, selectors, sql, wakes
from queues.access import HumanActor
from queues.models import MAX_PAUSE_REASON, QUARANTINE_QUEUE, QueuePause, check_queue_name
from queues.selectors import PauseInfo
from switchboard.core import validation
from switchboard.core.errors import Conflict, InvalidArgument, NotFound
from switchboard.ledger import chain as ledger
from switchboard.ledger.models import LedgerKind

MAX_REASON = MAX_PAUSE_REASON
# How long a pause waits for in-flight claim transactions before giving up (a claim
# transaction is one statement, so this is generous; tests shorten it).
LOCK_TIMEOUT = "5s"
RESUMED = "resumed"


@dataclass(frozen=True)
class PauseResult:
    queue: str
    changed: bool  # False: the queue was already paused and nothing was written
    pause: PauseInfo

    def as_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "paused": True,
            "changed": self.changed,
            "pause": self.pause.as_dict(),
        }


@dataclass(frozen=True)
class ResumeResult:
    queue: str
    lifted: PauseInfo | None  # None: the queue was not paused and nothing was written
    # The queue identities rung ("<endpoint slug>") because they hold pending todos.
    woken: list[str] = field(default_factory=list)
    # Those holding pending todos that were not rung: their budget or a named limit holds them
    # still, so the resume hands nothing out there until it frees (its own ring, ``reopened``).
    held: list[str] = field(default_factory=list)

    @property
    def resumed(self) -> bool:
        return self.lifted is not None

    def as_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "resumed": self.resumed,
            "lifted": self.lifted.as_dict() if self.lifted else None,
            "woken": self.woken,
            "held": self.held,
        }


def _check_actor(actor: HumanActor) -> None:
    access.check_actor(actor)
    access.check_pause(actor)


def _check_queue(queue: str) -> str:
    check_queue_name(queue)
    if queue == QUARANTINE_QUEUE:
        raise InvalidArgument(
            "the quarantine queue is never delivered, so it cannot be paused", field="queue"
        )
    return queue


def _check_reason(reason: str | None) -> str:
    reason = reason.strip() if isinstance(reason, str) else ""
    validation.check_text(reason, "reason")
    if not reason:
        raise InvalidArgument("a reason is required to pause a queue", field="reason")
    if len(reason) > MAX_REASON:
        raise InvalidArgument(f"reason is at most {MAX_REASON} characters", field="reason")
    return reason


def _existing(queue: str) -> QueuePause | None:
    return QueuePause.objects.select_related("paused_by").filter(queue=queue).first()


def _lock_pause_table() -> None:
    """ACCESS EXCLUSIVE on the pause table: wait out in-flight claims (see the module doc)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        cursor.execute("LOCK TABLE queues_queuepause IN ACCESS EXCLUSIVE MODE")
        # Only the table lock may give up; the ledger append after it waits as usual.
        cursor.execute("SET LOCAL lock_timeout = DEFAULT")


def _sqlstate(exc: OperationalError) -> str | None:
    return getattr(exc.__cause__, "sqlstate", None)


def queue_pause(*, actor: HumanActor, queue: str, reason: str, create: bool = False) -> PauseResult:
    """Pause a queue name fleet-wide: its todos are no longer handed out; intake continues.

    1. Check the actor, the name (never quarantine) and the reason.
    2. An already paused queue: answer so, write nothing.
    3. A name nothing has used is refused unless ``create`` (a typo never pauses a phantom).
    4. In one transaction: lock the pause table, insert the row stamped with the clock after the
       lock was granted, append the ledger row.

    Call it outside a transaction that has already read the pause table: the lock would be an
    upgrade, and two such callers deadlock (one is refused with a conflict).
    """
    _check_actor(actor)
    _check_queue(queue)
    reason = _check_reason(reason)
    existing = _existing(queue)
    if existing is not None:
        return PauseResult(queue=queue, changed=False, pause=PauseInfo.of(existing))
    if not create and not selectors.queue_known(queue):
        raise NotFound(
            f"no queue named {queue!r} is known; pause it anyway with create "
            "(create: true on the API, --create on the CLI)",
            field="queue",
            queue=queue,
        )
    try:
        with transaction.atomic():
            result = _insert_pause(actor, queue, reason)
        selectors.forget_paused_names()  # after the commit (or the caller's savepoint)
        return result
    except OperationalError as exc:
        # The whole transaction rolled back: no row, no ledger entry.
        if _sqlstate(exc) == "55P03":  # lock_not_available: the lock_timeout above
            raise Conflict("could not pause: claims are holding the queue table; try again")
        if _sqlstate(exc) == "40P01":  # deadlock_detected: PostgreSQL chose this transaction
            raise Conflict("could not pause: it collided with another change; try again")
        raise


def _insert_pause(actor: HumanActor, queue: str, reason: str) -> PauseResult:
    """Step 4 of queue_pause, inside its transaction."""
    _lock_pause_table()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO queues_queuepause (queue, reason, paused_by_id, paused_at)
            VALUES (%s, %s, %s, clock_timestamp())
            ON CONFLICT (queue) DO NOTHING
            RETURNING paused_at
            """,
            [queue, reason, actor.user.pk],
        )
        row = cursor.fetchone()
    if row is None:  # paused by someone else between the first look and the lock
        existing = _existing(queue)
        assert existing is not None, "the pause table is locked; the row cannot vanish"
        return PauseResult(queue=queue, changed=False, pause=PauseInfo.of(existing))
    info = PauseInfo(reason=reason, by=actor.user.get_username(), at=row[0])
    ledger.append(
        kind=LedgerKind.QUEUE_PAUSE,
        actor=access.ledger_actor(actor),
        scope="queue",
        queue=queue,
        before=None,
        after=info.ledger_dict(),
    )
    return PauseResult(queue=queue, changed=True, pause=info)


def queue_resume(*, actor: HumanActor, queue: str, known: bool = False) -> ResumeResult:
    """Lift a pause and ring once, as a creation would, for each endpoint with pending todos.

    Resuming a queue that is not paused is not an error: nothing is lifted, nothing rings, no
    ledger row. A name nothing has used is not found, as a pause without ``create`` says of it
    ("was not paused" would tell a typo it had checked a real queue); ``known``: the caller
    knows the name otherwise (a queue the limits app declared). The notifications go out at
    commit (NOTIFY is transactional) and the ready hooks through Celery on commit, so a
    rolled-back resume rings nothing.
    """
    _check_actor(actor)
    check_queue_name(queue)
    with transaction.atomic():
        pause = _existing_for_update(queue)
        if pause is None:
            if not known and not selectors.queue_known(queue):
                raise NotFound(
                    f"no queue named {queue!r} is known, and no pause of it exists",
                    field="queue",
                    queue=queue,
                )
            return ResumeResult(queue=queue, lifted=None)
        lifted = PauseInfo.of(pause)
        pause.delete()
        ledger.append(
            kind=LedgerKind.QUEUE_RESUME,
            actor=access.ledger_actor(actor),
            scope="queue",
            queue=queue,
            before=lifted.ledger_dict(),
            after=None,
        )
        woken, held = _ring(queue)
    selectors.forget_paused_names()
    return ResumeResult(queue=queue, lifted=lifted, woken=woken, held=held)


def _existing_for_update(queue: str) -> QueuePause | None:
    return (
        QueuePause.objects.select_for_update(of=("self",))
        .select_related("paused_by")
        .filter(queue=queue)
        .first()
    )


def _ring(queue: str) -> tuple[list[str], list[str]]:
    """Ring each identity of the queue holding pending todos, naming the oldest one every gate
    admits now, its own named limits included (``ring_gate.admitted``): (rung, held). An
    identity none of whose todos would pass (its budget, or the pools, tags or rate limits they
    name, hold them all) is not rung: it is rung ``reopened`` when what holds it frees."""
    with connection.cursor() as cursor:
        cursor.execute(sql.OLDEST_PENDING_SQL, [queue])
        rows: list[tuple[UUID, str, UUID]] = cursor.fetchall()
    woken: list[str] = []
    held: list[str] = []
    for endpoint_id, slug, _oldest in rows:
        first = ring_gate.admitted(endpoint_id, queue=queue, limit=1)
        rang = bool(first) and wakes.todo_ready(
            endpoint_id, queue, todo_id=first[0][0], reason=RESUMED
        )
        (woken if rang else held).append(slug)
    return woken, held
