"""One vocabulary for what state a queue is in, used by the board, ``/queues``, the queue page,
``GET /api/v1/queues`` and ``/metrics`` alike; and the words for one todo's state (``TodoWord``),
used by its card, its page and the bulk confirmations.

A queue identity (endpoint, queue) can be in several conditions at once: paused *and* holding
dead letters. ``of`` lists every condition that holds, worst first; the first is the one a badge
shows, and the list is what the board's summary counts and its condition filter matches. A
queue name (``/queues``, the API) takes the worst condition among its identities.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db import models


class Condition(models.TextChoices):
    # Worst first: the order is the board's order and the badge's precedence.
    PAUSED = "paused", "Paused"
    DEFERRED_UNAVAILABLE = "deferred_unavailable", "Deferred · admission unavailable"
    DEFERRED_HELD = "deferred_held", "Deferred · held by a zero limit"
    DEFERRED_WINDOW = "deferred_window", "Deferred · window used up"
    DEFERRED_LIMIT = "deferred_limit", "Deferred · a named limit is full"
    AT_CAP = "at_cap", "At cap · in flight full"
    DEAD_LETTERS = "dead_letters", "Dead letters"
    FAILING = "failing", "Failing · retries waiting"
    QUARANTINE = "quarantine", "Quarantine · never delivered"
    HEALTHY = "healthy", "Healthy"


RANK = {c: i for i, c in enumerate(Condition)}

# The colour family of each condition (always shown with its words, never alone).
TONE = {
    Condition.PAUSED: "paused",
    Condition.DEFERRED_UNAVAILABLE: "unavailable",
    Condition.DEFERRED_HELD: "paused",
    Condition.DEFERRED_WINDOW: "exhausted",
    Condition.DEFERRED_LIMIT: "exhausted",
    Condition.AT_CAP: "exhausted",
    Condition.DEAD_LETTERS: "failing",
    Condition.FAILING: "failing",
    Condition.QUARANTINE: "quarantine",
    Condition.HEALTHY: "admitted",
}

# A claim gate's refusal reason (the API's ``admission.reason``) as a condition. The reasons are
# the gates' words (admission's DeferralReason); queues names them without importing admission.
BY_REASON = {
    "window_exhausted": Condition.DEFERRED_WINDOW,
    "in_flight_full": Condition.AT_CAP,
    "paused": Condition.DEFERRED_HELD,
    "admission_unavailable": Condition.DEFERRED_UNAVAILABLE,
}

# The conditions that need an operator: the board shows them first and in full.
TROUBLE = frozenset(set(Condition) - {Condition.HEALTHY, Condition.QUARANTINE})


def of(
    *,
    quarantine: bool,
    paused: bool,
    refusals: Iterable[str | None],
    failing: int,
    dead_letter: int,
) -> list[Condition]:
    """Every condition that holds for a queue identity or a queue name, worst first; never
    empty. ``refusals`` are the reasons the claim gates refuse it now (none when admitted)."""
    found: list[Condition] = []
    if paused and not quarantine:
        found.append(Condition.PAUSED)
    for reason in refusals:
        condition = for_reason(reason)
        if condition is not None and condition not in found:
            found.append(condition)
    if dead_letter:
        found.append(Condition.DEAD_LETTERS)
    if failing:
        found.append(Condition.FAILING)
    if quarantine:
        found.append(Condition.QUARANTINE)
    found.sort(key=RANK.__getitem__)
    return found or [Condition.HEALTHY]


def for_reason(reason: str | None) -> Condition | None:
    """The condition a deferred todo's reason names (its chip's words)."""
    if reason is None:
        return None
    return BY_REASON.get(reason, Condition.DEFERRED_LIMIT)


def worst(conditions: Iterable[Condition]) -> Condition:
    return min(conditions, key=RANK.__getitem__, default=Condition.HEALTHY)


class TodoWord(models.TextChoices):
    """What a todo's state reads as wherever a todo is shown. A failed todo reads differently
    with a retry to come and without one: a dead letter is dead, and says so."""

    PENDING = "pending", "pending"
    CLAIMED = "claimed", "claimed"
    DONE = "done", "done"
    FAILED = "failed", "failed · retry waiting"
    DEAD_LETTER = "dead_letter", "dead letter"
    DISCARDED = "discarded", "discarded"


def todo_word(state: str, next_retry_at: datetime | None) -> TodoWord:
    if state == TodoWord.FAILED and next_retry_at is None:
        return TodoWord.DEAD_LETTER
    return TodoWord(state)
