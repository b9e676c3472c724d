"""The Switchboard counters (claims, refusals, pauses, outcomes), moved after commit through Redis.

Label values are queue names and small enumerations only: never an endpoint or an owner.
The scrape-time collector (``switchboard/console/collectors.py``) caps the queue label.
"""

from __future__ import annotations

import functools
from typing import Any

from switchboard.core import counters

CREATED = "switchboard_todos_created_total"
CLAIMED = "switchboard_todos_claimed_total"
COMPLETED = "switchboard_todos_completed_total"
LEASES_EXPIRED = "switchboard_todo_leases_expired_total"
ATTEMPTS = "switchboard_todo_attempts_total"
CHARGED = "switchboard_admission_charged_total"
REFUSALS = "switchboard_admission_refusals_total"
NOTIFY_RUNG = "switchboard_notify_rings_total"
NOTIFY_SUPPRESSED = "switchboard_notify_suppressed_total"
NOTIFY_HOOKS = "switchboard_notify_hooks_total"
LIMIT_REFUSALS = "switchboard_limit_refusals_total"
WAIVERS = "switchboard_waivers_total"

COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    CREATED: ("Todos created.", ("queue", "source")),
    CLAIMED: ("Claims committed, retries and takeovers included.", ("queue",)),
    COMPLETED: (
        "Todos by how a claim or a revoke ended them: done; failed (a fail with attempts left,"
        " retried later); dead_lettered (a fail or release of the last attempt, the reaper at"
        " the last attempt, a revoke's live todos).",
        ("queue", "outcome"),
    ),
    LEASES_EXPIRED: ("Claims whose lease lapsed and were reaped.", ("queue",)),
    ATTEMPTS: ("Claims by the attempt number they started.", ("queue", "attempt_bucket")),
    CHARGED: ("Claims charged to an admission policy.", ("queue",)),
    REFUSALS: ("Claims refused by admission, by reason.", ("queue", "reason")),
    NOTIFY_RUNG: ("todo_ready notifications committed, by reason.", ("reason",)),
    NOTIFY_SUPPRESSED: ("Rings the gate withheld (paused or deferred), by reason.", ("reason",)),
    NOTIFY_HOOKS: ("Ready hook deliveries, by outcome.", ("outcome",)),
    LIMIT_REFUSALS: ("Todos a named limit held back from a claim, by gate.", ("gate",)),
    WAIVERS: ("Claims admitted over an advise limit (one waiver row each), by gate.", ("gate",)),
}


def attempt_bucket(attempt: int) -> str:
    if attempt <= 3:
        return str(attempt)
    if attempt <= 5:
        return "4-5"
    return "6+"


def created(queue: str, source: str) -> None:
    counters.incr(CREATED, {"queue": queue, "source": source})


def claimed(queue: str, attempt: int, *, charged: bool, connection: Any = None) -> None:
    """``connection``: the default database's, when the caller holds it (``counters``)."""
    counters.incr_keyed(_claimed_keys(queue, attempt_bucket(attempt), charged), connection)


# Every claim and every ending counts: their label keys are made once per label set.
@functools.lru_cache(maxsize=4096)
def _claimed_keys(queue: str, bucket: str, charged: bool) -> tuple[counters.Keyed, ...]:
    keys = [
        ((CLAIMED, counters.label_key({"queue": queue})), 1),
        ((ATTEMPTS, counters.label_key({"queue": queue, "attempt_bucket": bucket})), 1),
    ]
    if charged:
        keys.append(((CHARGED, counters.label_key({"queue": queue})), 1))
    return tuple(keys)


def completed(queue: str, outcome: str, amount: int = 1, connection: Any = None) -> None:
    counters.incr_keyed((((COMPLETED, _completed_key(queue, outcome)), amount),), connection)


@functools.lru_cache(maxsize=4096)
def _completed_key(queue: str, outcome: str) -> str:
    return counters.label_key({"queue": queue, "outcome": outcome})


def leases_expired(queue: str, amount: int) -> None:
    counters.incr(LEASES_EXPIRED, {"queue": queue}, amount)


def refused(queue: str, reason: str) -> None:
    counters.incr(REFUSALS, {"queue": queue, "reason": reason})


def notify_rung(reason: str) -> None:
    counters.incr(NOTIFY_RUNG, {"reason": reason})


def notify_suppressed(reason: str) -> None:
    counters.incr(NOTIFY_SUPPRESSED, {"reason": reason})


def notify_hook(outcome: str) -> None:
    counters.incr(NOTIFY_HOOKS, {"outcome": outcome})


def limit_refused(gate: str, amount: int = 1) -> None:
    counters.incr(LIMIT_REFUSALS, {"gate": gate}, amount)


def waived(gate: str) -> None:
    counters.incr(WAIVERS, {"gate": gate})
