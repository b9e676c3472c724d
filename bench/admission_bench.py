"""Admission bench: claim+complete cycles per second on one hot queue, budgeted vs not.

``run(duration_s)`` measures, at 1, 8 and 32 concurrent claimers (threads, each with its own
database connection, calling ``queues.services.claim_next`` then ``complete``), the same queue
shape with no policy and with a policy whose window limit is high enough never to refuse. It
assumes Django is set up on a migrated database and that Redis is reachable; it makes its own
user, endpoints and todos and removes them afterwards (the budget is set and cleared through the
services, so the ledger records both, as it records every budget).

Targets (issue 4): budgeted ≥ 0.6× unbudgeted at 8 claimers; budgeted at 32 ≥ 0.5× budgeted at 8.
"""

from __future__ import annotations

import secrets
import threading
import time
from typing import Any

CONCURRENCY = (1, 8, 32)
QUEUE = "hot"
TARGET_BUDGETED_VS_UNBUDGETED_AT_8 = 0.6
TARGET_32_VS_8 = 0.5
# Todos are made ahead of each phase: the last comparable rate times the phase, with slack.
_INITIAL_RATE_GUESS = 1500.0
_SLACK = 2.0


def _make_todos(endpoint: Any, n: int) -> None:
    from queues.models import Todo

    Todo.objects.bulk_create(
        (Todo(endpoint=endpoint, queue=QUEUE, title=f"bench {i}") for i in range(n)),
        batch_size=5000,
    )


def _phase(endpoint: Any, claimers: int, duration_s: float) -> tuple[float, bool]:
    """Cycles per second of ``claimers`` threads for ``duration_s``; and whether work ran dry."""
    from django.db import connections

    from queues import services
    from queues.access import AgentActor

    actor = AgentActor(endpoint, via="api")
    counts = [0] * claimers
    finished = [0.0] * claimers
    dry = threading.Event()
    errors: list[BaseException] = []
    ready = threading.Barrier(claimers + 1)
    start_at: list[float] = []

    def claimer(i: int) -> None:
        try:
            connections["default"].ensure_connection()
            ready.wait()
            deadline = start_at[0] + duration_s
            n = 0
            while time.perf_counter() < deadline:
                got = services.claim_next(actor=actor, claimant=f"bench-{i}")
                if not isinstance(got, services.Claimed):
                    dry.set()
                    break
                services.complete(actor=actor, todo_id=got.todo.id)
                n += 1
            counts[i] = n
            finished[i] = time.perf_counter()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(claimers)]
    for t in threads:
        t.start()
    start_at.append(time.perf_counter())
    ready.wait()
    began = start_at[0]
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    elapsed = max(finished) - began
    return sum(counts) / elapsed, dry.is_set()


def _cleanup_done(endpoint: Any) -> None:
    from queues.models import Todo

    Todo.objects.filter(endpoint=endpoint).delete()


def run(duration_s: float) -> dict[str, Any]:
    """Measure; answer the rates per concurrency, the ratios and whether the targets were met."""
    from django.contrib.auth import get_user_model

    from admission import services as admission_services
    from queues import services
    from queues.access import HumanActor, SystemActor
    from queues.models import Endpoint

    tag = secrets.token_hex(4)
    user = get_user_model().objects.create_user(f"bench-admission-{tag}")
    actor = HumanActor(user, via="cli")
    plain, _ = services.endpoint_vend(
        actor=SystemActor(via="bench"), owner=user, name=f"bench plain {tag}", queues=[QUEUE], rps=0
    )
    budgeted, _ = services.endpoint_vend(
        actor=SystemActor(via="bench"),
        owner=user,
        name=f"bench budgeted {tag}",
        queues=[QUEUE],
        rps=0,
    )
    rates: dict[str, dict[str, float]] = {"unbudgeted": {}, "budgeted": {}}
    ran_dry: list[str] = []
    try:
        admission_services.policy_set(
            actor=actor,
            endpoint=budgeted,
            queue=QUEUE,
            max_in_flight=None,
            max_claims_per_window=1_000_000,
            window={"period": "day", "tz": "UTC", "start": "00:00"},
            posture="enforce",
        )
        guess = _INITIAL_RATE_GUESS
        for claimers in CONCURRENCY:
            for label, endpoint in (("unbudgeted", plain), ("budgeted", budgeted)):
                _make_todos(endpoint, int(guess * duration_s * _SLACK) + 200)
                rate, dry = _phase(endpoint, claimers, duration_s)
                rates[label][str(claimers)] = round(rate, 1)
                if dry:
                    ran_dry.append(f"{label}@{claimers}")
                guess = max(guess, rate)
                _cleanup_done(endpoint)
    finally:
        try:
            admission_services.policy_clear(actor=actor, endpoint=budgeted, queue=QUEUE)
        except Exception:
            pass
        Endpoint.objects.filter(pk__in=[plain.pk, budgeted.pk]).delete()
        user.delete()
    b, u = rates["budgeted"], rates["unbudgeted"]
    ratios = {
        f"budgeted_vs_unbudgeted_at_{n}": round(b[str(n)] / u[str(n)], 3) if u[str(n)] else None
        for n in CONCURRENCY
    }
    ratios["budgeted_32_vs_8"] = round(b["32"] / b["8"], 3) if b["8"] else None
    ratios["unbudgeted_32_vs_8"] = round(u["32"] / u["8"], 3) if u["8"] else None
    at_8 = ratios["budgeted_vs_unbudgeted_at_8"]
    at_32 = ratios["budgeted_32_vs_8"]
    return {
        "bench": "admission",
        "duration_s": duration_s,
        "unit": "claim+complete cycles per second",
        "rates": rates,
        "ratios": ratios,
        "targets": {
            "budgeted_vs_unbudgeted_at_8": TARGET_BUDGETED_VS_UNBUDGETED_AT_8,
            "budgeted_32_vs_8": TARGET_32_VS_8,
        },
        "met": {
            "budgeted_vs_unbudgeted_at_8": at_8 is not None
            and at_8 >= TARGET_BUDGETED_VS_UNBUDGETED_AT_8,
            "budgeted_32_vs_8": at_32 is not None and at_32 >= TARGET_32_VS_8,
        },
        "ran_dry": ran_dry,
    }


if __name__ == "__main__":
    import json
    import os
    import sys

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "switchboard.settings")
    django.setup()
    print(json.dumps(run(float(sys.argv[1]) if len(sys.argv) > 1 else 5.0), indent=2))
