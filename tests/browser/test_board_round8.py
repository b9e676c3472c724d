"""The board on a phone: a section's labels ("window", "in flight", "dead letter", its condition,
the named limit holding its work) break only between words, while a long unbroken queue name
still breaks rather than widen the page."""

from __future__ import annotations

from playwright.sync_api import Page

from admission.limits.models import Pool
from queues import services
from tests.browser.conftest import PHONE, Session, screenshot
from tests.browser.helpers import LONG_QUEUE, budget
from tests.conftest import FIXTURE, Personas, push

# The words of the elements that break across lines: a Range over each word has a client rect
# per line it spans.
BROKEN_WORDS = """els => els.flatMap(el => {
  const broken = [];
  const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    for (const m of node.data.matchAll(/\\S+/g)) {
      const range = document.createRange();
      range.setStart(node, m.index);
      range.setEnd(node, m.index + m[0].length);
      const tops = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
      if (tops.size > 1) broken.push(m[0]);
    }
  }
  return broken;
})"""

LABELS = ".qhead dt, .qhead .badge, .holds strong, .card .chip"


def broken_words(page: Page, selector: str) -> list[str]:
    return page.eval_on_selector_all(selector, BROKEN_WORDS)


def test_on_a_phone_a_sections_labels_break_only_between_words(
    session: Session, tx_personas: Personas
) -> None:
    p = tx_personas
    budget(p, "inbox", max_in_flight=3, max_claims_per_window=5, tz="America/Los_Angeles")
    Pool.objects.create(name="gpu", slots=1)
    first, _ = push(p, 2, pool="gpu")
    services.claim(actor=p.as_agent(), todo_id=first.id, lease_ttl_seconds=600)
    long, _ = services.endpoint_vend(
        actor=FIXTURE, owner=p.owner, name="Long", queues=[LONG_QUEUE], rps=0
    )
    push(p, 1, queue=LONG_QUEUE, endpoint=long)
    page = session.page(p.owner, width=PHONE)
    page.goto("/")
    assert page.locator(".strip dt", has_text="window").count() >= 1
    assert page.locator(".holds strong", has_text="gpu").count() == 1
    assert broken_words(page, LABELS) == []
    # The long queue name still breaks (it is wider than the phone) rather than widen the page.
    assert broken_words(page, ".qtitle h2 a") == [LONG_QUEUE]
    assert page.evaluate(
        "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
    )
    screenshot(page, "board-round8-phone-labels")
