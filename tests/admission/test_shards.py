"""The budget's shard locks (admission migration 0007), raced with real connections.

A claim far from every limit holds one of the budget's K shard locks and admits only with K of
room under each limit; near a limit it holds all K and admits with room for one. A policy write
takes the policy row and then all K, so it waits for every claim in progress.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.db.models import Sum
from django.utils import timezone
from psycopg import errors

from admission import selectors as admission_selectors
from admission import services as admission_services
from admission import windows
from admission.gate import BudgetGate
from admission.models import (
    PRIMARY_WINDOW_KEY,
    SHARD_LOCK_CLASS,
    WINDOW_SHARDS,
    AdmissionPolicy,
    AdmissionWindow,
)
from queues import services
from queues.models import Attempt, Todo, TodoState
from queues.services import Claimed
from tests.admission.conftest import budget, over_cap, window_total
from tests.children import Child
from tests.children import children as started
from tests.conftest import (
    Personas,
    attempt_count,
    database_url,
    every_attempt,
    in_thread,
    push,
    until_a_lock_waits,
)

K = WINDOW_SHARDS


@pytest.fixture
def children(tx_personas: Personas) -> Iterator[list[Child]]:
    with started("tests.admission.trial_racer") as both:
        yield both


def far_start() -> str:
    return (timezone.now() + timedelta(hours=12)).astimezone(UTC).strftime("%H:00")


def shards_held(conn: psycopg.Connection[Any]) -> list[int]:
    """The budget shard locks ``conn``'s backend holds, by shard."""
    rows = conn.execute(
        "SELECT classid::integer - %s FROM pg_locks WHERE locktype = 'advisory' AND granted "
        "AND objsubid = 2 AND classid BETWEEN %s AND %s AND pid = pg_backend_pid() ORDER BY 1",
        [SHARD_LOCK_CLASS, SHARD_LOCK_CLASS, SHARD_LOCK_CLASS + K - 1],
    ).fetchall()
    return [r[0] for r in rows]


def check_and_charge(
    conn: psycopg.Connection[Any], policy: AdmissionPolicy, params: str
) -> dict[str, Any]:
    """What the claim statement does for a budgeted candidate (the todo row aside), in ``conn``'s
    open transaction: the verdict, and the charge when it admits."""
    row = conn.execute(
        "SELECT admission_check(%s, NULL, %s::jsonb)", [policy.id, params]
    ).fetchone()
    assert row is not None
    verdict: dict[str, Any] = row[0]
    if verdict["ok"]:
        conn.execute("SELECT admission_charge(%s::jsonb)", [psycopg.types.json.Jsonb(verdict)])
    return verdict


