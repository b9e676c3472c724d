"""The live board on doorbell rings: with ``LIVE_BOARD_RINGS`` a ring (work became claimable)
refreshes the board at once, without waiting for the fleet poll; changes that ring nothing
(claims) still arrive by the poll."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from django.db import connection
from django.test import RequestFactory, override_settings

from queues import services
from queues.access import Viewer
from queues.doorbell import doorbell
from switchboard.console import live
from switchboard.console.board import Filters
from tests.conftest import Personas, push
from tests.web.conftest import in_thread

PENDING_THREE = "<div><dt>pending</dt><dd>3</dd></div>"
CLAIMED_ONE = "<div><dt>claimed</dt><dd>1</dd></div>"


def _html(raw: str) -> str:
    return "".join(
        json.loads(line[6:]).get("html", "")
        for line in raw.splitlines()
        if line.startswith("data: ")
    )


async def _until(source: AsyncIterator[str], text: str) -> None:
    while text not in _html(await asyncio.wait_for(anext(source), timeout=20)):
        pass


@override_settings(LIVE_BOARD_RINGS=True)
def test_a_ring_refreshes_the_board_at_once_and_the_poll_still_carries_claims(
    tx_personas: Personas, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tx_personas
    push(p, 2)
    request = RequestFactory().get("/live")
    request.user = p.owner
    viewer = Viewer.of(request)
    filters = Filters(endpoint="agent", queue="inbox")
    seen = live.fingerprint_now(viewer, filters)
    connection.close()
    # A poll far slower than the waits below: a create can reach the board only by its ring.
    monkeypatch.setattr(live, "INTERVAL", 3600.0)

    async def watch() -> None:
        source: AsyncIterator[str] = live.stream(request, viewer, filters, "/", seen, "token")
        assert (await anext(source)).startswith("retry:")
        stream = asyncio.ensure_future(_until(source, PENDING_THREE))
        await asyncio.wait_for(doorbell().listening.wait(), 20)
        await in_thread(lambda: push(p, 1))
        await stream
        await source.aclose()  # type: ignore[attr-defined]

    asyncio.run(watch())


@override_settings(LIVE_BOARD_RINGS=True)
def test_with_rings_a_claim_which_rings_nothing_still_reaches_the_board_by_the_poll(
    tx_personas: Personas,
) -> None:
    p = tx_personas
    push(p, 2)
    request = RequestFactory().get("/live")
    request.user = p.owner
    viewer = Viewer.of(request)
    filters = Filters(endpoint="agent", queue="inbox")
    seen = live.fingerprint_now(viewer, filters)
    connection.close()

    async def watch() -> None:
        source: AsyncIterator[str] = live.stream(request, viewer, filters, "/", seen, "token")
        assert (await anext(source)).startswith("retry:")
        stream = asyncio.ensure_future(_until(source, CLAIMED_ONE))
        await asyncio.wait_for(doorbell().listening.wait(), 20)
        await in_thread(lambda: services.claim_next(actor=p.as_agent()))
        await stream
        await source.aclose()  # type: ignore[attr-defined]

    asyncio.run(watch())
