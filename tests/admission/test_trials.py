"""A hundred randomized races: random limits, one to three stacked windows, claimers, processes,
completions, releases, failures, lapsed leases and takeovers, and limit changes between two phases.
After each phase no claim was admitted over any window's limit or the in-flight cap in force, and
after each trial every window charged = claimed = attempt rows."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone

from admission import engine
from admission import services as admission_services
from admission.models import AdmissionPolicy, AdmissionWindow
from admission.selectors import policy_row
from queues import services
from tests.admission.conftest import over_cap
from tests.children import Child
from tests.children import children as started
from tests.conftest import FIXTURE, Personas, attempt_count, every_attempt, push

TRIALS = 100
ZONES = ["UTC", "Europe/Berlin", "Australia/Lord_Howe", "Asia/Kolkata", "America/Los_Angeles"]


@pytest.fixture
def children(tx_personas: Personas) -> Iterator[list[Child]]:
    with started("tests.admission.trial_racer") as both:
        yield both


def _window(rng: random.Random, taken: set[tuple[str, str]]) -> dict[str, Any]:
    """A random window whose next boundary is at least half an hour away, of a period and zone
    not yet ``taken`` (two windows of one period and zone would be the same window)."""
    while True:
        tz, per = rng.choice(ZONES), rng.choice(["hour", "day", "week"])
        if (per, tz) not in taken:
            taken.add((per, tz))
            break
    local = timezone.now().astimezone(ZoneInfo(tz))
    window = {
        "period": per,
        "tz": tz,
        "start": (local + timedelta(hours=12, minutes=30)).strftime("%H:%M"),
    }
    if per == "week":
        window["weekday"] = (local + timedelta(days=3)).strftime("%a")
    return window


def _set(
    p: Personas, endpoint: Any, cap: int | None, stack: list[dict[str, Any]]
) -> AdmissionPolicy:
    return admission_services.policy_set(
        actor=p.as_human(p.owner),
        endpoint=endpoint,
        queue="inbox",
        max_in_flight=cap,
        max_claims_per_window=None,
        window=None,
        windows=stack or None,
    )


def _used(policy: AdmissionPolicy) -> dict[str, int]:
    """Each window's counter for the window current now, by counter key (read from the table)."""
    bounds = engine.all_bounds(policy_row(policy), timezone.now()) or {}
    rows = AdmissionWindow.objects.filter(policy=policy)
    return {
        key: sum(r.used for r in rows if r.window_key == key and r.window_start == start)
        for key, (start, _) in bounds.items()
    }


def _phase(
    children: list[Child], rng: random.Random, endpoint_id: Any, seed: int, phase: int
) -> int:
    procs = rng.choice([1, 2])
    for child in children[:procs]:
        child.send(
            {
                "endpoint": str(endpoint_id),
                "threads": rng.randint(2, 6),
                "ops": rng.randint(2, 4),
                "seed": f"{seed}.{phase}",
            }
        )
    reports = [child.receive() for child in children[:procs]]
    errors = [e for r in reports for e in r["errors"]]
    assert not errors, (seed, errors)
    return sum(r["claims"] for r in reports)


def _trial(p: Personas, children: list[Child], seed: int) -> None:
    rng = random.Random(seed)
    endpoint, _ = services.endpoint_vend(
        actor=FIXTURE, owner=p.owner, name=f"trial {seed}", queues=["inbox"], rps=0
    )
    cap = rng.choice([None, 1, 2, 3, 5])
    taken: set[tuple[str, str]] = set()
    count = rng.choice([0, 1, 2, 3]) if cap is not None else rng.choice([1, 2, 3])
    stack = [{"limit": rng.choice([1, 3, 8, 15]), **_window(rng, taken)} for _ in range(count)]
    claims = 0
    for phase in (1, 2):
        if phase == 2 and rng.random() < 0.5:  # a limit change between the phases
            cap = rng.choice([cap, None, 1, 4]) if stack else rng.choice([1, 2, 4])
            stack = [{**w, "limit": rng.choice([w["limit"], 2, 10])} for w in stack]
        policy = _set(p, endpoint, cap, stack)
        push(p, rng.randint(4, 20), endpoint=endpoint)
        used_before = _used(policy)
        # An attempt is its todo, number and start, whether it has ended (a row) or not yet.
        seen = {(a.todo_id, a.number, a.claimed_at) for a in every_attempt(endpoint=endpoint)}
        claims += _phase(children, rng, endpoint.id, seed, phase)
        new = [
            a
            for a in every_attempt(endpoint=endpoint)
            if (a.todo_id, a.number, a.claimed_at) not in seen
        ]
        used_after = _used(policy)
        for item in policy_row(policy).window_limits():
            limit, key = item.limit, item.key
            assert used_after[key] <= max(used_before[key], limit), (seed, phase, key, used_after)
        if cap is not None:
            assert not over_cap(endpoint.id, new, cap), (seed, phase, cap)
    attempts = attempt_count(endpoint=endpoint)
    assert attempts == claims, (seed, attempts, claims)
    charged = AdmissionWindow.objects.filter(policy__endpoint=endpoint).values_list(
        "window_key", "used"
    )
    per_window: dict[str, int] = {}
    for key, n in charged:
        per_window[key] = per_window.get(key, 0) + n
    # Every window is charged once per claim: each one's counters add up to the claims.
    assert len(per_window) == len(stack) or claims == 0, (seed, per_window, len(stack))
    assert all(n == claims for n in per_window.values()), (seed, per_window, claims)


def test_a_hundred_randomized_trials_never_over_admit(
    tx_personas: Personas, children: list[Child]
) -> None:
    for seed in range(TRIALS):
        _trial(tx_personas, children, seed)
