"""A hundred randomized races: random limits, windows, claimers, processes, completions,
releases, failures, lapsed leases and takeovers, and limit changes between two phases. After each
phase no claim was admitted over the window limit or the in-flight cap in force, and after each
trial charged = claimed = attempt rows."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.db.models import Sum
from django.utils import timezone

from admission import windows
from admission.models import AdmissionPolicy, AdmissionWindow
from queues import services
from queues.models import Attempt
from tests.admission.conftest import budget
from tests.children import Child
from tests.children import children as started
from tests.conftest import FIXTURE, Personas, push

TRIALS = 100
ZONES = ["UTC", "Europe/Berlin", "Australia/Lord_Howe", "Asia/Kolkata", "America/Los_Angeles"]


@pytest.fixture
def children(tx_personas: Personas) -> Iterator[list[Child]]:
    with started("tests.admission.trial_racer") as both:
        yield both


def _window(rng: random.Random) -> dict[str, Any]:
    """A random window whose next boundary is at least half an hour away."""
    tz = rng.choice(ZONES)
    local = timezone.now().astimezone(ZoneInfo(tz))
    per = rng.choice(["hour", "day", "week"])
    window = {
        "per": per,
        "tz": tz,
        "start": (local + timedelta(hours=12, minutes=30)).strftime("%H:%M"),
    }
    if per == "week":
        window["weekday"] = (local + timedelta(days=3)).strftime("%a")
    return window


def _used(policy: AdmissionPolicy) -> int:
    start = windows.window_start(policy, timezone.now())
    row = AdmissionWindow.objects.filter(policy=policy, window_start=start).first()
    return row.used if row else 0


def _over_cap(endpoint_id: Any, new: list[Attempt], cap: int) -> list[str]:
    """Claims of this phase that found ``cap`` or more other claims open when they started."""
    spans = list(
        Attempt.objects.filter(todo__endpoint_id=endpoint_id).values_list("claimed_at", "ended_at")
    )
    over = []
    for attempt in new:
        t = attempt.claimed_at
        open_then = sum(1 for start, end in spans if start <= t and (end is None or end > t))
        if open_then > cap:
            over.append(f"{attempt.todo_id}#{attempt.number} with {open_then} open")
    return over


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
    limit = rng.choice([None, 1, 3, 8, 15]) if cap is not None else rng.choice([1, 3, 8, 15])
    window = _window(rng) if limit is not None else {}
    claims = 0
    for phase in (1, 2):
        if phase == 2 and rng.random() < 0.5:  # a limit change between the phases
            cap = rng.choice([cap, None, 1, 4]) if limit is not None else rng.choice([1, 2, 4])
            limit = rng.choice([limit, 2, 10]) if window else None
        policy = budget(p, endpoint=endpoint, max_in_flight=cap, limit=limit, **window)
        push(p, rng.randint(4, 20), endpoint=endpoint)
        used_before = _used(policy) if limit is not None else 0
        seen = set(Attempt.objects.filter(todo__endpoint=endpoint).values_list("id", flat=True))
        claims += _phase(children, rng, endpoint.id, seed, phase)
        new = list(Attempt.objects.filter(todo__endpoint=endpoint).exclude(id__in=seen))
        if limit is not None:
            assert _used(policy) <= max(used_before, limit), (seed, phase, limit, _used(policy))
        if cap is not None:
            assert not _over_cap(endpoint.id, new, cap), (seed, phase, cap)
    attempts = Attempt.objects.filter(todo__endpoint=endpoint).count()
    charged = AdmissionWindow.objects.filter(policy__endpoint=endpoint).aggregate(n=Sum("used"))[
        "n"
    ]
    assert attempts == claims, (seed, attempts, claims)
    if window:
        assert charged == claims, (seed, charged, claims)


def test_a_hundred_randomized_trials_never_over_admit(
    tx_personas: Personas, children: list[Child]
) -> None:
    for seed in range(TRIALS):
        _trial(tx_personas, children, seed)
