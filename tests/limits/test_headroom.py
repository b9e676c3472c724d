"""Pools and tags decided under shared locks while far from their caps (admission.limits.gates):
the bound B, which lock each path takes, and races across the crossover, against quarantines and
lowerings, and over overlapping tags, on real connections."""

from __future__ import annotations

import importlib
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection, connections, transaction

from admission.limits import locks
from admission.limits.services import limit_quarantine, limit_set
from admission.limits.verify import limits_verify
from queues import services
from queues.models import Todo, TodoState
from queues.services import Claimed
from switchboard.core.errors import Deferred
from switchboard.ledger.models import LedgerEntry, LedgerKind
from tests.admission.racer import race
from tests.conftest import Personas, database_url, push, run_threads
from tests.limits.conftest import pool, push_named, tag

_MIGRATION = importlib.import_module("admission.limits.migrations.0005_headroom_locks")


def set_bound(bound: int | None) -> None:
    """Replace B in the database (None: the migration's formula). Committed at once outside a
    test's transaction; connections opened afterwards plan with it."""
    with connection.cursor() as cursor:
        if bound is None:
            cursor.execute(_MIGRATION.BOUND)
        else:
            cursor.execute(
                "CREATE OR REPLACE FUNCTION limits_headroom_bound() RETURNS integer "
                f"LANGUAGE sql STABLE AS $$ SELECT {int(bound)} $$"
            )


@pytest.fixture
def low_bound() -> Iterator[Any]:
    """Lower B for a race with a few connections; the formula is put back after. Never below
    the claims the test can have in flight at once: B is the bound the argument rests on."""
    yield set_bound
    set_bound(None)


