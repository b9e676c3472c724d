"""Queue priority with aging in claim_next: without settings exactly today's oldest-first; with
them the highest ``priority + floor(wait / aging)`` first, then the oldest; a starved
low-priority queue is served once its oldest todo has waited out its aging bound."""

from __future__ import annotations

import pytest
from django.db import connection

from admission.limits import priority as priority_module
from admission.limits.models import QueueSettings
from admission.limits.priority import QueuePriority
from admission.limits.services import queue_settings_set
from queues import gates, services, sql
from queues.services import Claimed
from tests.conftest import Personas, push


@pytest.fixture(autouse=True)
def names_from_the_database(db: None) -> None:
    """What this process knows of queue settings is process-wide: start each test from the
    database (earlier tests' settings rolled back with them)."""
    QueuePriority().refresh(QueueSettings.objects.values_list("queue", flat=True))


def drain(p: Personas) -> list[str]:
    """Claim until empty, completing each: the todos' titles in the order claimed."""
    order = []
    while isinstance(claimed := services.claim_next(actor=p.as_agent()), Claimed):
        order.append(f"{claimed.todo.queue}:{claimed.todo.id}")
        services.complete(actor=p.as_agent(), todo_id=claimed.todo.id)
    return order


def waited(todo: object, seconds: int) -> None:
    """As if the todo had been created ``seconds`` before the database's now()."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE queues_todo SET created_at = now() - make_interval(secs => %s) WHERE id = %s",
            [seconds, todo.pk],  # type: ignore[attr-defined]
        )


def mixed_backlog(p: Personas) -> list[str]:
    made = []
    for i in range(6):
        queue = ("inbox", "outbox")[i % 3 == 0]
        [todo] = push(p, 1, queue=queue)
        waited(todo, 600 - i)
        made.append(f"{queue}:{todo.id}")
    return made


def test_without_queue_settings_claim_next_is_exactly_oldest_first(personas: Personas) -> None:
    made = mixed_backlog(personas)
    assert not gates.prioritised(["inbox", "outbox"])
    assert "ORDER BY t.created_at, t.id\n" in sql.claim_next_sql(fast=True)
    assert drain(personas) == made


def test_settings_on_other_queues_leave_the_order_oldest_first(personas: Personas) -> None:
    queue_settings_set(actor=personas.as_human(personas.admin), queue="elsewhere", priority=9)
    made = mixed_backlog(personas)
    assert not gates.prioritised(["inbox", "outbox"])
    assert drain(personas) == made


def test_a_higher_priority_queue_is_served_before_older_work(personas: Personas) -> None:
    [old] = push(personas, 1, queue="inbox")
    waited(old, 300)
    [new] = push(personas, 1, queue="outbox")
    queue_settings_set(actor=personas.as_human(personas.admin), queue="outbox", priority=2)
    assert gates.prioritised(["inbox", "outbox"])
    assert drain(personas) == [f"outbox:{new.id}", f"inbox:{old.id}"]


def test_a_starved_low_priority_queue_is_served_within_its_aging_bound(
    personas: Personas,
) -> None:
    admin = personas.as_human(personas.admin)
    # inbox: priority 0, one step per 60 s waited; outbox: priority 3, always fresh work.
    # The bound: after 3 x 60 s an inbox todo ties with fresh outbox work and, older, wins.
    queue_settings_set(actor=admin, queue="inbox", priority=0, aging_seconds=60)
    queue_settings_set(actor=admin, queue="outbox", priority=3)
    [starved] = push(personas, 1, queue="inbox")
    for age in (0, 60, 120, 179):
        waited(starved, age)
        [fresh] = push(personas, 1, queue="outbox")
        claimed = services.claim_next(actor=personas.as_agent())
        assert isinstance(claimed, Claimed) and claimed.todo.id == fresh.id, age
        services.complete(actor=personas.as_agent(), todo_id=fresh.id)
    waited(starved, 180)
    push(personas, 1, queue="outbox")
    claimed = services.claim_next(actor=personas.as_agent())
    assert isinstance(claimed, Claimed) and claimed.todo.id == starved.id


def test_another_process_s_setting_reaches_this_one_inside_a_claim_statement(
    personas: Personas,
) -> None:
    [old] = push(personas, 1, queue="inbox")
    waited(old, 300)
    [new] = push(personas, 1, queue="outbox")
    QueueSettings.objects.create(queue="outbox", priority=1)  # as if written elsewhere
    assert not gates.prioritised(["inbox", "outbox"])  # not known here yet
    priority_module._read_at = float("-inf")  # the cache's time is up
    first = services.claim_next(actor=personas.as_agent())
    assert isinstance(first, Claimed) and first.todo.id == old.id  # carried the names back
    services.release(actor=personas.as_agent(), todo_id=first.todo.id)
    second = services.claim_next(actor=personas.as_agent())
    assert isinstance(second, Claimed) and second.todo.id == new.id


def test_a_claim_with_nothing_to_take_still_carries_the_names_back(personas: Personas) -> None:
    """The bare statement answers no row when there is no candidate, except when it carries
    the priority names: then its one row brings them back with nothing claimable."""
    QueueSettings.objects.create(queue="outbox", priority=1)  # as if written elsewhere
    assert not gates.prioritised(["inbox", "outbox"])
    priority_module._read_at = float("-inf")  # the cache's time is up
    assert gates.priority_stale()
    empty = services.claim_next(actor=personas.as_agent())
    assert not isinstance(empty, Claimed)
    assert not gates.priority_stale() and gates.prioritised(["inbox", "outbox"])