def connect(**settings: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(database_url(), autocommit=False)
    for name, value in settings.items():
        conn.execute(f"SET {name} = '{value}'")
    conn.commit()  # a SET in a transaction rolled back is undone with it
    return conn


def set_used(policy: AdmissionPolicy, n: int) -> None:
    """The current window's count, all on shard 0."""
    start = windows.window_start(policy, timezone.now())
    AdmissionWindow.objects.filter(policy=policy).delete()
    AdmissionWindow.objects.create(policy=policy, window_start=start, shard=0, used=n)


def test_claims_far_from_the_limit_hold_one_shard_each_and_charge_its_own_row(
    tx_personas: Personas,
) -> None:
    p = tx_personas
    policy = budget(p, per="day", limit=100, start=far_start())
    params = BudgetGate().fast_params(p.agent.id)
    conns = [connect() for _ in range(3)]
    try:
        held: list[int] = []
        for conn in conns:
            verdict = check_and_charge(conn, policy, params)
            assert verdict["ok"] and verdict["used"] == 0  # none sees the others' charges
            (shard,) = shards_held(conn)
            assert verdict["shard"] == shard
            held.append(shard)
        assert len(set(held)) == 3  # each claimer on its own shard
        for conn in conns:
            conn.commit()
    finally:
        for conn in conns:
            conn.close()
    rows = dict(AdmissionWindow.objects.filter(policy=policy).values_list("shard", "used"))
    assert rows == dict.fromkeys(held, 1)
    assert window_total(policy) == 3


@pytest.mark.parametrize("limit", ["window", "in_flight"])
def test_fast_mode_needs_k_of_room_and_exact_mode_holds_every_shard(
    tx_personas: Personas, limit: str
) -> None:
    """The margin's arithmetic, by a deterministic interleaving of two connections. With exactly
    K of room, two claims are admitted at once, each on one shard (fast mode). With K - 1 of
    room, the first holds all K shards (exact mode) and the second waits for it. A margin other
    than K fails one of the two halves: smaller admits both at K - 1 of room (so K claims in
    flight at once could pass a limit with K - 1 of room), larger makes the first wait."""
    p = tx_personas
    if limit == "window":
        policy = budget(p, per="day", limit=20, start=far_start())
    else:
        policy = budget(p, max_in_flight=20)
        push(p, 20 - K + 1)
    params = BudgetGate().fast_params(p.agent.id)

    def room(n: int) -> None:
        if limit == "window":
            set_used(policy, 20 - n)
        else:  # claims in flight, through the service
            while Todo.objects.filter(state=TodoState.CLAIMED).count() < 20 - n:
                assert isinstance(services.claim_next(actor=p.as_agent()), Claimed)

    room(K)
    first, second = connect(), connect(lock_timeout="500ms")
    try:
        assert check_and_charge(first, policy, params)["ok"]
        assert check_and_charge(second, policy, params)["ok"]
        assert len(shards_held(first)) == 1 and len(shards_held(second)) == 1
        first.rollback()
        second.rollback()
        room(K - 1)
        verdict = check_and_charge(first, policy, params)
        assert verdict["ok"] and verdict["shard"] == 0
        assert shards_held(first) == list(range(K))
        with pytest.raises(errors.LockNotAvailable):
            check_and_charge(second, policy, params)
        second.rollback()
        first.commit()
        verdict = check_and_charge(second, policy, params)  # still less than K of room
        assert verdict["ok"] and len(shards_held(second)) == K
        second.rollback()
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize("mode", ["fast", "exact", "refused"])
def test_admit_charges_its_verdict_at_once_and_only_when_it_admits(
    tx_personas: Personas, mode: str
) -> None:
    """admission_admit (migration 0010, the lean claim statement's one call): admission_check's
    verdict, charged at once when it admits, on the shard it holds (fast mode: its own; exact
    mode: shard 0, holding all K), and nothing charged nor held when it does not admit. STRICT:
    a candidate no budget claims (a NULL policy) is answered NULL."""
    p = tx_personas
    policy = budget(p, per="day", limit=20, start=far_start())
    params = BudgetGate().fast_params(p.agent.id)
    set_used(policy, {"fast": 20 - K, "exact": 20 - K + 1, "refused": 20}[mode])
    before = window_total(policy)
    conn = connect()
    try:
        row = conn.execute(
            "SELECT admission_admit(%s, gen_random_uuid(), %s::jsonb), "
            "admission_admit(NULL, gen_random_uuid(), %s::jsonb)",
            [policy.id, params, params],
        ).fetchone()
        assert row is not None
        verdict, unclaimed = row
        assert unclaimed is None
        held = shards_held(conn)
        conn.commit()
    finally:
        conn.close()
    rows = dict(AdmissionWindow.objects.filter(policy=policy).values_list("shard", "used"))
    if mode == "refused":
        assert verdict == {"ok": False} and held == []
        assert window_total(policy) == before
        return
    assert verdict["ok"] and verdict["used"] == before
    assert window_total(policy) == before + 1
    if mode == "fast":
        (shard,) = held
        assert verdict["shard"] == shard and rows[shard] == (1 if shard else before + 1)
    else:
        assert held == list(range(K)) and verdict["shard"] == 0 and rows == {0: before + 1}


def test_a_policy_change_waits_for_a_claim_in_progress_on_a_shard(
    tx_personas: Personas,
) -> None:
    p = tx_personas
    policy = budget(p, per="day", limit=100, start=far_start())
    params = BudgetGate().fast_params(p.agent.id)
    claimer = connect()
    done = threading.Event()
    try:
        assert check_and_charge(claimer, policy, params)["ok"]
        assert len(shards_held(claimer)) == 1

        def lower() -> None:
            try:
                budget(p, per="day", limit=1, start=far_start())
                done.set()
            finally:
                connection.close()  # the thread's pooled connection back (else held to the end)

        writer = threading.Thread(target=lower)
        writer.start()
        assert not done.wait(timeout=1.0), "the policy write did not wait for the claim"
        claimer.commit()
        assert done.wait(timeout=30)
        writer.join()
    finally:
        claimer.close()
    # The write saw the claim's charge; the next claim sees the new limit.
    assert window_total(policy) == 1
    push(p, 1)
    assert not isinstance(services.claim_next(actor=p.as_agent()), Claimed)


def _run(children: list[Child], endpoint_id: Any, threads: int, ops: int, seed: str) -> None:
    for child in children:
        child.send({"endpoint": str(endpoint_id), "threads": threads, "ops": ops, "seed": seed})


def _claims(children: list[Child]) -> int:
    reports = [child.receive() for child in children]
    assert [r["errors"] for r in reports] == [[]] * len(children)
    return sum(r["claims"] for r in reports)


def _charged(policy: AdmissionPolicy) -> int:
    return AdmissionWindow.objects.filter(policy=policy).aggregate(n=Sum("used"))["n"] or 0


def test_sixteen_claimers_in_two_processes_cross_into_exact_mode_and_never_over_admit(
    tx_personas: Personas, children: list[Child]
) -> None:
    """A window limit and an in-flight cap both of K + 3: the first claims are admitted on one
    shard each, the rest with every shard held; claims complete, release, fail and lapse."""
    p = tx_personas
    policy = budget(p, per="day", limit=K + 3, max_in_flight=K + 3, start=far_start())
    push(p, 60)
    _run(children, p.agent.id, threads=8, ops=6, seed="shards")
    claims = _claims(children)
    assert claims == window_total(policy) == K + 3  # demand (96 tries) ran the window out
    assert attempt_count(endpoint=p.agent) == claims
    assert _charged(policy) == claims
    assert not over_cap(p.agent.id, every_attempt(), K + 3)


def test_the_lean_statement_racing_the_full_one_near_the_limit_never_over_admits(
    tx_personas: Personas, children: list[Child], tmp_path: Path
) -> None:
    """One process claims through the lean statement (claim_next's for gated work), the other
    through the full statement only, eight threads each, on a window with K + 3 claims left:
    they share the shards, cross into exact mode together and never admit one claim over the
    limit. Rounds (the limit raised by K + 3 each time) until both statements have claimed."""
    p = tx_personas
    lean, full = children
    total = 0
    by_statement = {"lean": 0, "full": 0}
    senders = ((lean, "lean"), (full, "full"))
    for round_ in range(6):
        policy = budget(p, per="day", limit=total + K + 3, start=far_start())
        push(p, 40)
        # Both processes' threads start together (sync_dir): the one told first could run the
        # window out before the other's threads were connected (fresh clones' runs: 'full': 0
        # in all six rounds, then 'full': 0 again with the order alternated). The lean
        # statement is the quicker, so the order still alternates.
        sync_dir = tmp_path / f"round-{round_}"
        sync_dir.mkdir()
        # A statement that has won nothing while the other has won some gets a head start of
        # 50 ms a round: on a quiet, fast host the lean statement's threads ran every window
        # out before the full one's first claim in all six rounds (a fresh clone's CI of
        # 674c353: 'full': 0). Both still race for the window's last claims near the limit.
        behind = [s for s in by_statement if by_statement[s] == 0 and any(by_statement.values())]
        for child, statement in senders if round_ % 2 == 0 else senders[::-1]:
            hold = 0.05 * round_ if behind and statement not in behind else 0.0
            child.send(
                {
                    "hold_s": hold,
                    "endpoint": str(p.agent.id),
                    "threads": 8,
                    "ops": 6,
                    "seed": f"lean-vs-full-{round_}",
                    "statement": statement,
                    "sync_dir": str(sync_dir),
                    "parties": len(children),
                }
            )
        reports = [child.receive() for child in children]
        assert [r["errors"] for r in reports] == [[]] * len(children)
        assert reports[1]["lean_claims"] == 0, reports
        by_statement["lean"] += reports[0]["lean_claims"]
        by_statement["full"] += reports[1]["claims"]
        total += sum(r["claims"] for r in reports)
        # Demand (96 tries) runs the window out: exactly the limit, never one over.
        assert total == window_total(policy) == _charged(policy) == policy.max_claims_per_window
        assert attempt_count(endpoint=p.agent) == total
        if by_statement["lean"] and by_statement["full"]:
            break
    assert by_statement["lean"] > 0 and by_statement["full"] > 0, by_statement


def test_a_process_told_to_start_with_another_claims_nothing_until_the_other_has_connected(
    tx_personas: Personas, children: list[Child], tmp_path: Path
) -> None:
    """The rendezvous the race above relies on: told that two processes start together and left
    alone, a process's threads wait for the other, then report it and claim nothing."""
    p = tx_personas
    push(p, 5)
    children[0].send(
        {
            "endpoint": str(p.agent.id),
            "threads": 4,
            "ops": 3,
            "seed": "alone",
            "sync_dir": str(tmp_path),
            "parties": 2,
            "start_timeout": 0.5,
        }
    )
    report = children[0].receive()
    assert report["claims"] == 0
    assert any("2 processes never connected" in e for e in report["errors"]), report
    assert not Attempt.objects.filter(todo__endpoint=p.agent).exists()
    assert Todo.objects.filter(endpoint=p.agent, state=TodoState.PENDING).count() == 5


def test_a_limit_lowered_mid_run_never_over_admits(
    tx_personas: Personas, children: list[Child]
) -> None:
    p = tx_personas
    policy = budget(p, per="day", limit=1000, start=far_start())
    push(p, 200)
    _run(children, p.agent.id, threads=8, ops=12, seed="lowered")
    deadline = time.monotonic() + 30
    while window_total(policy) < 10:
        assert time.monotonic() < deadline, "the racers never got going"
        time.sleep(0.01)
    lowered = window_total(policy) + 5
    budget(p, per="day", limit=lowered, start=far_start())
    after_change = window_total(policy)  # counts every claim admitted before the change
    claims = _claims(children)
    assert window_total(policy) <= max(after_change, lowered)
    assert window_total(policy) == _charged(policy) == claims
    assert attempt_count(endpoint=p.agent) == claims


def _rewritten_under_racers(
    p: Personas, children: list[Child], lists: list[list[dict[str, Any]]], seed: str
) -> tuple[AdmissionPolicy, int, Any]:
    """Write ``lists[0]``, then rewrite the budget's windows round ``lists`` in a thread while
    the racers claim in rounds (until it has been rewritten 10 times, or 10 rounds); returns
    the policy, the claims made and a writer of a list."""
    actor = p.as_human(p.owner)

    def write(windows_list: list[dict[str, Any]]) -> AdmissionPolicy:
        policy: AdmissionPolicy = admission_services.policy_set(
            actor=actor,
            endpoint=p.agent,
            queue="inbox",
            max_in_flight=None,
            max_claims_per_window=None,
            window=None,
            windows=windows_list,
        )
        return policy

    policy = write(lists[0])
    push(p, 120)
    done = threading.Event()
    rewrites = 0
    write_errors: list[BaseException] = []

    def rewrite() -> None:
        nonlocal rewrites
        try:
            while not done.is_set():
                write(lists[(rewrites + 1) % len(lists)])
                rewrites += 1
                time.sleep(0.005)
        except BaseException as exc:  # reported to the test
            write_errors.append(exc)
        finally:
            connection.close()

    writer = threading.Thread(target=rewrite)
    writer.start()
    claims = rounds = 0
    try:
        # Rounds until the list has been rewritten often under the racers (a round of 16 x 12
        # claims can take fewer than 10 rewrites' time on a quick machine).
        while rounds == 0 or (rewrites < 10 and rounds < 10):
            _run(children, p.agent.id, threads=8, ops=12, seed=f"{seed}-{rounds}")
            claims += _claims(children)
            rounds += 1
    finally:
        done.set()
        writer.join()
    assert write_errors == []  # no write refused (a deadlock's other victim)
    assert rewrites >= 10, "the list was hardly rewritten during the run"
    return policy, claims, write


def test_windows_reordered_mid_run_never_over_admit(
    tx_personas: Personas, children: list[Child], settings: Any
) -> None:
    """A week limit of 20 in force throughout while the list is rewritten under the racers: the
    week alone, then behind a day window, then behind an hour window, and round again. Its count
    follows it to every place (admission.services._follow_first_window), so 20 claims in all."""
    settings.POLICY_WRITE_RATE_LIMIT = (0, 0)
    p = tx_personas
    weekday = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")[
        (timezone.now().astimezone(UTC).weekday() + 3) % 7
    ]
    week = {"limit": 20, "period": "week", "tz": "UTC", "start": "00:00", "weekday": weekday}
    lists = [
        [week],
        [{"limit": 1000, "period": "day", "tz": "UTC", "start": far_start()}, week],
        [{"limit": 1000, "period": "hour", "tz": "UTC", "start": "00:00"}, week],
    ]
    policy, claims, write = _rewritten_under_racers(p, children, lists, "reordered")
    assert claims == attempt_count(endpoint=p.agent) == 20
    # Claims were refused meanwhile, their refusals counted racing the writes that move the
    # counters (engine.record_refusal), and none failed (_claims: no racer reported an error;
    # one refusal's deadlock with a write was, in about one run in three).
    assert AdmissionWindow.objects.filter(policy=policy).aggregate(n=Sum("refused"))["n"]
    week_key = f"week|UTC|00:00|{weekday}"
    write(lists[1])  # the week behind another window: its count under its own key
    assert _charged_under(policy, week_key) == 20