def advisory_locks(kind: str, name: str) -> list[str]:
    """The modes this connection holds the limit's lock in."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT mode FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
            " AND classid = %s AND objid = hashtext(%s)::oid AND objsubid = 2 ORDER BY mode",
            [locks.CLASSES[kind], name],
        )
        return [mode for (mode,) in cursor.fetchall()]


def occupancy(name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM queues_todo WHERE state = 'claimed' AND pool = %s", [name]
        )
        (count,) = cursor.fetchone()
        return int(count)


# --- the bound and the locks ---------------------------------------------------------------------


def test_the_bound_counts_every_backend_that_can_hold_a_claim_and_every_prepared_transaction(
    db: None,
) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT limits_headroom_bound(), current_setting('max_connections')::int"
            " + current_setting('max_prepared_transactions')::int"
            " + current_setting('max_worker_processes')::int"
            " + current_setting('max_wal_senders')::int"
        )
        bound, formula = cursor.fetchone()
    assert bound == formula and bound >= 100  # PostgreSQL's default max_connections alone


def test_the_lock_classes_in_the_sql_are_the_python_ones() -> None:
    for sql in (_MIGRATION.POOL_CHECK, _MIGRATION.SHARED_READS):
        assert f"lock_shared({locks.POOL_LOCK_CLASS}, hashtext(p_pool))" in sql
    assert f"lock_shared({locks.TAG_LOCK_CLASS}, l.key)" in _MIGRATION.TAGS_CHECK
    assert f"limits_lock({locks.TAG_LOCK_CLASS}," in _MIGRATION.SHARED_READS
    assert f"'{locks.POOL_LOCK_CLASS}', 'name'" in _MIGRATION.TRIGGER
    assert f"'{locks.TAG_LOCK_CLASS}', 'tag'" in _MIGRATION.TRIGGER


# The declarations and todos are committed first (creating a limit takes its lock exclusive);
# each claim then runs in a transaction of the test's, whose locks are read before it commits.


def test_a_claim_far_from_the_caps_takes_the_pool_and_tag_locks_shared(
    tx_personas: Personas,
) -> None:
    pool("gpu", slots=1_000_000)
    tag("vendor.a", 1_000_000)
    push_named(tx_personas, 1, pool="gpu", tags=["vendor.a"])
    with transaction.atomic():
        claimed = services.claim_next(actor=tx_personas.as_agent())
        assert isinstance(claimed, Claimed) and claimed.grant is not None
        assert advisory_locks("pool", "gpu") == ["ShareLock"]
        assert advisory_locks("tag", "vendor.a") == ["ShareLock"]


def test_a_claim_within_the_bound_of_a_cap_takes_its_lock_exclusive(
    tx_personas: Personas,
) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT limits_headroom_bound()")
        (bound,) = cursor.fetchone()
    pool("gpu", slots=bound)  # held + B < slots can never hold
    tag("vendor.a", 1_000_000)
    push_named(tx_personas, 1, pool="gpu", tags=["vendor.a"])
    with transaction.atomic():
        assert isinstance(services.claim_next(actor=tx_personas.as_agent()), Claimed)
        assert advisory_locks("pool", "gpu") == ["ExclusiveLock"]
        assert advisory_locks("tag", "vendor.a") == ["ShareLock"]


def test_a_second_claim_in_one_transaction_is_decided_exclusive(tx_personas: Personas) -> None:
    # One transaction holds both claims: the first is the one headroom claim B allows a
    # transaction; the second must not count on B again.
    pool("gpu", slots=1_000_000)
    push_named(tx_personas, 2, pool="gpu")
    with transaction.atomic():
        assert isinstance(services.claim_next(actor=tx_personas.as_agent()), Claimed)
        assert advisory_locks("pool", "gpu") == ["ShareLock"]
        assert isinstance(services.claim_next(actor=tx_personas.as_agent()), Claimed)
        assert advisory_locks("pool", "gpu") == ["ExclusiveLock", "ShareLock"]


def test_the_locked_path_and_every_change_take_the_lock_exclusive(
    tx_personas: Personas,
) -> None:
    personas = tx_personas
    pool("gpu", slots=1_000_000)
    [todo] = push_named(personas, 1, pool="gpu")
    with transaction.atomic():
        assert isinstance(services.claim(actor=personas.as_agent(), todo_id=todo.id), Claimed)
        assert "ExclusiveLock" in advisory_locks("pool", "gpu")
    with transaction.atomic():
        limit_set(actor=personas.as_human(personas.admin), kind="tag", name="vendor.x", limit=3)
        assert advisory_locks("tag", "vendor.x") == ["ExclusiveLock"]
    pool("cpu", slots=3)
    with transaction.atomic():
        # Any other writer too, through the tables' trigger.
        assert advisory_locks("pool", "cpu") == []
        with connection.cursor() as cursor:
            cursor.execute("UPDATE limits_pool SET slots = 5 WHERE name = 'cpu'")
        assert advisory_locks("pool", "cpu") == ["ExclusiveLock"]


def test_an_ending_takes_the_locks_shared_and_locks_no_limit_row(
    tx_personas: Personas,
) -> None:
    """With work of the limits still waiting (the case a reopen ring may be owed), the ending
    reads each limit under its shared lock. With none waiting the planner may never call the
    read (a hash join over no waiting rows skips its other side), and no lock is needed: the
    ledger's order of an end row does not rest on it (``switchboard.ledger.chain``)."""
    personas = tx_personas
    pool("gpu", slots=1_000_000)
    tag("vendor.a", 1_000_000)
    push_named(personas, 2, pool="gpu", tags=["vendor.a"])
    claimed = services.claim_next(actor=personas.as_agent())  # committed; the other waits
    assert isinstance(claimed, Claimed)
    xmax = "SELECT xmax::text FROM limits_pool WHERE name = 'gpu'"
    with transaction.atomic():
        assert advisory_locks("pool", "gpu") == []
        with connection.cursor() as cursor:
            # The intakes' KEY SHARE locks (committed) left their xmax; the ending adds none.
            cursor.execute(xmax)
            before = cursor.fetchone()
        services.complete(actor=personas.as_agent(), todo_id=claimed.todo.id)
        assert advisory_locks("pool", "gpu") == ["ShareLock"]
        assert advisory_locks("tag", "vendor.a") == ["ShareLock"]
        with connection.cursor() as cursor:
            # A row this transaction locked FOR SHARE/UPDATE would carry its xid: untouched.
            cursor.execute(xmax)
            assert cursor.fetchone() == before


def test_a_claim_that_waited_on_a_change_decides_on_the_new_limit_exactly(
    tx_personas: Personas,
) -> None:
    # Read without locks the pool is far from its cap, so the claim asks for the shared lock; a
    # change (any writer: the trigger takes the lock) holds it exclusive while lowering the
    # pool to 1. Once the change commits the claim reads 1 slot under its lock, answers stale,
    # and the locked path admits it exactly: its grant names the new limit.
    p = tx_personas
    pool("gpu", slots=1_000_000)
    push_named(p, 2, pool="gpu")
    holder = psycopg.connect(**connection.get_connection_params())
    holder.execute("UPDATE limits_pool SET slots = 1 WHERE name = 'gpu'")
    outcome: dict[str, Any] = {}

    def claim() -> None:
        try:
            outcome["result"] = services.claim_next(actor=p.as_agent())
        finally:
            connections.close_all()

    worker = threading.Thread(target=claim)
    worker.start()
    deadline = time.monotonic() + 20
    with psycopg.connect(**connection.get_connection_params()) as probe:
        while not probe.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        ).fetchone()[0]:  # type: ignore[index]
            assert time.monotonic() < deadline, "the claim never waited on the pool's lock"
            time.sleep(0.02)
    holder.commit()
    holder.close()
    worker.join(timeout=20)
    assert isinstance(outcome.get("result"), Claimed), outcome
    assert _grant_helds("gpu") == [(0, 1)]
    assert isinstance(services.claim_next(actor=p.as_agent()), services.NothingClaimable)


