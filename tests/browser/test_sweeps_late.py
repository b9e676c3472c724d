"""The board's word that the beat's sweeps stopped, as a laptop and a phone show it: read in full,
nothing sideways, axe finds nothing; and gone once they run again, live."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from queues import tasks
from queues.models import SweepRun
from tests.browser.conftest import WIDTHS, Session
from tests.browser.helpers import findings, sideways_overflow
from tests.conftest import Personas, push


@pytest.mark.parametrize("width", WIDTHS)
def test_the_board_says_the_sweeps_stopped_and_stops_saying_it_when_they_run(
    session: Session, tx_personas: Personas, width: int
) -> None:
    p = tx_personas
    push(p, 2)
    long_ago = timezone.now() - timedelta(minutes=10)
    SweepRun.objects.create(name="reap_expired", finished_at=long_ago)
    page = session.page(p.owner, width=width)
    page.goto("/")
    late = page.locator(".sweeps-late")
    expect(late).to_contain_text("The background sweeps have not run since")
    expect(late).to_contain_text("(reap_expired)")
    expect(late).to_contain_text("Is the Celery worker or beat running?")
    assert findings(page) == []
    assert sideways_overflow(page) == 0
    tasks.reap_expired()  # the worker is back: the live board drops the word by itself
    expect(late).to_have_count(0, timeout=15_000)
