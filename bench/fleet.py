"""A large fleet for the console bench and the browser suite's screenshots: queue identities in
every condition, thousands of todos, a long ledger.

Conditions are made through the services (pauses, budgets, claims, failures) so the board reads
what production would; the bulk (todos, ledger rows) is inserted in a few statements, because
making 10,000 todos one service call at a time would measure the seeding, not the console. The
ledger rows are chained exactly as ``admission.ledger.append`` chains them, so the chain verifies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import connection, transaction

# Of every forty identities, one in each of these troubles; the rest are healthy.
TROUBLES = ("paused", "window", "at_cap", "dead_letters", "failing")


@dataclass
class Fleet:
    owner: User
    endpoints: list[Any]
    tokens: dict[str, str]
    identities: list[tuple[Any, str]]
    trouble: dict[str, list[tuple[Any, str]]] = field(default_factory=dict)


def seed(
    *, identities: int = 100, todos: int = 10_000, ledger_rows: int = 20_000, prefix: str = "fleet"
) -> Fleet:
    """``identities`` queue identities (two queues per endpoint), ``todos`` todos spread over
    them (mostly pending, some done), ``ledger_rows`` ledger rows; of every forty identities, five
    are in trouble, one of each of ``TROUBLES``."""
    from admission import services as admission_services
    from queues import pauses, services
    from queues.access import AgentActor, HumanActor

    owner, _ = User.objects.get_or_create(
        username=f"{prefix}-owner", defaults={"is_superuser": True, "is_staff": True}
    )
    human = HumanActor(owner, via="bench")
    endpoints: list[Any] = []
    tokens: dict[str, str] = {}
    pairs: list[tuple[Any, str]] = []
    for i in range((identities + 1) // 2):
        queues = [f"{prefix}-{i:03d}-a", f"{prefix}-{i:03d}-b"]
        endpoint, token = services.endpoint_vend(
            actor=human, owner=owner, name=f"{prefix} agent {i:03d}", queues=queues, rps=0
        )
        endpoints.append(endpoint)
        tokens[endpoint.slug] = token
        pairs.extend((endpoint, q) for q in queues)
    pairs = pairs[:identities]
    _bulk_todos(pairs, todos)
    fleet = Fleet(owner, endpoints, tokens, pairs)
    for n, (endpoint, queue) in enumerate(pairs):
        kind = TROUBLES[n % 40] if n % 40 < len(TROUBLES) else None
        if kind is None:
            continue
        fleet.trouble.setdefault(kind, []).append((endpoint, queue))
        agent = AgentActor(endpoint, via="bench")
        if kind == "paused":
            pauses.queue_pause(actor=human, queue=queue, reason="upgrading the consumer")
        elif kind in ("window", "at_cap"):
            admission_services.policy_set(
                actor=human,
                endpoint=endpoint,
                queue=queue,
                max_in_flight=1 if kind == "at_cap" else None,
                max_claims_per_window=1 if kind == "window" else None,
                window={"period": "day", "tz": "UTC", "start": "00:00"}
                if kind == "window"
                else None,
                posture="enforce",
            )
            services.claim_next(actor=agent, queue=queue, claimant="bench-worker")
        else:
            for _ in range(2):
                created = services.todo_create(
                    actor=agent,
                    endpoint=endpoint,
                    queue=queue,
                    title="Render the quarterly report",
                    payload={"report": "q3", "region": "emea"},
                    max_attempts=1 if kind == "dead_letters" else 5,
                ).todo
                services.claim(actor=agent, todo_id=created.id, claimant="bench-worker")
                services.fail(
                    actor=agent,
                    todo_id=created.id,
                    error={"type": "TimeoutError", "message": "the model did not answer in 60 s"},
                )
    _bulk_ledger(ledger_rows, owner)
    return fleet


def _bulk_todos(pairs: list[tuple[Any, str]], total: int) -> None:
    """``total`` todos over the identities, in one statement: six in seven pending, the
    rest done, created a second apart so the board's oldest-first order is stable."""
    if not pairs or total <= 0:
        return
    endpoint_ids = [str(e.id) for e, _ in pairs]
    queues = [q for _, q in pairs]
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO queues_todo (id, endpoint_id, queue, title, kind, payload, state, owner,
                attempt, max_attempts, source, created_at, updated_at, finished_at)
            SELECT gen_random_uuid(), (%(endpoints)s::uuid[])[1 + n %% %(k)s],
                   (%(queues)s::text[])[1 + n %% %(k)s],
                   'Summarise invoice ' || n, 'summarise',
                   jsonb_build_object('invoice', 'INV-' || n, 'customer', 'customer ' || (n %% 97)),
                   CASE WHEN n %% 7 = 0 THEN 'done' ELSE 'pending' END, '',
                   CASE WHEN n %% 7 = 0 THEN 1 ELSE 0 END, 5, 'api',
                   now() - make_interval(secs => %(total)s - n),
                   now() - make_interval(secs => %(total)s - n),
                   CASE WHEN n %% 7 = 0 THEN now() END
            FROM generate_series(1, %(total)s) AS n
            """,
            {"endpoints": endpoint_ids, "queues": queues, "k": len(pairs), "total": total},
        )


def _bulk_ledger(rows: int, owner: User) -> None:
    """``rows`` ledger rows after whatever is there, chained and MACed as ``append`` does."""
    from switchboard.ledger import chain as ledger
    from switchboard.ledger.models import LedgerEntry

    if rows <= 0:
        return
    with transaction.atomic():
        # Chain 0 as ``append`` writes it: the first row through it (its lock, and the chain's
        # head made if the ledger is empty), the rest in bulk after it, seqs from its sequence.
        ledger.append(kind="queue.resume", actor=ledger.Actor(human_name="bench"), queue="bench")
        if rows == 1:
            return
        with connection.cursor() as cursor:
            cursor.execute("SELECT chain_pos, entry_hash FROM admission_ledgerhead WHERE id = 0")
            pos, prev = cursor.fetchone()
            cursor.execute(
                "SELECT nextval('ledger_seq') FROM generate_series(1, %s) ORDER BY 1", [rows - 1]
            )
            seqs = [s for (s,) in cursor.fetchall()]
        batch: list[LedgerEntry] = []
        for i, seq in enumerate(seqs):
            pos += 1
            queue = f"bench-{i % 50:02d}"
            paused = i % 2 == 0
            row = LedgerEntry(
                seq=seq,
                chain=0,
                chain_pos=pos,
                prev_hash=prev,
                kind="queue.pause" if paused else "queue.resume",
                actor_human_id=owner.pk,
                actor_human_name=owner.get_username(),
                scope="",
                queue=queue,
                before=None if paused else {"reason": "routine maintenance"},
                after={"reason": "routine maintenance"} if paused else None,
                at=datetime.now(UTC),
            )
            row.entry_hash = ledger.compute_hash(row)
            prev = row.entry_hash
            batch.append(row)
        LedgerEntry.objects.bulk_create(batch, batch_size=2000)
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE admission_ledgerhead SET seq = %s, chain_pos = %s, entry_hash = %s, "
                "mac = %s WHERE id = 0",
                [seq, pos, prev, ledger.head_mac(seq, prev)],
            )