# --- races ---------------------------------------------------------------------------------------


def _grant_helds(name: str) -> list[tuple[int, int]]:
    """(held, limit) each grant of the pool ``name`` recorded, in ledger order."""
    out = []
    for after in (
        LedgerEntry.objects.filter(kind=LedgerKind.LIMITS_GRANT)
        .order_by("seq")
        .values_list("after", flat=True)
    ):
        for item in (after or {}).get("limits", []):
            if item["kind"] == "pool" and item["name"] == name:
                out.append((item["held"], item["limit"]))
    return out


class Sampler:
    """A thread on its own connection reading the pool's occupancy as fast as it can."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                self.samples.append((time.monotonic(), occupancy(self.name)))
        finally:
            connections.close_all()

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def _churn(
    p: Personas,
    seconds: float,
    seed: int,
    endpoint: Any = None,
    hold: float = 0.01,
    most: int = 1,
) -> dict[str, int]:
    """Until the time is up: claim up to ``most`` todos (each claim its own transaction, so at
    most one in flight per claimer), hold them a moment, then complete or release each."""
    rng = random.Random(seed)
    actor = p.as_agent(endpoint)
    counts = {"claimed": 0, "empty": 0, "conflict": 0}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        held = []
        for _ in range(rng.randint(1, most)):
            claimed = services.claim_next(actor=actor, claimant=f"w{seed}")
            if not isinstance(claimed, Claimed):
                counts["empty"] += 1
                break
            counts["claimed"] += 1
            held.append(claimed)
        if not held:
            time.sleep(0.002)
            continue
        time.sleep(rng.random() * hold)
        for claimed in held:
            try:
                if rng.random() < 0.7:
                    services.complete(actor=actor, todo_id=claimed.todo.id, attempt=claimed.attempt)
                else:
                    services.release(actor=actor, todo_id=claimed.todo.id, attempt=claimed.attempt)
            except Exception:  # expired under it by a quarantine: the holder is told so
                counts["conflict"] += 1
    return counts


def test_claims_crossing_from_headroom_to_exact_never_hold_more_than_the_slots(
    tx_personas: Personas, low_bound: Any
) -> None:
    # B lowered to 9, still above the 8 connections that claim (a B below the claims in flight
    # at once is unsafe: with B = 2, thirty racers overfill a pool of 6). 12 slots are decided
    # shared while held + 9 < 12 and exclusive above; each claimer holds up to four claims, so
    # occupancy keeps crossing the threshold both ways and meets the cap.
    p = tx_personas
    low_bound(9)
    slots = 12
    pool("gpu", slots=slots)
    tag("vendor.a", 11)  # crosses too, and caps before the pool now and then
    tag("vendor.b", 1_000)
    push_named(p, 300, pool="gpu", tags=["vendor.a", "vendor.b"])
    push_named(p, 300, pool="gpu", tags=["vendor.b"])
    with Sampler("gpu") as sampler:
        results = run_threads(8, lambda i: _churn(p, 3.0, i, hold=0.05, most=4))
    assert sum(r["claimed"] for r in results) > 40
    assert max(n for _, n in sampler.samples) <= slots
    assert len(sampler.samples) > 100
    assert Todo.objects.filter(state=TodoState.CLAIMED).count() == 0
    helds = _grant_helds("gpu")
    # Both kinds of decision ran: shared (held + 9 < 12) and exclusive (held >= 3), and some
    # claims met the cap.
    assert any(h + 9 < lim for h, lim in helds) and any(h + 9 >= lim for h, lim in helds)
    assert any(h == slots - 1 for h, _ in helds)
    assert max(h for h, _ in helds) < slots
    assert limits_verify().ok


def test_thirty_racers_in_two_processes_decided_shared_all_land_exactly_once(
    tx_personas: Personas, low_bound: Any, tmp_path: Path
) -> None:
    # B lowered to 30, the claims in flight at most (each racer claims once; with B above the
    # racers, shared claims cannot reach the cap: the thread race above meets it). Of 40 slots
    # claims are decided shared while held + 30 < 40, exclusive above, all at once from two
    # processes, each claim its own connection.
    p = tx_personas
    low_bound(30)
    pool("gpu", slots=40)
    tag("vendor.a", 1_000)
    push_named(p, 45, pool="gpu", tags=["vendor.a"])
    reports = race(p.agent.id, 15, tmp_path, database_url(), settings.REDIS_URL)
    assert [r["errors"] for r in reports] == [[], []]
    claimed = [t for r in reports for t in r["claimed"]]
    assert len(claimed) == 30 and len(set(claimed)) == 30
    assert Todo.objects.filter(state=TodoState.CLAIMED, pool="gpu").count() == 30
    helds = _grant_helds("gpu")
    assert len(helds) == 30 and max(h for h, _ in helds) < 30
    # Which ones count a claim committed by another racer, and so are decided exclusive, is
    # the race's to say; some are decided shared.
    assert any(h + 30 < lim for h, lim in helds)
    assert limits_verify().ok


def test_a_quarantine_racing_headroom_claims_leaves_none_held_and_names_every_one(
    tx_personas: Personas,
) -> None:
    # The real B: slots far above it, so every claim before the quarantine is decided shared.
    p = tx_personas
    pool("gpu", slots=1_000_000)
    push_named(p, 300, pool="gpu")
    done: dict[str, Any] = {}

    def act(i: int) -> Any:
        if i == 0:
            time.sleep(0.7)
            done.update(limit_quarantine(actor=p.as_human(p.admin), kind="pool", name="gpu"))
            done["at"] = time.monotonic()
            return None
        return _churn(p, 2.0, i, hold=0.03)

    with Sampler("gpu") as sampler:
        results = run_threads(7, act)
    assert sum(r["claimed"] for r in results[1:]) > 10
    after = [n for at, n in sampler.samples if at > done["at"]]
    assert after and max(after) == 0
    expired = done["manifest"]["expired"]
    assert expired, "claims were in flight when the quarantine ran"
    # Every claim the manifest names was expired by it, and no claim names the pool now.
    assert Todo.objects.filter(state=TodoState.CLAIMED, pool="gpu").count() == 0
    for item in expired:
        todo = Todo.objects.get(pk=item["todo"])
        assert todo.state != TodoState.CLAIMED or todo.attempt > item["attempt"]
    assert limits_verify().ok


def test_a_limit_lowered_under_racing_headroom_claims_holds_every_claim_after_it(
    tx_personas: Personas,
) -> None:
    p = tx_personas
    pool("gpu", slots=1_000_000)
    push_named(p, 300, pool="gpu")
    changed: dict[str, float] = {}

    def act(i: int) -> Any:
        if i == 0:
            time.sleep(0.5)
            limit_set(actor=p.as_human(p.admin), kind="pool", name="gpu", slots=2)
            changed["at"] = time.monotonic()
            return None
        return _churn(p, 2.0, i)

    with Sampler("gpu") as sampler:
        run_threads(7, act)
    # Claims held at the change end on their own; once at or under 2, never over it again.
    after = [n for at, n in sampler.samples if at > changed["at"]]
    settled = next(i for i, n in enumerate(after) if n <= 2)
    assert max(after[settled:]) <= 2
    # And the ledger agrees: every grant after the change found fewer than 2 open.
    assert limits_verify().ok
    assert any(lim == 2 for _, lim in _grant_helds("gpu"))


def test_overlapping_tags_decided_shared_and_exclusive_at_once_never_deadlock(
    tx_personas: Personas,
) -> None:
    # Tags of limit 6 are decided exclusive (within B of the cap) and those of 1,000 shared;
    # by-id claims (the locked path) take every lock exclusive. Pairs in both orders, at once.
    p = tx_personas
    pool("gpu", slots=1_000)
    for name, limit in (("a", 6), ("b", 1_000), ("c", 6), ("d", 1_000)):
        tag(name, limit)
    pairs = [["a", "b"], ["b", "a"], ["c", "a"], ["d", "b"], ["b", "c"], ["d", "c"]]
    by_id = [push_named(p, 1, pool="gpu", tags=pair)[0] for pair in pairs]
    for pair in pairs * 3:
        push(p, 1, endpoint=p.agent2, pool="gpu", tags=pair)

    def claim(i: int) -> object:
        if i < len(by_id):
            try:
                return services.claim(actor=p.as_agent(), todo_id=by_id[i].id)
            except Deferred:  # a tag the others filled: refused, not stuck
                return "deferred"
        return _churn(p, 1.0, i, endpoint=p.agent2)

    results = run_threads(len(by_id) + 6, claim)
    assert all(isinstance(r, Claimed) or r == "deferred" for r in results[: len(by_id)])
    assert sum(r["claimed"] for r in results[len(by_id) :]) > 0
    for name, limit in (("a", 6), ("c", 6)):
        held = Todo.objects.filter(state=TodoState.CLAIMED, tags__contains=[name]).count()
        assert held <= limit
    assert limits_verify().ok
