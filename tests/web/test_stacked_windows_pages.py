"""Stacked windows on the board and the budget page: every window's use against its limit, read
through the one usage selector, and the window that holds the claims marked as binding."""

from __future__ import annotations

import re
from typing import Any

from queues import services as queue_services
from queues.services import Claimed, NothingClaimable
from tests.admission.test_stacked_windows import day, stacked, week
from tests.conftest import Personas, push
from tests.web.conftest import signed_in

TOKYO_DAY = {"limit": 9, "period": "day", "tz": "Asia/Tokyo", "start": "00:00"}


def gauges(html: str) -> list[str]:
    strip = html.split('aria-label="Budget"')[1].split("</dl>")[0]
    return re.findall(r'<div class="gauge[^"]*">.*?</div>', strip, flags=re.S)


def spend_the_week(p: Personas) -> Any:
    """Three windows, the week's limit of two spent; returns the todo left waiting."""
    stacked(p, day(5), week(2), TOKYO_DAY)
    pushed = push(p, 3)
    claimed = [queue_services.claim_next(actor=p.as_agent()) for _ in range(2)]
    assert all(isinstance(c, Claimed) for c in claimed)
    assert isinstance(queue_services.claim_next(actor=p.as_agent()), NothingClaimable)
    taken = {c.todo.id for c in claimed if isinstance(c, Claimed)}
    (waiting,) = [t for t in pushed if t.id not in taken]
    return waiting


def test_the_board_strip_shows_every_window_and_marks_the_binding_one(
    personas: Personas,
) -> None:
    p = personas
    spend_the_week(p)
    html = signed_in(p.owner).get("/?endpoint=agent&queue=inbox").content.decode()
    first, second, third = [g for g in gauges(html) if "<dt>window" in g]
    assert "<dt>window 1</dt>" in first and "2 of 5" in first and "binding" not in first
    assert "<dt>window 2</dt>" in second and "2 of 2" in second
    assert 'class="gauge binding"' in second and "binding-mark" in second
    assert "Europe/Berlin" in second
    assert "<dt>window 3</dt>" in third and "2 of 9" in third and "Asia/Tokyo" in third
    assert "binding" not in third
    assert "Deferred · window used up" in html


def test_a_single_window_strip_reads_as_before(personas: Personas) -> None:
    p = personas
    stacked(p, day(4))
    push(p, 1)
    assert isinstance(queue_services.claim_next(actor=p.as_agent()), Claimed)
    html = signed_in(p.owner).get("/?endpoint=agent&queue=inbox").content.decode()
    (window,) = [g for g in gauges(html) if "<dt>window" in g]
    assert "<dt>window</dt>" in window and "1 of 4" in window and "binding" not in window


def test_the_budget_page_charts_each_window_over_its_own_counters(personas: Personas) -> None:
    p = personas
    spend_the_week(p)
    html = signed_in(p.owner).get("/budgets/agent/inbox").content.decode()
    charts = re.findall(r'<div class="window-chart[^"]*" id="chart-\d">.*?</details>', html, re.S)
    assert len(charts) == 3
    day_chart, week_chart, tokyo_chart = charts
    assert "Window 1: 5 claims" in day_chart and "2 of 5</strong> used now" in day_chart
    assert "Window 2: 2 claims" in week_chart and "2 of 2</strong> used now" in week_chart
    assert 'class="window-chart binding"' in week_chart and "binding: holds claims" in week_chart
    assert "binding" not in day_chart and "binding" not in tokyo_chart
    # Each chart draws only its own window's counter: one bar, at that window's limit.
    for chart, limit in ((day_chart, 5), (week_chart, 2), (tokyo_chart, 9)):
        svg = chart.split("<svg")[1].split("</svg>")[0]
        assert svg.count('class="used"') == 1
        assert re.search(rf"2 used, \d refused, limit {limit}</title>", svg), svg
    assert "(Asia/Tokyo)" in tokyo_chart and "(Europe/Berlin)" in week_chart


def test_a_waiting_todo_page_lists_every_window_of_its_budget(personas: Personas) -> None:
    p = personas
    waiting = spend_the_week(p)
    html = signed_in(p.owner).get(f"/todos/{waiting.id}").content.decode()
    budget_line = html.split("Budget (enforce):")[1].split("</p>")[0]
    assert "2 of 5 claims per day" in budget_line
    assert "2 of 2 claims per week" in budget_line and "(binding)" in budget_line
    assert "2 of 9 claims per day" in budget_line and "Asia/Tokyo" in budget_line
    assert budget_line.count("(binding)") == 1
