"""``bench.pg_instructions``' schema variants put the schema back exactly as it was, never drop
what the loop's plan walks, and a callgrind dump's count is read from its summary line. (The
count itself needs valgrind and a cluster of its own: run by hand, see the module.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from bench import pg_instructions

SCHEMA = """
SELECT 'index', indexname, indexdef FROM pg_indexes
 WHERE tablename IN ('queues_todo', 'queues_attempt')
UNION ALL
SELECT 'trigger', tgname, tgenabled::text FROM pg_trigger
 WHERE tgrelid IN ('queues_todo'::regclass, 'queues_attempt'::regclass) AND NOT tgisinternal
UNION ALL
SELECT 'constraint', conname, pg_get_constraintdef(oid) || ' valid=' || convalidated::text
  FROM pg_constraint WHERE conrelid IN ('queues_todo'::regclass, 'queues_attempt'::regclass)
ORDER BY 1, 2
"""


def _schema(cursor: Any) -> list[tuple[str, str, str]]:
    cursor.execute(SCHEMA)
    return cursor.fetchall()


@pytest.mark.django_db
def test_every_variant_is_undone_to_the_same_schema() -> None:
    with connection.cursor() as cursor:
        before = _schema(cursor)
        found = pg_instructions.variants(cursor)
        for name, (apply, undo) in found.items():
            for statement in apply:
                cursor.execute(statement)
            if name != "as_is":
                assert _schema(cursor) != before, f"{name} removed nothing"
            for statement in undo:
                cursor.execute(statement)
            assert _schema(cursor) == before, f"{name} did not put the schema back"


@pytest.mark.django_db
def test_the_variants_cover_the_schema_but_not_what_the_plan_walks() -> None:
    with connection.cursor() as cursor:
        switchboard = pg_instructions.variants(cursor)
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename IN ('queues_todo', 'queues_attempt')"
        )
        indexes = {name for (name,) in cursor.fetchall()}
    for name in ("as_is", "no_todo_checks", "no_attempt_rules", "no_attempt_fk"):
        assert name in switchboard
    assert "no_todo_claimable_idx" not in switchboard
    assert "no_todo_pending_idx" in switchboard
    for kept in pg_instructions.KEPT:
        assert kept in indexes and f"no_{kept}" not in switchboard
    dropped = {name.removeprefix("no_") for name in switchboard} & indexes
    assert dropped == indexes - pg_instructions.KEPT - {"todo_claimable_idx"}


@pytest.mark.django_db(transaction=True)  # the bench's backlog loader vacuums
def test_the_loop_keeps_the_priority_names_however_slow_its_cycles_run() -> None:
    """Under callgrind a block runs ~50 times slower than the core bench: the priority names'
    2-second re-read would put its own statement (planned afresh) into the counted cycles."""
    from django.contrib.auth.models import User

    from admission import gate
    from admission.limits import priority
    from bench.core_bench import _reload
    from queues import gates, services, sql
    from queues.access import SystemActor

    owner = User.objects.create(username="pgi-owner")
    endpoint, _token = services.endpoint_vend(
        actor=SystemActor(via="test"), owner=owner, name="pgi", queues=["bench"], rps=0
    )
    _reload(endpoint, 5)
    hints = (gate._FAST_TTL_SECONDS, sql._GATED_HINT_SECONDS)
    with pg_instructions._loop(endpoint.id) as (cycle, _on_own):
        assert cycle()
        assert not gates.priority_stale()
        priority._read_at -= 60.0  # a minute of slow cycles later
        assert not gates.priority_stale()
        assert cycle()
        # The budget's hints (--budgeted) are held as long.
        assert gate._FAST_TTL_SECONDS >= pg_instructions.NAMES_HELD_S
        assert sql._GATED_HINT_SECONDS >= pg_instructions.NAMES_HELD_S
    priority._read_at -= 60.0
    assert gates.priority_stale()  # outside the loop, the setting as configured
    assert hints == (gate._FAST_TTL_SECONDS, sql._GATED_HINT_SECONDS)


def test_a_sql_variant_is_its_two_files(tmp_path: Path) -> None:
    apply, undo = tmp_path / "b.sql", tmp_path / "a.sql"
    apply.write_text("CREATE OR REPLACE FUNCTION f() ... -- B")
    undo.write_text("CREATE OR REPLACE FUNCTION f() ... -- A")
    name, variant = pg_instructions.sql_variant(f"admit_b={apply}:{undo}")
    assert name == "admit_b"
    assert variant == ([apply.read_text()], [undo.read_text()])
    for bad in ("admit_b", f"admit_b={apply}", f"={apply}:{undo}", f"admit_b=:{undo}"):
        with pytest.raises(ValueError, match=r"NAME=APPLY\.sql:UNDO\.sql"):
            pg_instructions.sql_variant(bad)


def test_a_dump_s_count_is_its_summary_line(tmp_path: Path) -> None:
    dump = tmp_path / "cg.123.4"
    dump.write_text(
        "# callgrind format\nversion: 1\ncreator: callgrind-3.19.0\npid: 123\npart: 4\n"
        "events: Ir\nsummary: 262107498\n\nfn=(1) main\n0 5\ntotals: 262107498\n"
    )
    assert pg_instructions.dump_total(dump) == 262_107_498
    totals_only = tmp_path / "cg.123.5"
    totals_only.write_text("events: Ir\nfn=(1) main\n0 5\ntotals: 77\n")
    assert pg_instructions.dump_total(totals_only) == 77
    unfinished = tmp_path / "cg.123.6"
    unfinished.write_text("events: Ir\nfn=(1) main\n")
    with pytest.raises(ValueError, match="no summary or totals line"):
        pg_instructions.dump_total(unfinished)


@pytest.mark.django_db(transaction=True)  # the backlog loader vacuums
def test_an_endpoint_of_several_queues_gets_its_backlog_dealt_over_them() -> None:
    from django.contrib.auth.models import User

    from queues import services
    from queues.access import SystemActor
    from queues.models import Todo

    owner = User.objects.create(username="pgi-owner")
    endpoint, _token = services.endpoint_vend(
        actor=SystemActor(via="test"), owner=owner, name="pgi", queues=["q0", "q1", "q2"], rps=0
    )
    for n in (7, 5):  # each block's backlog replaces the last one's
        pg_instructions._fresh_todos(endpoint.id, n)
        per_queue = sorted(Todo.objects.filter(endpoint=endpoint).values_list("queue", flat=True))
        assert per_queue == sorted(["q0", "q1", "q2"] * (n // 3) + ["q0", "q1", "q2"][: n % 3])


def test_the_result_says_which_cycle_was_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import argparse
    import json

    from bench import common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    args = argparse.Namespace(cycles=200, rounds=2, budgeted=True, queues=10)
    counts = {"as_is": [1_616_000.0, 1_614_000.0], "domains": [1_568_000.0, 1_566_000.0]}
    every: dict[str, Any] = {"as_is": ([], []), "domains": (["ALTER ..."], ["ALTER ..."])}
    assert pg_instructions._report(args, counts, every) == 0
    (written,) = tmp_path.glob("pg_instructions-2*.json")
    result = json.loads(written.read_text())
    assert (result["budgeted"], result["queues"], result["cycles"]) == (True, 10, 200)
    assert result["variants"]["domains"]["costs_per_cycle"] == 48_000
