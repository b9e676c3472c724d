"""Admission bench: claim+complete cycles per second on one hot queue, budgeted vs not.

``run(duration_s)`` measures, at 1, 8 and 32 concurrent claimers (threads, each with its own
database connection, calling ``queues.services.claim_next`` then ``complete``), the same queue
shape with no policy and with a policy whose window limit is high enough never to refuse. It
assumes Django is set up on a migrated database and that Redis is reachable; it makes its own
user, endpoints and todos and removes them afterwards (the budget is set and cleared through the
services, so the ledger records both, as it records every budget).

Targets (issues 4 and 12): budgeted ≥ 0.6× unbudgeted at 8 claimers; budgeted at 32 ≥ 0.5×
budgeted at 8; ten budgeted queues of one endpoint ≥ 0.8× ten unbudgeted ones at 8. A further
point, ``3_windows_at_8``, is reported without a target: the hot queue under three stacked windows
(hour, day, week; limits never reached) beside its own unbudgeted phase, to read against the
single-window budgeted ratio at 8 of the same run. And ``refused``, without a target: agents
polling a queue whose budget is spent (a day window of 1, used, with work waiting), claim_next
calls per second at 1 and 8 claimers, each refused with its deferral. Each point
is measured ``repeats`` times and judged on the median ratio; every run is kept in the JSON with
the dead tuples and index pages per cycle of its phase (to tell churn bloat from lock waits).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bench.common import MODES, ProcessPool, summary, timed_pool

CONCURRENCY = (1, 8, 32)
QUEUE = "hot"
TARGET_BUDGETED_VS_UNBUDGETED_AT_8 = 0.6
TARGET_32_VS_8 = 0.5
# Issue 12's second scenario: one endpoint, MANY_QUEUES budgeted queues, 8 claimers.
MANY_QUEUES = 10
TARGET_MANY_QUEUES = 0.8
# Issue 12 item 4: every stacked window is charged on each claim; what do three cost?
STACKED = [
    {"limit": 1_000_000, "period": "hour", "tz": "UTC", "start": "00:00"},
    {"limit": 1_000_000, "period": "day", "tz": "Europe/Berlin", "start": "00:00"},
    {"limit": 1_000_000, "period": "week", "tz": "UTC", "start": "00:00", "weekday": "Mon"},
]
STACKED_POINT = f"{len(STACKED)}_windows_at_8"
# Todos are made ahead of each phase: the last comparable rate times the phase, with slack.
_INITIAL_RATE_GUESS = 1500.0
_SLACK = 2.0


def _make_todos(endpoint: Any, n: int, queues: list[str], **names: Any) -> None:
    """``n`` todos dealt round-robin over ``queues``: claim_next takes the oldest first, so
    todos made queue by queue would send every claimer to the first queue's budget. ``names``:
    the named limits (pool, tags, rate_limit) every todo names."""
    from queues.models import Todo

    Todo.objects.bulk_create(
        (
            Todo(endpoint=endpoint, queue=queues[i % len(queues)], title=f"bench {i}", **names)
            for i in range(n)
        ),
        batch_size=5000,
    )


def _cleanup_done(endpoint: Any) -> None:
    from queues.models import Todo

    Todo.objects.filter(endpoint=endpoint).delete()


# What the claimable index costs per claim, to tell churn bloat from lock waits when a point
# collapses: dead tuples left in queues_todo, and index pages read per cycle on its indexes.
_TODO_STATS = """
SELECT (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'queues_todo'),
       (SELECT coalesce(sum(idx_blks_hit + idx_blks_read), 0) FROM pg_statio_user_indexes
        WHERE relname = 'queues_todo')
