"""How the named limits read the todo table on a big backlog (issue 12 item 2): every pool read
through todo_live_pool_idx, every tag read through todo_live_tags_idx, never a sequential scan.
The two indexes replaced four (claimed and pending, per pool and per tag) that every update of
a todo opened and whose predicates it planned, named or not (queues migration 0020).

The plans are the ones that run: auto_explain reports every statement, the PL/pgSQL functions'
own included, as a notice to this connection, with plan_cache_mode forced each way (the claim
statements and the functions run prepared, so the generic plan is the one kept)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, transaction

from admission.limits import services as limit_services
from queues import services
from queues.sql import gated
from tests.conftest import Personas, push
from tests.limits.conftest import pool, tag

POOL_INDEX = "todo_live_pool_idx"
TAGS_INDEX = "todo_live_tags_idx"


def _backlog(p: Personas, n: int = 3000) -> list[Any]:
    """``n`` pending todos naming pool gpu and tags vendor.a and vendor.b, as many naming none,
    ``n`` finished named ones and ``n // 3`` claims naming none (seeded in SQL, as the benches
    do), with four named claims in flight; analysed, as autovacuum would.

    First the table is rewritten with its live rows only. The rows earlier tests rolled back
    stay in its heap and indexes as dead tuples until a vacuum runs, so the plans below
    depended on which tests ran before in the same database, and when autovacuum last came:
    the pool's reopens read the waiting work by a sequential scan once the heap held enough
    dead pages, and a tag's quarantine read every claim in flight (ci122, ci123 on two
    workers). ``CLUSTER`` may run inside this test's transaction, which rolls it back."""
    with connection.cursor() as cur:
        cur.execute("CLUSTER queues_todo USING queues_todo_pkey")
    pool("gpu", slots=50)
    tag("vendor.a", 50)
    tag("vendor.b", 50)
    claims = push(p, 4, pool="gpu", tags=["vendor.a", "vendor.b"])
    for todo in claims:
        services.claim(actor=p.as_agent(), todo_id=todo.id)
    with connection.cursor() as cur:
        cur.execute(
            """
            INSERT INTO queues_todo (id, endpoint_id, queue, title, kind, payload, state, owner,
                attempt, max_attempts, source, created_at, updated_at, finished_at, pool, tags)
            SELECT gen_random_uuid(), %(e)s, 'inbox', 'todo ' || g, '', '{}'::jsonb,
                   s.state, '', s.attempt, 5, 'api', now(), now(), s.finished,
                   CASE WHEN s.named THEN 'gpu' END,
                   CASE WHEN s.named THEN '{vendor.a,vendor.b}' ELSE '{}' END::varchar[]
            FROM generate_series(1, %(n)s) g,
                 (VALUES ('pending', 0, NULL::timestamptz, true), ('pending', 0, NULL, false),
                         ('done', 1, now(), true)) s(state, attempt, finished, named)
            """,
            {"e": p.agent.id, "n": n},
        )
        # Claims in flight naming no limit (a fleet's worth): a read of every claimed row is
        # no longer the cheap way to count a tag's.
        cur.execute(
            """
            INSERT INTO queues_todo (id, endpoint_id, queue, title, kind, payload, state, owner,
                attempt, max_attempts, source, created_at, updated_at, claimed_at,
                lease_expires_at)
            SELECT gen_random_uuid(), %(e)s, 'inbox', 'claimed ' || g, '', '{}'::jsonb,
                   'claimed', 'agent', 1, 5, 'api', now(), now(), now(), now() + interval '1 hour'
            FROM generate_series(1, %(n)s) g
            """,
            {"e": p.agent.id, "n": n // 3},
        )
        cur.execute("ANALYZE queues_todo")
    return claims


@contextmanager
def _plans(generic: bool) -> Iterator[list[str]]:
    """The plans of every statement run inside, nested ones included (auto_explain's notices)."""
    plans: list[str] = []
    connection.ensure_connection()
    raw = connection.connection
    handler: Callable[[Any], None] = lambda d: plans.append(d.message_primary or "")  # noqa: E731
    with connection.cursor() as cur:
        cur.execute("LOAD 'auto_explain'")
        for name, value in [
            ("auto_explain.log_min_duration", "0"),
            ("auto_explain.log_analyze", "on"),
            ("auto_explain.log_buffers", "on"),
            ("auto_explain.log_nested_statements", "on"),
            ("auto_explain.log_level", "notice"),
            ("plan_cache_mode", "force_generic_plan" if generic else "force_custom_plan"),
        ]:
            cur.execute("SELECT set_config(%s, %s, false)", [name, value])
    raw.add_notice_handler(handler)
    try:
        yield plans
    finally:
        raw.remove_notice_handler(handler)
        with connection.cursor() as cur:
            cur.execute("SELECT set_config('auto_explain.log_min_duration', '-1', false)")
            cur.execute("RESET plan_cache_mode")


def _todo_scans(plans: list[str]) -> list[str]:
    """Every scan of queues_todo in ``plans`` (a line each; a bitmap heap scan by its index)."""
    lines = [line for plan in plans for line in plan.splitlines()]
    scans = [line.strip() for line in lines if re.search(r"Scan .*on queues_todo\b", line)]
    # The todo table's indexes are named todo_* (and queues_todo_pkey).
    bitmap_indexes = [
        line.strip() for line in lines if re.search(r"Bitmap Index Scan on (queues_)?todo_", line)
    ]
    return [s for s in scans if not s.startswith("->  Bitmap Heap")] + bitmap_indexes


@pytest.mark.parametrize("generic", [True, False], ids=["generic", "custom"])
def test_every_limits_read_finds_its_todos_through_the_merged_indexes(
    personas: Personas, generic: bool
) -> None:
    claims = _backlog(personas)
    ending = claims[0]
    reads: dict[str, tuple[tuple[str, ...], Callable[[Any], Any]]] = {
        "claimed by pool": (
            (POOL_INDEX,),
            lambda c: gated.claimed_by_pool(c, ["gpu"], ending.id),
        ),
        "claimed by tag": (
            (TAGS_INDEX,),
            lambda c: gated.claimed_by_tag(c, ["vendor.a", "vendor.b"], ending.id),
        ),
        "full pools": ((POOL_INDEX,), lambda c: c.execute("SELECT limits_full_pools()")),
        "full tags": ((TAGS_INDEX,), lambda c: c.execute("SELECT limits_full_tags()")),
        "pool check": (
            (POOL_INDEX,),
            lambda c: c.execute("SELECT limits_pool_check('gpu', %s)", [ending.id]),
        ),
        "tags check": (
            (TAGS_INDEX,),
            lambda c: c.execute("SELECT limits_tags_check('{vendor.a,vendor.b}', %s)", [ending.id]),
        ),
        # At the cap counting the ending claim, so the reopens read the waiting work too.
        "pool reopens": (
            (POOL_INDEX,),
            lambda c: c.execute(
                "UPDATE limits_pool SET slots = 4; SELECT limits_pool_reopens('gpu', %s)",
                [ending.id],
            ),
        ),
        "tags reopens": (
            (TAGS_INDEX,),
            lambda c: c.execute(
                'UPDATE limits_taglimit SET "limit" = 4;'
                " SELECT limits_tags_reopens('{vendor.a,vendor.b}', %s)",
                [ending.id],
            ),
        ),
        "pool raised": (
            (POOL_INDEX, "todo_due_retry_idx"),
            lambda c: gated.pending_identities(
                c, where=limit_services._NAMING["pool"], params={"n": "gpu"}
            ),
        ),
        "tag raised": (
            (TAGS_INDEX, "todo_due_retry_idx"),
            lambda c: gated.pending_identities(
                c, where=limit_services._NAMING["tag"], params={"n": "vendor.a"}
            ),
        ),
        "pool quarantine claims": (
            (POOL_INDEX,),
            lambda c: c.execute(gated.quarantine_lock_sql("pool", lock=False), {"n": "gpu"}),
        ),
        "tag quarantine claims": (
            (TAGS_INDEX,),
            lambda c: c.execute(gated.quarantine_lock_sql("tag", lock=False), {"n": "vendor.a"}),
        ),
        "pool quarantine queued": (
            (POOL_INDEX, "todo_due_retry_idx"),
            lambda c: c.execute(gated.quarantine_queued_sql("pool"), {"n": "gpu"}),
        ),
        "tag quarantine queued": (
            (TAGS_INDEX, "todo_due_retry_idx"),
            lambda c: c.execute(gated.quarantine_queued_sql("tag"), {"n": "vendor.a"}),
        ),
    }
    for name, (indexes, read) in reads.items():
        with _plans(generic) as plans, transaction.atomic(), connection.cursor() as cur:
            read(cur)
            transaction.set_rollback(True)
        scans = _todo_scans(plans)
        assert scans, (name, plans)
        assert not [s for s in scans if "Seq Scan" in s], (name, scans)
        if not generic:
            # A plan for one set of values may read every claim in flight instead (the
            # planner takes a tag's rows and the claimed rows as independent), as before the
            # merge; the generic plan, the one a prepared statement keeps, may not.
            indexes += ("todo_claimed_idx",)
        assert all(any(i in s for i in indexes) for s in scans), (name, scans)


def test_a_tags_occupancy_reads_its_claims_not_the_backlog_naming_it(personas: Personas) -> None:
    """The count of a tag's claims intersects the tag's entry with the 'claimed' entry in the
    index: a few pages, however many pending todos name the tag. A GIN pending list would hold
    the backlog's new todos and every scan reads all of it (todo_live_tags_idx has none:
    fastupdate off; with one, this read took 35 pages a scan for 3,000 pending todos; without,
    4, and a few more for the entries other tests' rolled-back todos left)."""
    with connection.cursor() as cur:
        cur.execute("SELECT reloptions FROM pg_class WHERE relname = %s", [TAGS_INDEX])
        assert cur.fetchone() == (["fastupdate=off"],)
    _backlog(personas)
    with _plans(True) as plans, transaction.atomic(), connection.cursor() as cur:
        cur.execute("SELECT limits_full_tags()")
    lines = [line for plan in plans for line in plan.splitlines()]
    at = next(
        i for i, line in enumerate(lines) if "Bitmap Index Scan on todo_live_tags_idx" in line
    )
    loops = int(re.search(r"loops=(\d+)", lines[at]).group(1))  # type: ignore[union-attr]
    buffers = next(line for line in lines[at:] if "Buffers:" in line)
    read = sum(int(n) for n in re.findall(r"=(\d+)", buffers))
    assert loops == 2 and read <= 15 * loops, lines[at : at + 5]