def test_an_hour_window_s_start_rewritten_at_other_hours_mid_run_never_over_admits(
    tx_personas: Personas, children: list[Child], settings: Any
) -> None:
    """An hour limit of 20, its start rewritten at another hour of the same minute under the
    racers ("07:MM", "00:MM", "13:MM": one window, every hour from :MM): its count stays, so
    20 claims in all. A save moved it away as for a new window, admitting 20 more each time."""
    settings.POLICY_WRITE_RATE_LIMIT = (0, 0)
    p = tx_personas
    mm = (timezone.now().astimezone(UTC).minute + 30) % 60  # no boundary inside the test
    lists = [
        [{"limit": 20, "period": "hour", "tz": "UTC", "start": f"{hh}:{mm:02d}"}]
        for hh in ("07", "00", "13")
    ]
    policy, claims, _ = _rewritten_under_racers(p, children, lists, "rewritten-hour")
    assert claims == attempt_count(endpoint=p.agent) == 20
    assert AdmissionWindow.objects.filter(policy=policy).aggregate(n=Sum("used"))["n"] == 20


def test_a_refusal_waits_for_a_counter_row_holding_none(tx_personas: Personas) -> None:
    """A refusal counted in two windows, the first's row there and the stacked one's inserted
    by a write not yet committed (as ``_follow_first_window`` holds it part-way): the refusal
    waits for the write holding no row, so the write can go on to the first window's row. In
    one statement for both windows it held that row while it waited: a deadlock."""
    p = tx_personas
    week = {"limit": 20, "period": "week", "tz": "UTC", "start": "00:00", "weekday": "Mon"}
    hour = {"limit": 1000, "period": "hour", "tz": "UTC", "start": "00:00"}
    policy = admission_services.policy_set(
        actor=p.as_human(p.owner),
        endpoint=p.agent,
        queue="inbox",
        max_in_flight=None,
        max_claims_per_window=None,
        window=None,
        windows=[hour, week],
    )
    refusal = admission_selectors.evaluate_policy(policy)
    first, stacked = refusal.windows
    assert (first.key, stacked.key) == (PRIMARY_WINDOW_KEY, "week|UTC|00:00|Mon")
    AdmissionWindow.objects.create(
        policy=policy, window_key=first.key, window_start=first.window_start, shard=0
    )

    def refuse() -> None:
        with connection.cursor() as cursor:  # a loaded machine's slow look below: no timeout
            cursor.execute("SET lock_timeout = '60s'")
        BudgetGate().refused([refusal])

    writer = connect()
    refuser: threading.Thread | None = None
    try:
        writer.execute(
            "INSERT INTO admission_admissionwindow (policy_id, window_key, window_start, shard, "
            "used, refused, claims_limit, updated_at) VALUES (%s, %s, %s, 0, 0, 0, 20, now())",
            [policy.id, stacked.key, stacked.window_start],
        )
        refuser, refused = in_thread(refuse)
        until_a_lock_waits("the refusal", timeout=10)  # for the write
        # While the refusal waits, the first window's row is free.
        row = writer.execute(
            "SELECT refused FROM admission_admissionwindow WHERE policy_id = %s "
            "AND window_key = %s FOR UPDATE NOWAIT",
            [policy.id, first.key],
        ).fetchone()
        assert row == (1,)  # the refusal's count there already committed
        writer.commit()
    finally:
        writer.close()
        if refuser is not None:
            refuser.join(timeout=60)
    assert refused.exception(timeout=60) is None
    counted = dict(
        AdmissionWindow.objects.filter(policy=policy).values_list("window_key", "refused")
    )
    assert counted == {first.key: 1, stacked.key: 1}


def _charged_under(policy: AdmissionPolicy, key: str) -> int:
    rows = AdmissionWindow.objects.filter(policy=policy, window_key=key)
    return rows.aggregate(n=Sum("used"))["n"] or 0