"""


def _vacuum() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE queues_todo")
        cursor.execute("VACUUM ANALYZE queues_attempt")


def _todo_stats() -> tuple[int, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(_TODO_STATS)
        dead, pages = cursor.fetchone()
    return int(dead or 0), int(pages or 0)


def _measure(
    endpoint: Any,
    claimers: int,
    duration_s: float,
    guess: float,
    queues: list[str],
    *,
    processes: ProcessPool | None = None,
    **names: Any,
) -> dict[str, Any]:
    """One point: fresh todos spread over ``queues`` (naming ``names``), the timed phase (in
    ``claimers`` threads, or in that many of ``processes``' processes), its diagnostics. Not
    ``pool``: the limits bench names a pool among ``names``."""
    _make_todos(endpoint, int(guess * duration_s * _SLACK) + 200, queues, **names)
    # Every point starts from a vacuumed table: without it each phase inherited the dead tuples
    # of every phase before it (tens of thousands), and the claimable index scan walked them.
    _vacuum()
    _, pages_before = _todo_stats()
    measure = processes.run if processes is not None else timed_pool
    phase = measure(claimers, duration_s, "bench.common:claim_loop", endpoint.pk)
    time.sleep(0.5)  # closed connections flush their statistics
    dead, pages_after = _todo_stats()
    _cleanup_done(endpoint)
    return {
        "rate": phase["cycles_per_s"],
        "dry": phase["ran_dry"],
        "p99_ms": phase["p99_ms"],
        "dead_tuples": dead,
        "index_pages_per_cycle": round((pages_after - pages_before) / max(1, phase["cycles"]), 1),
        # The machine's load when the phase ended: a dip under load is not a collapse.
        "load": phase["load"],
        # How busy the machine was, and its CPU per cycle (``bench.common.host_busy``).
        "host_busy_share": phase["host_busy_share"],
        "host_cpu_us_per_cycle": phase["host_cpu_us_per_cycle"],
    }


# Agents polling a spent budget: claim_next alone, refused each time (the pre-read, the deferral's
# figures and the refusal's count in each window), at these claimers.
REFUSED_POINT = "refused"
REFUSED_CLAIMERS = (1, 8)
SPENT = [{"limit": 1, "period": "day", "tz": "UTC", "start": "00:00"}]
SCENARIOS = (
    *(str(n) for n in CONCURRENCY),
    f"{MANY_QUEUES}_queues_at_8",
    STACKED_POINT,
    REFUSED_POINT,
)


@contextmanager
def refusal_loop(i: int, endpoint_id: Any) -> Iterator[Callable[[], bool]]:
    """An agent polling a spent budget: claim_next, refused with a deferral."""
    from queues import services
    from queues.access import AgentActor
    from queues.models import Endpoint

    actor = AgentActor(Endpoint.objects.get(pk=endpoint_id), via="api")  # connects before the clock

    def cycle() -> bool:
        got = services.claim_next(actor=actor, claimant=f"bench-{i}")
        # Once a day the window turns and one claim is admitted, as it should be.
        if not isinstance(got, services.Claimed) and not got.deferred:
            raise AssertionError(f"a claim on a spent budget was neither refused nor made: {got}")
        return True

    yield cycle


def _measure_refused(
    endpoint: Any, claimers: int, duration_s: float, processes: ProcessPool | None
) -> dict[str, Any]:
    measure = processes.run if processes is not None else timed_pool
    phase = measure(claimers, duration_s, "bench.admission_bench:refusal_loop", endpoint.pk)
    return {
        "rate": phase["cycles_per_s"],
        "p99_ms": phase["p99_ms"],
        "load": phase["load"],
        "host_busy_share": phase["host_busy_share"],
        "host_cpu_us_per_cycle": phase["host_cpu_us_per_cycle"],
    }


def run(
    duration_s: float,
    repeats: int = 3,
    modes: tuple[str, ...] = MODES,
    points: tuple[str, ...] = SCENARIOS,
) -> dict[str, Any]:
    """Measure every point (of ``points``: "1", "8", "32", "10_queues_at_8", "3_windows_at_8",
    "refused")
    ``repeats`` times
    in each of ``modes`` (threads, processes), budgeted right after unbudgeted each time so each
    ratio compares two phases of one moment; report medians and spreads (min, max, every run)."""
    from django.conf import settings
    from django.contrib.auth import get_user_model

    from admission import services as admission_services
    from queues import services
    from queues.access import AgentActor, HumanActor, SystemActor
    from queues.models import Endpoint

    unknown = sorted(set(points) - set(SCENARIOS)) or sorted(set(modes) - set(MODES))
    if unknown:
        raise ValueError(f"points/modes: unknown {unknown}; points are {list(SCENARIOS)}")
    tag = secrets.token_hex(4)
    user = get_user_model().objects.create_user(f"bench-admission-{tag}")
    actor = HumanActor(user, via="cli")
    many = [f"{QUEUE}{i}" for i in range(MANY_QUEUES)]

    def vend(name: str, queues: list[str]) -> Any:
        return services.endpoint_vend(
            actor=SystemActor(via="bench"), owner=user, name=f"{name} {tag}", queues=queues, rps=0
        )[0]

    def windowed(endpoint: Any, windows: list[dict[str, Any]]) -> None:
        """A budget of stacked window limits only, on the hot queue."""
        admission_services.policy_set(
            actor=actor,
            endpoint=endpoint,
            queue=QUEUE,
            max_in_flight=None,
            max_claims_per_window=None,
            window=None,
            windows=windows,
            posture="enforce",
        )

    plain, budgeted = vend("bench plain", [QUEUE]), vend("bench budgeted", [QUEUE])
    plain_many, budgeted_many = vend("bench plain many", many), vend("bench budgeted many", many)
    stacked, spent = vend("bench stacked", [QUEUE]), vend("bench spent", [QUEUE])
    scenarios = [(str(n), n, plain, budgeted, [QUEUE]) for n in CONCURRENCY]
    scenarios.append((f"{MANY_QUEUES}_queues_at_8", 8, plain_many, budgeted_many, many))
    scenarios.append((STACKED_POINT, 8, plain, stacked, [QUEUE]))
    scenarios = [s for s in scenarios if s[0] in points]
    refused: dict[str, dict[str, list[dict[str, Any]]]] = {mode: {} for mode in modes}
    # mode -> label -> point -> runs
    measured: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {
        mode: {"unbudgeted": {}, "budgeted": {}} for mode in modes
    }
    ratio_runs: dict[str, dict[str, list[float]]] = {mode: {} for mode in modes}
    budget: dict[str, Any] = {
        "max_in_flight": None,
        "max_claims_per_window": 1_000_000,
        "window": {"period": "day", "tz": "UTC", "start": "00:00"},
        "posture": "enforce",
    }
    # Eleven budgets in a row: the bench's operator is not held to the per-human write rate.
    limit_before = settings.POLICY_WRITE_RATE_LIMIT
    settings.POLICY_WRITE_RATE_LIMIT = (0, 0)
    pool = None
    try:
        admission_services.policy_set(actor=actor, endpoint=budgeted, queue=QUEUE, **budget)
        for queue in many:
            admission_services.policy_set(
                actor=actor, endpoint=budgeted_many, queue=queue, **budget
            )
        windowed(stacked, STACKED)
        if REFUSED_POINT in points:
            windowed(spent, SPENT)
            _make_todos(spent, 1000, [QUEUE])
            agent = AgentActor(spent, via="api")
            if not isinstance(services.claim_next(actor=agent), services.Claimed):
                raise RuntimeError("the spent budget's one claim was refused")
        if "processes" in modes:
            pool = ProcessPool(max([*(s[1] for s in scenarios), *REFUSED_CLAIMERS]))
        guess = _INITIAL_RATE_GUESS
        for _ in range(repeats):
            for mode in modes:
                in_pool = pool if mode == "processes" else None
                got, ratios_of = measured[mode], ratio_runs[mode]
                for key, claimers, unb_ep, bud_ep, queues in scenarios:
                    unb = _measure(unb_ep, claimers, duration_s, guess, queues, processes=in_pool)
                    bud = _measure(bud_ep, claimers, duration_s, guess, queues, processes=in_pool)
                    got["unbudgeted"].setdefault(key, []).append(unb)
                    got["budgeted"].setdefault(key, []).append(bud)
                    guess = max(guess, unb["rate"], bud["rate"])
                    if unb["rate"]:
                        ratios_of.setdefault(f"budgeted_vs_unbudgeted_at_{key}", []).append(
                            bud["rate"] / unb["rate"]
                        )
                if REFUSED_POINT in points:
                    for claimers in REFUSED_CLAIMERS:
                        point = _measure_refused(spent, claimers, duration_s, in_pool)
                        refused[mode].setdefault(str(claimers), []).append(point)
                b = got["budgeted"]
                if "8" in b and STACKED_POINT in b:
                    ratios_of.setdefault("stacked_vs_single_window_at_8", []).append(
                        b[STACKED_POINT][-1]["rate"] / b["8"][-1]["rate"]
                        if b["8"][-1]["rate"]
                        else 0.0
                    )
                if "8" in b and "32" in b:
                    ratios_of.setdefault("budgeted_32_vs_8", []).append(
                        b["32"][-1]["rate"] / b["8"][-1]["rate"] if b["8"][-1]["rate"] else 0.0
                    )
    finally:
        if pool is not None:
            pool.close()
        budgets = ((budgeted, [QUEUE]), (budgeted_many, many), (stacked, [QUEUE]), (spent, [QUEUE]))
        for endpoint, queues in budgets:
            for queue in queues:
                try:
                    admission_services.policy_clear(actor=actor, endpoint=endpoint, queue=queue)
                except Exception:
                    pass
        Endpoint.objects.filter(
            pk__in=[plain.pk, budgeted.pk, plain_many.pk, budgeted_many.pk, stacked.pk, spent.pk]
        ).delete()
        user.delete()
        settings.POLICY_WRITE_RATE_LIMIT = limit_before
    targets = {
        "budgeted_vs_unbudgeted_at_8": TARGET_BUDGETED_VS_UNBUDGETED_AT_8,
        "budgeted_32_vs_8": TARGET_32_VS_8,
        f"budgeted_vs_unbudgeted_at_{MANY_QUEUES}_queues_at_8": TARGET_MANY_QUEUES,
    }
    result: dict[str, Any] = {
        "bench": "admission",
        "duration_s": duration_s,
        "repeats": repeats,
        "unit": "claim+complete cycles per second",
        "targets": targets,
    }
    for mode in modes:
        ratios = {name: summary(values) for name, values in ratio_runs[mode].items()}
        result[mode] = {
            "rates": {
                label: {key: summary([p["rate"] for p in runs]) for key, runs in by_key.items()}
                for label, by_key in measured[mode].items()
            },
            "ratios": ratios,
            # Judged on the median of the per-run ratios: one bad run cannot pass or fail a target.
            "met": {
                name: ratios[name]["median"] >= target
                for name, target in targets.items()
                if name in ratios
            },
            "collapses": _collapses(measured[mode]),
            "points": measured[mode],
        }
        if refused[mode]:
            result[mode]["refused"] = {
                "unit": "claim_next calls per second, each refused (a spent budget)",
                "rates": {
                    n: summary([p["rate"] for p in runs]) for n, runs in refused[mode].items()
                },
                "points": refused[mode],
            }
    result["met"] = {mode: result[mode]["met"] for mode in modes}
    return result


# A run below this share of its point's median is a collapse (issue 12: 87/s against 763/s).
COLLAPSE_SHARE = 0.3


def _collapses(measured: dict[str, dict[str, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Every run under COLLAPSE_SHARE of its point's median, with its repeat number and the dead
    tuples, index pages and load of that very run beside it."""
    found = []
    for label, by_key in measured.items():
        for key, runs in by_key.items():
            median = summary([r["rate"] for r in runs])["median"]
            for repeat, r in enumerate(runs):
                if r["rate"] < COLLAPSE_SHARE * median:
                    found.append({"point": key, "label": label, "repeat": repeat, **r})
    return found


if __name__ == "__main__":
    import json
    import os
    import sys

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "switchboard.settings")
    django.setup()
    print(json.dumps(run(float(sys.argv[1]) if len(sys.argv) > 1 else 5.0), indent=2, default=str))
