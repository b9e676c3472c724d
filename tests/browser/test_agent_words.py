"""An agent's words cannot reorder the console's own: a bidirectional control character in a
title, a kind, a claimant, an endpoint's name, a pause reason or a board search (a right-to-left
override, U+202E, say) stays inside that value.

Unisolated, an override in a todo's title showed the bulk confirmation's "· inbox on agent ·
PENDING" after it as "GNIDNEP · tnega no xobni ·": an agent could make the queue, the endpoint or
the state an operator reads before a discard say something else. Each such value is a <bdi>."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Page

from queues import services
from tests.browser.conftest import WIDTHS, Session
from tests.conftest import Personas

RLO = "\u202e"  # RIGHT-TO-LEFT OVERRIDE: what follows is laid out right to left

# Where the first occurrence of each text under ``root`` starts (one text node each): its line's
# top and its left edge.
_STARTS = """([root, needles]) => {
  const scope = document.querySelector(root);
  const edges = {};
  for (const needle of needles) {
    const walker = document.createTreeWalker(scope, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const at = node.data.indexOf(needle);
      if (at < 0) continue;
      const range = document.createRange();
      range.setStart(node, at);
      range.setEnd(node, at + needle.length);
      const box = range.getClientRects()[0];
      edges[needle] = [Math.round(box.top), box.left];
      break;
    }
  }
  return edges;
}"""


def reads_left_to_right(page: Page, root: str, *texts: str) -> None:
    """``texts`` (in the order the page writes them) appear in that order: line by line, and
    left to right on a line."""
    edges: dict[str, list[float]] = page.evaluate(_STARTS, [root, list(texts)])
    assert list(edges) == list(texts), f"{root}: found only {list(edges)}"
    places = [tuple(edges[t]) for t in texts]
    assert places == sorted(places), f"{root}: {texts} laid out at (top, left) {places}"


@pytest.mark.parametrize("width", WIDTHS)
def test_a_bidi_control_in_an_agents_words_reorders_nothing_around_them(
    session: Session, tx_personas: Personas, width: int
) -> None:
    p = tx_personas
    agent = p.as_agent()
    titled: Any = services.todo_create(
        actor=agent, endpoint=p.agent, queue="inbox", title=f"Innocent {RLO}", kind=f"k{RLO}"
    ).todo
    services.claim(actor=agent, todo_id=titled.id, claimant=f"worker {RLO}")
    services.todo_create(actor=agent, endpoint=p.agent, queue="inbox", title=f"Waiting {RLO}")
    page = session.page(p.admin, width=width)

    page.goto("/todos/bulk/discard?queue=inbox")
    reads_left_to_right(page, ".bulk-sample li", "Waiting", "inbox", "agent", "pending")
    page.goto("/agents")
    reads_left_to_right(page, ".held li", "Innocent", "inbox", "by", "attempt", "lease until")
    page.goto("/?queue=inbox")
    reads_left_to_right(page, ".card .card-meta", "attempt", "held by", "lease until")
    page.goto(f"/todos/{titled.id}")
    reads_left_to_right(page, ".attempt-head .muted", "claimed by", "via", "api")
    page.goto(f"/todos/bulk/discard?queue=inbox&q=x{RLO}")
    selection = ".confirm-page > p:not(.banner)"
    reads_left_to_right(page, selection, "board's selection", "matching", "Pending", "discarded")
