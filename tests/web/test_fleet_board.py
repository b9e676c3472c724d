"""The board of a fleet: trouble first under a summary, healthy queues folded, search, one
vocabulary of conditions on every surface, and a query count that does not grow with the fleet."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext

from bench.fleet import seed
from queues.access import Viewer
from switchboard.console import live
from switchboard.console.board import Filters
from tests.conftest import Personas
from tests.web.conftest import signed_in


@pytest.fixture
def fleet(db: None) -> Any:
    return seed(identities=40, todos=800, ledger_rows=0, prefix="f")


def _sections(html: str) -> list[str]:
    """The identities shown in full, in page order (``<slug>--<queue>``)."""
    return re.findall(r'<section class="qsection" id="q-([^"]+)"', html)


def test_the_summary_counts_every_condition_and_links_to_a_filter(fleet: Any) -> None:
    html = signed_in(fleet.owner).get("/").content.decode()
    summary = html[
        html.index('id="fleet-summary"') : html.index("</nav>", html.index("fleet-summary"))
    ]
    assert "<strong>40</strong> queue identities" in summary
    for words in (
        "Paused",
        "Deferred · window used up",
        "At cap · in flight full",
        "Dead letters",
        "Failing · retries waiting",
        "Healthy",
    ):
        assert words in summary, words
    assert '<span class="n">35</span> <span class="w">Healthy</span>' in summary
    assert 'href="/?state=dead_letter&amp;condition=dead_letters"' in summary


def test_trouble_comes_first_and_healthy_queues_fold_to_one_line(fleet: Any) -> None:
    html = signed_in(fleet.owner).get("/").content.decode()
    shown = _sections(html)
    trouble = {f"{e.slug}--{q}" for pairs in fleet.trouble.values() for e, q in pairs}
    assert set(shown) == trouble  # only the five in trouble are open
    assert shown[0] == "{}--{}".format(*_slug_queue(fleet.trouble["paused"][0]))
    assert html.count('class="qline"') == 35
    assert "35 more without trouble" in html


def test_a_condition_link_shows_just_those_queues_in_full(fleet: Any) -> None:
    (endpoint, queue), *_ = fleet.trouble["dead_letters"]
    html = signed_in(fleet.owner).get("/?condition=dead_letters").content.decode()
    assert _sections(html) == [f"{endpoint.slug}--{queue}"]
    assert "dead letter" in html
    healthy = signed_in(fleet.owner).get("/?condition=healthy").content.decode()
    assert len(_sections(healthy)) == 35 and 'class="qline"' not in healthy


def test_search_finds_todos_by_title_id_and_payload_text(fleet: Any) -> None:
    from queues.models import Todo

    client = signed_in(fleet.owner)
    by_title = client.get("/?q=summarise+invoice+17").content.decode()
    assert "Summarise invoice 17<" in by_title and "Summarise invoice 18<" not in by_title
    by_payload = client.get("/?q=INV-433").content.decode()
    assert "Summarise invoice 433<" in by_payload and len(_sections(by_payload)) == 1
    todo = Todo.objects.get(title="Summarise invoice 5")
    by_id = client.get(f"/?q={todo.id}").content.decode()
    assert _sections(by_id) == [f"{todo.endpoint.slug}--{todo.queue}"]
    assert "Summarise invoice 5<" in by_id
    # A done todo is found too: a search looks through every state.
    assert "Summarise invoice 10<" in client.get("/?q=Summarise+invoice+10").content.decode()
    nothing = client.get("/?q=no-such-thing").content.decode()
    assert "No queue matches these filters" in nothing


def test_a_board_render_costs_the_same_queries_however_many_sections(db: None) -> None:
    small = seed(identities=4, todos=80, ledger_rows=0, prefix="s")
    client = signed_in(small.owner)  # a superuser: the board shows the whole fleet
    urls = ("/", "/?q=invoice", "/?condition=paused", "/?state=failed", "/?endpoint=s-agent-000")

    def render(url: str) -> tuple[int, str]:
        client.get(url)
        with CaptureQueriesContext(connection) as captured:
            response = client.get(url)
        assert response.status_code == 200, url
        return len(captured), response.content.decode()

    few = {url: render(url) for url in urls}
    seed(identities=40, todos=800, ledger_rows=0, prefix="l")
    many = {url: render(url) for url in urls}

    # The fleet grew from 4 sections, all open, to 44, most folded: the same queries for each view.
    assert "<strong>4</strong> queue identities" in few["/"][1]
    assert "<strong>44</strong> queue identities" in many["/"][1]
    assert len(_sections(many["/"][1])) > len(_sections(few["/"][1]))
    assert {url: n for url, (n, _) in few.items()} == {url: n for url, (n, _) in many.items()}


def test_queues_say_what_is_wrong_and_never_live_when_stuck(fleet: Any) -> None:
    html = signed_in(fleet.owner).get("/queues").content.decode()
    assert "Live" not in html
    (_, window_queue), *_ = fleet.trouble["window"]
    row = html[html.index(f">{window_queue}</a>") :].split("</tr>")[0]
    assert "Deferred · window used up" in row
    (_, cap_queue), *_ = fleet.trouble["at_cap"]
    page = signed_in(fleet.owner).get(f"/queues/{cap_queue}").content.decode()
    assert "At cap · in flight full" in page and "Live" not in page


def test_the_api_and_metrics_use_the_same_words(fleet: Any) -> None:
    from django.test import Client

    client = signed_in(fleet.owner)
    queues = {q["queue"]: q for q in client.get("/api/v1/queues").json()["queues"]}
    (_, window_queue), *_ = fleet.trouble["window"]
    (_, dead_queue), *_ = fleet.trouble["dead_letters"]
    (_, paused_queue), *_ = fleet.trouble["paused"]
    assert queues[window_queue]["condition"] == "deferred_window"
    assert queues[dead_queue]["conditions"] == ["dead_letters"]
    assert queues[paused_queue]["condition"] == "paused"
    metrics = Client().get("/metrics", headers={"Authorization": "Bearer test-metrics-token"})
    text = metrics.content.decode()
    assert (
        f'switchboard_queue_condition{{condition="deferred_window",queue="{window_queue}"}} 1.0'
        in text
    )
    assert f'switchboard_queue_condition{{condition="paused",queue="{paused_queue}"}} 1.0' in text


def test_the_live_board_renders_the_folded_fleet_and_its_summary(fleet: Any) -> None:
    request = RequestFactory().get("/live")
    request.user = fleet.owner
    viewer = Viewer.of(request)
    shown = live.render_board(request, viewer, Filters(), "/", "token")
    assert sum(shown.folded) == 35
    assert "fleet-summary" in shown.parts
    assert sum(1 for key in shown.parts if key.startswith("line-")) == 35


def test_a_superuser_sees_the_personas_fleet_in_full_when_small(personas: Personas) -> None:
    html = signed_in(personas.admin).get("/").content.decode()
    assert len(_sections(html)) == 5 and 'class="qline"' not in html


def _slug_queue(pair: tuple[Any, str]) -> tuple[str, str]:
    return pair[0].slug, pair[1]
