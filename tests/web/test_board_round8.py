"""The board and the queue page say why a todo a named limit holds is waiting, and until when:
its card's chip names the hold and the instant in the viewer's zone, the section's head names
the limit (kind and name), and a section whose pending work a limit holds entirely is not
"Healthy". Read from the same gates as the todo's page (its explain), for every card at once."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext

from admission.limits import services as limit_services
from admission.limits.models import RateLimit
from queues import selectors, services
from switchboard.console.templatetags.console import at_zone
from switchboard.core.zones import zone_named
from tests.admission.test_api import human
from tests.conftest import Personas, push
from tests.limits.conftest import clear_of_a_minute_boundary, pool, tag
from tests.web.conftest import budget, signed_in

ZONE = "Asia/Kolkata"


def board(p: Personas, url: str = "/?endpoint=agent&queue=inbox") -> str:
    client = signed_in(p.owner)
    client.cookies["tz"] = ZONE
    return client.get(url).content.decode()


def head(html: str, key: str = "agent--inbox") -> str:
    return html.split(f'id="head-{key}"')[1].split(f'id="controls-{key}"')[0]


def card(html: str, todo: Any, key: str = "agent--inbox") -> str:
    """The card of ``todo`` in the section ``key``."""
    cards = html.split(f'id="cards-{key}"')[1].split("</ul>")[0]
    found = [c for c in cards.split("<li ")[1:] if f"/todos/{todo.id}?" in c]
    assert len(found) == 1, todo
    return found[0]


def eligible(todo: Any) -> str:
    """When the todo's page says the todo may run, as the viewer's zone writes it."""
    explained = selectors.todo_explain(todo)
    assert explained is not None and explained.binding is not None
    return at_zone(explained.binding.next_eligible_at, zone_named(ZONE)[1])


def a_full_pool(p: Personas) -> Any:
    """Pool gpu (1 slot) held by one claim; returns the todo it holds."""
    pool("gpu", slots=1)
    first, waiting = push(p, 2, pool="gpu")
    services.claim(actor=p.as_agent(), todo_id=first.id, lease_ttl_seconds=600)
    return waiting


def test_a_card_a_full_pool_holds_says_so_and_when_it_may_run(personas: Personas) -> None:
    p = personas
    waiting = a_full_pool(p)
    html = board(p)
    chip = card(html, waiting)
    assert f"Deferred · pool full: gpu · eligible ≈ {eligible(waiting)}</span>" in chip
    assert 'class="chip tone-exhausted"' in chip
    top = head(html)
    assert "Held by pool <bdi>gpu</bdi>" in top
    assert f"full · eligible ≈ {eligible(waiting)}" in top
    assert "holds 1 waiting card below" in top


def test_a_section_whose_pending_work_a_limit_holds_is_not_healthy(personas: Personas) -> None:
    p = personas
    a_full_pool(p)
    html = board(p)
    assert 'data-tone="exhausted">Deferred · a named limit is full<' in head(html)
    assert "every claim is admitted" not in head(html)
    # The queue page reads the same sections: its condition is not "Healthy" either.
    client = signed_in(p.owner)
    page = client.get("/queues/inbox").content.decode()
    panel = page.split('id="queue-pause"')[1].split("</div>")[0]
    assert "Deferred · a named limit is full" in panel and "Healthy" not in panel
    # And the fleet summary counts it with the held ones.
    summary = board(p, "/").split('id="fleet-summary"')[1].split("</nav>")[0]
    assert re.search(
        r'<span class="n">1</span> <span class="w">Deferred · a named limit is full', summary
    )
    # The queue list and its API read so too ("Healthy" before).
    listed = client.get("/queues").content.decode()
    row = listed[listed.index('href="/queues/inbox"') :]
    assert "Deferred · a named limit is full" in row[: row.index("</tr>")]
    overview = {q["queue"]: q for q in human(p.owner).get("/api/v1/queues").json()["queues"]}
    assert overview["inbox"]["condition"] == "deferred_limit"
    # Work a claim could take beside it: not held, as a section with a free todo is not.
    push(p, 1)
    listed = client.get("/queues").content.decode()
    row = listed[listed.index('href="/queues/inbox"') :]
    assert "Deferred · a named limit is full" not in row[: row.index("</tr>")]


def test_work_a_limit_holds_only_in_part_leaves_the_section_healthy_but_says_which(
    personas: Personas,
) -> None:
    p = personas
    waiting = a_full_pool(p)
    (free,) = push(p, 1)
    html = board(p)
    top = head(html)
    assert 'data-tone="admitted">Healthy<' in top
    assert "Held by pool <bdi>gpu</bdi>" in top and "No budget.<" in top
    assert "Deferred" in card(html, waiting)
    assert "chip" not in card(html, free)


def test_a_rate_limit_hold_is_exact_and_a_quarantine_waits_for_an_operator(
    personas: Personas,
) -> None:
    p = personas
    clear_of_a_minute_boundary()
    RateLimit.objects.create(name="openai", base_limit=1)
    first, rated = push(p, 2, rate_limit="openai")
    services.claim(actor=p.as_agent(), todo_id=first.id)
    pool("tpu", slots=1)
    (quarantined,) = push(p, 1, queue="outbox", pool="tpu")
    limit_services.limit_quarantine(actor=p.as_human(p.admin), kind="pool", name="tpu")
    html = board(p, "/?endpoint=agent")
    # A rate limit's minute is certain: no "≈".
    assert f"Deferred · rate limit reached: openai · eligible {eligible(rated)}<" in card(
        html, rated
    )
    assert "Held by rate limit <bdi>openai</bdi>" in head(html)
    quarantine_chip = card(html, quarantined, "agent--outbox")
    assert "Deferred · limit quarantined: tpu</span>" in quarantine_chip
    assert "eligible" not in quarantine_chip
    outbox = head(html, "agent--outbox")
    assert "Held by pool <bdi>tpu</bdi>" in outbox and "until an operator acts" in outbox


def test_a_limit_that_holds_longer_than_the_budget_names_the_chip(personas: Personas) -> None:
    # The budget defers the queue (one in flight) until that lease ends; pool tpu is
    # quarantined, which only an operator ends: the pool binds, as the todo's page says.
    p = personas
    budget(p, max_in_flight=1)
    pool("tpu", slots=1)
    (busy,) = push(p, 1)
    (waiting,) = push(p, 1, pool="tpu")
    services.claim(actor=p.as_agent(), todo_id=busy.id, lease_ttl_seconds=600)
    limit_services.limit_quarantine(actor=p.as_human(p.admin), kind="pool", name="tpu")
    assert "Deferred · limit quarantined: tpu</span>" in card(board(p), waiting)
    # The pool's limit raised, the budget holds alone again, and its chip is back.
    limit_services.limit_set(actor=p.as_human(p.admin), kind="pool", name="tpu", slots=5)
    assert f"At cap · in flight full · eligible ≈ {eligible(waiting)}</span>" in card(
        board(p), waiting
    )


def test_a_budget_that_holds_longer_than_a_limit_keeps_the_chip(personas: Personas) -> None:
    # One claim a day (the window resets in about twelve hours), and pool gpu full until a
    # one-minute lease lapses: the budget binds.
    p = personas
    noon = (12 - datetime.now(UTC).hour) % 24
    offset = noon - 24 if noon > 12 else noon  # the zone where it is about noon now
    zone = "Etc/GMT" + (f"{-offset:+d}" if offset else "")
    budget(p, max_claims_per_window=1, tz=zone)
    pool("gpu", slots=1)
    first, waiting = push(p, 2, pool="gpu")
    services.claim(actor=p.as_agent(), todo_id=first.id, lease_ttl_seconds=60)
    chip = card(board(p), waiting)
    assert f"Deferred · window used up · eligible {eligible(waiting)}</span>" in chip
    assert "Held by pool" not in head(board(p))


def test_holds_are_read_for_every_card_at_once(personas: Personas) -> None:
    p = personas
    pool("gpu", slots=1)
    first, *_ = push(p, 3, pool="gpu")
    services.claim(actor=p.as_agent(), todo_id=first.id, lease_ttl_seconds=600)
    client = signed_in(p.owner)

    def queries() -> int:
        client.get("/")
        with CaptureQueriesContext(connection) as captured:
            html = client.get("/").content.decode()
        assert "Held by pool <bdi>gpu</bdi>" in html
        return len(captured)

    few = queries()
    push(p, 12, pool="gpu")
    push(p, 12, queue="outbox", pool="gpu")
    assert queries() == few


def test_a_limit_holding_cards_that_name_different_limits_is_named_once(
    personas: Personas,
) -> None:
    # The todo page's explain details every limit a todo names, so two waiting todos held by
    # the one full tag (one naming it alone, one naming it and a tag with room) read apart
    # there; the section's head names the hold itself, once, with both cards.
    p = personas
    tag("hx", 1)
    tag("hy", 5)
    (first,) = push(p, 1, tags=["hx"])
    services.claim(actor=p.as_agent(), todo_id=first.id, lease_ttl_seconds=600)
    (alone,) = push(p, 1, tags=["hx"])
    (both,) = push(p, 1, tags=["hx", "hy"])
    html = board(p)
    top = head(html)
    assert top.count("Held by tag") == 1, top
    assert "Held by tag <bdi>hx</bdi>" in top and "holds 2 waiting cards below" in top
    assert eligible(alone) == eligible(both)
    assert f"full · eligible ≈ {eligible(alone)}" in top
