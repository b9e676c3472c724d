"""The live board: the fingerprint, the events a change produces, and the stream itself."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from html import unescape
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlsplit

from django.db import connection
from django.test import Client, RequestFactory

from admission.limits import services as limit_services
from queues import pauses, services
from queues.access import Viewer
from switchboard.console import live
from switchboard.console.board import Filters
from switchboard.core.users import still_signed_in
from tests.conftest import FIXTURE, Personas, database_down, push
from tests.web.conftest import budget, in_thread, signed_in
from tests.web.test_failure_pages import BAD_FILTERS


def _viewer(user: Any) -> tuple[Any, Viewer]:
    request = RequestFactory().get("/live")
    request.user = user
    return request, Viewer.of(request)


def test_the_fingerprint_moves_with_what_the_viewer_sees_and_only_that(personas: Personas) -> None:
    p = personas
    _, owner = _viewer(p.owner)
    _, auditor = _viewer(p.auditor)
    everything = Filters()
    before_owner = live.fingerprint_now(owner, everything)
    before_auditor = live.fingerprint_now(auditor, everything)
    push(p, 1, endpoint=p.foreign)
    assert live.fingerprint_now(owner, everything) == before_owner
    assert live.fingerprint_now(auditor, everything) != before_auditor
    (todo,) = push(p, 1)
    after_push = live.fingerprint_now(owner, everything)
    assert after_push != before_owner
    services.claim(actor=p.as_human(), todo_id=todo.id)
    after_claim = live.fingerprint_now(owner, everything)
    assert after_claim != after_push
    outbox_only = Filters(queue="outbox")
    quiet = live.fingerprint_now(owner, outbox_only)
    services.complete(actor=p.as_human(), todo_id=todo.id)
    assert live.fingerprint_now(owner, outbox_only) == quiet
    assert live.fingerprint_now(owner, everything) != after_claim
    before_budget = live.fingerprint_now(owner, everything)
    budget(p, max_in_flight=1)
    assert live.fingerprint_now(owner, everything) != before_budget
    before_pause = live.fingerprint_now(owner, everything)
    pauses.queue_pause(actor=p.as_human(p.admin), queue="inbox", reason="x")
    assert live.fingerprint_now(owner, everything) != before_pause


def test_a_hold_freed_by_a_claim_on_a_queue_the_board_does_not_show_moves_it(
    personas: Personas,
) -> None:
    # Pool gpu's one slot is held by a claim on outbox; inbox's card waits for it. The board
    # filtered to inbox went on saying "pool full" after the outbox claim ended: its fingerprint
    # hashed inbox's todos only.
    p = personas
    _, owner = _viewer(p.owner)
    inbox = Filters(queue="inbox")
    limit_services.limit_set(actor=FIXTURE, kind="pool", name="gpu", slots=1)
    (holder,) = push(p, 1, queue="outbox", pool="gpu")
    push(p, 1, queue="inbox", pool="gpu")
    services.claim(actor=p.as_human(), todo_id=holder.id)
    held = live.fingerprint_now(owner, inbox)
    assert live.fingerprint_now(owner, inbox) == held  # nothing moved, nothing sent
    services.complete(actor=p.as_human(), todo_id=holder.id)
    freed = live.fingerprint_now(owner, inbox)
    assert freed != held
    limit_services.limit_set(actor=FIXTURE, kind="pool", name="gpu", slots=2)
    assert live.fingerprint_now(owner, inbox) != freed  # a limit changed


def test_a_rate_limits_holds_move_the_board_at_each_minute_and_only_while_one_is_declared(
    personas: Personas, monkeypatch: Any
) -> None:
    # A rate limit's holds end at the next minute with no row changing: the board must redraw
    # then ("eligible ≈ 14:05" becomes claimable), and must not every minute when none exists.
    p = personas
    _, owner = _viewer(p.owner)
    everything = Filters()
    clock = {"now": datetime(2026, 12, 5, 14, 4, 10, tzinfo=UTC)}
    monkeypatch.setattr(live, "timezone", SimpleNamespace(now=lambda: clock["now"]))
    push(p, 1, queue="inbox")

    def a_minute_on(seconds: int) -> str:
        clock["now"] += timedelta(seconds=seconds)
        return live.fingerprint_now(owner, everything)

    quiet = a_minute_on(0)
    assert a_minute_on(60) == quiet  # no rate limit: the minute is not hashed
    limit_services.limit_set(actor=FIXTURE, kind="rate", name="api", base_limit=5)
    declared = a_minute_on(0)
    assert declared != quiet
    assert a_minute_on(30) == declared  # 14:05:40, the same minute
    next_minute = a_minute_on(30)  # 14:06:10
    assert next_minute != declared
    assert live.read_fleet().rate_minute == "2026-12-05T14:06:00+00:00"
    limit_services.limit_delete(actor=FIXTURE, kind="rate", name="api")
    gone = a_minute_on(0)
    assert a_minute_on(60) == gone


def test_a_change_sends_only_the_parts_that_changed(personas: Personas) -> None:
    p = personas
    push(p, 2)
    request, viewer = _viewer(p.owner)
    filters = Filters()
    before = live.render_board(request, viewer, filters, "/", "token")
    first = live.changes(None, before)
    assert [data["target"] for _, data in first] == ["sections", "fleet-summary"]
    push(p, 1)
    after = live.render_board(request, viewer, filters, "/", "token")
    events = live.changes(before, after)
    assert {data["target"] for _, data in events} == {"head-agent--inbox", "cards-agent--inbox"}
    assert live.changes(after, live.render_board(request, viewer, filters, "/", "token")) == []


def test_a_queue_in_trouble_moves_to_the_top_and_its_new_condition_is_announced(
    personas: Personas,
) -> None:
    p = personas
    push(p, 2)
    request, viewer = _viewer(p.owner)
    filters = Filters()
    before = live.render_board(request, viewer, filters, "/", "token")
    pauses.queue_pause(actor=p.as_human(p.admin), queue="outbox", reason="maint")
    after = live.render_board(request, viewer, filters, "/", "token")
    assert after.keys[0] == "agent--outbox" != before.keys[0]
    events = live.changes(before, after)
    targets = [data["target"] for name, data in events if name == "swap"]
    assert targets == ["sections", "fleet-summary"]
    announced = [data["text"] for name, data in events if name == "announce"]
    assert announced == ["agent / outbox: Paused"]


def _fresh_identity(p: Personas) -> None:
    """A queue identity the board has not shown: an endpoint of the owner's on a new queue (a
    budget on a queue outside an endpoint's scope, which made one before, is refused now)."""
    services.endpoint_vend(actor=FIXTURE, owner=p.owner, name="Fresh", queues=["brand-new"])


def test_a_new_queue_identity_resends_the_whole_list(personas: Personas) -> None:
    p = personas
    request, viewer = _viewer(p.owner)
    before = live.render_board(request, viewer, Filters(), "/", "token")
    _fresh_identity(p)
    after = live.render_board(request, viewer, Filters(), "/", "token")
    event, summary = live.changes(before, after)
    assert event[1]["target"] == "sections" and "head-fresh--brand-new" in event[1]["html"]
    assert summary[1]["target"] == "fleet-summary" and "<strong>5</strong>" in summary[1]["html"]


def test_every_list_names_the_stream_of_the_filters_it_shows(personas: Personas) -> None:
    """The filter form swaps only the list (htmx), so the list itself tells static/js/live.js
    which stream to follow: the page's, the htmx fragment's and the stream's own renders."""
    p = personas
    push(p, 2)
    client = signed_in(p.owner)
    searched = Filters(q="todo 1")
    at = live.fingerprint_now(Viewer.of(_viewer(p.owner)[0]), searched)

    def follows(html: str) -> dict[str, list[str]]:
        (address,) = re.findall(r'id="sections"[^>]* data-live-follow="([^"]+)"', html)
        parsed = urlsplit(unescape(address))
        assert parsed.path == "/live"
        return parse_qs(parsed.query)

    page = client.get("/").content.decode()
    assert "q" not in follows(page) and follows(page)["here"] == ["/"]
    fragment = client.get("/?q=todo+1", headers={"HX-Request": "true", "HX-Target": "sections"})
    assert fragment.status_code == 200
    assert follows(fragment.content.decode()) == {
        "state": ["live"],
        "q": ["todo 1"],
        "here": ["/?q=todo+1"],
        "at": [at],
    }
    request, viewer = _viewer(p.owner)
    rendered = live.render_board(request, viewer, searched, "/?q=todo+1", "token", at="f00")
    assert follows(rendered.list_html)["at"] == ["f00"]
    assert follows(rendered.list_html)["q"] == ["todo 1"]


def test_the_stream_is_for_signed_in_viewers(tx_personas: Personas) -> None:
    assert Client().get("/live").status_code == 204
    response = signed_in(tx_personas.owner).get("/live?queue=inbox&here=/")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    assert response["Cache-Control"] == "no-cache, no-transform"


def test_the_stream_refuses_filters_the_board_refuses(tx_personas: Personas) -> None:
    client = signed_in(tx_personas.owner)
    for name, value, words in BAD_FILTERS:
        response = client.get("/live", {name: value, "here": "/"})
        assert response.status_code == 400, name
        assert words in response.content.decode(), name


def _events(raw: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in raw.split("\n\n"):
        lines = dict(
            line.split(": ", 1) for line in block.splitlines() if ": " in line and line[0] != ":"
        )
        if "event" in lines:
            out.append((lines["event"], json.loads(lines["data"])))
    return out


CLAIMED_ONE = "<div><dt>claimed</dt><dd>1</dd></div>"


def _run_in_thread(fn: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        try:
            return fn()
        finally:
            connection.close()

    return run


def test_a_stream_asks_whether_its_session_still_signs_in_its_viewer(personas: Personas) -> None:
    # Each open board asks every SESSION_CHECK_SECONDS; any of these ends it.
    p = personas
    client = signed_in(p.owner)
    key = client.session.session_key
    assert still_signed_in(key, p.owner.pk)
    assert not still_signed_in(key, p.auditor.pk)  # someone else's session key
    assert not still_signed_in(None, p.owner.pk)
    p.owner.set_password("changed-elsewhere-1")  # Django signs every other session out
    p.owner.save()
    assert not still_signed_in(key, p.owner.pk)
    client = signed_in(p.owner)
    key = client.session.session_key
    p.owner.is_active = False  # the account deactivated
    p.owner.save()
    assert not still_signed_in(key, p.owner.pk)
    p.owner.is_active = True
    p.owner.save()
    assert still_signed_in(key, p.owner.pk)
    client.logout()  # signed out (in another tab)
    assert not still_signed_in(key, p.owner.pk)


def test_the_stream_pushes_a_change_made_elsewhere(tx_personas: Personas) -> None:
    """A claim committed by another connection reaches the open stream as a header swap."""
    p = tx_personas
    push(p, 2)
    request, viewer = _viewer(p.owner)
    filters = Filters(endpoint="agent", queue="inbox")
    seen = live.fingerprint_now(viewer, filters)
    connection.close()  # the stream and the change use connections of their own

    async def watch() -> list[tuple[str, dict[str, Any]]]:
        events: list[tuple[str, dict[str, Any]]] = []
        source: AsyncIterator[str] = live.stream(request, viewer, filters, "/", seen, "token")
        loop = asyncio.get_running_loop()
        first = await anext(source)
        assert first.startswith("retry:")
        claim = _run_in_thread(lambda: services.claim_next(actor=p.as_agent()))
        await loop.run_in_executor(None, claim)
        while not any(CLAIMED_ONE in e[1].get("html", "") for e in events):
            events += _events(await asyncio.wait_for(anext(source), timeout=10))
        pause = _run_in_thread(
            lambda: pauses.queue_pause(actor=p.as_human(p.admin), queue="inbox", reason="r")
        )
        await loop.run_in_executor(None, pause)
        while not any(e[0] == "announce" for e in events):
            events += _events(await asyncio.wait_for(anext(source), timeout=10))
        await source.aclose()  # type: ignore[attr-defined]
        return events

    events = asyncio.run(watch())
    assert ("announce", {"text": "agent / inbox: Paused"}) in events


def test_a_database_that_stops_answering_ends_the_stream_as_a_stream_ends(
    tx_personas: Personas, monkeypatch: Any
) -> None:
    """chaos10: PostgreSQL stopped under an open board was an unhandled exception of the
    server's and a chunked read the browser saw fail half-way."""
    p = tx_personas
    push(p, 1)
    request, viewer = _viewer(p.owner)
    filters = Filters()
    connection.close()
    # The stream's own logger, read directly: a test before this one may have configured
    # logging so that caplog sees nothing of it (a Celery worker's setup).
    said: list[str] = []
    monkeypatch.setattr(live.log, "warning", lambda msg, *args: said.append(msg % args))

    async def watch() -> list[str]:
        source: AsyncIterator[str] = live.stream(request, viewer, filters, "/", "", "token")
        return [chunk async for chunk in source]

    with database_down():
        sent = asyncio.run(asyncio.wait_for(watch(), timeout=60))
    assert len(sent) == 1 and sent[0].startswith("retry:")  # then the end, not an exception
    (ended,) = said
    assert "database did not answer" in ended


def _agent_inbox_stream(
    p: Personas, monkeypatch: Any, *, at_render: int, change: Callable[[], Any]
) -> tuple[Any, Viewer, Filters, str, list[int]]:
    """The owner's stream of the agent's inbox as its page was rendered (request, viewer,
    filters, ``seen``), with ``change`` committed by the render thread just before the
    ``at_render``-th render (0: the baseline) reads the database. Returns the renders so far."""
    request, viewer = _viewer(p.owner)
    filters = Filters(endpoint="agent", queue="inbox")
    seen = live.fingerprint_now(viewer, filters)
    connection.close()
    render = live.render_board
    renders: list[int] = []

    def render_after_a_change(*args: Any, **kwargs: Any) -> live.Rendered:
        if len(renders) == at_render:
            change()
        renders.append(1)
        return render(*args, **kwargs)

    monkeypatch.setattr(live, "render_board", render_after_a_change)
    return request, viewer, filters, seen, renders


async def _opened(request: Any, viewer: Viewer, filters: Filters, seen: str) -> AsyncIterator[str]:
    """The stream of a page that shows the board at ``seen``, past its ``retry:`` line."""
    source: AsyncIterator[str] = live.stream(request, viewer, filters, "/", seen, "token")
    assert (await anext(source)).startswith("retry:")
    return source


def test_a_change_committed_while_the_stream_renders_its_baseline_is_sent(
    tx_personas: Personas, monkeypatch: Any
) -> None:
    """The page shows the board at ``seen``; the stream reads the fleet (still ``seen``), then
    renders its baseline after another connection has added a todo. The page lacks that todo
    and no later difference from the baseline would bring it: the whole board must go now."""
    p = tx_personas
    push(p, 2)
    # The baseline: a todo arrives between the stream's read and its render.
    request, viewer, filters, seen, _ = _agent_inbox_stream(
        p, monkeypatch, at_render=0, change=lambda: push(p, 1)
    )

    async def first_events() -> list[tuple[str, dict[str, Any]]]:
        source = await _opened(request, viewer, filters, seen)
        events = _events(await asyncio.wait_for(anext(source), timeout=10))
        await source.aclose()  # type: ignore[attr-defined]
        return events

    ((name, data),) = asyncio.run(first_events())[:1]
    assert (name, data["target"]) == ("swap", "sections")
    assert data["html"].count('<li class="card ') == 3


def _pause_inbox(p: Personas) -> None:
    pauses.queue_pause(actor=p.as_human(p.admin), queue="inbox", reason="upgrading")


async def _head_of_inbox(source: AsyncIterator[str], *, paused: bool) -> str:
    """The first html the stream sends for the agent's inbox head (a part, or the whole list)
    that says the queue is paused, or (``paused`` false) that does not."""
    while True:
        for name, data in _events(await asyncio.wait_for(anext(source), timeout=10)):
            if name == "swap" and data["target"] in ("head-agent--inbox", "sections"):
                html = str(data["html"])
                if ('data-tone="paused"' in html) == paused:
                    return html


def test_a_change_the_baseline_showed_and_then_undone_is_sent_undone(
    tx_personas: Personas, monkeypatch: Any
) -> None:
    """CI on e83eca4 (tests/browser/test_pause_with_htmx.py, a pause and a resume made
    elsewhere). A pause committed while the stream rendered its baseline went to the page, sent
    under the fingerprint read before the render, which the stream kept. The resume brought the
    fleet back to that fingerprint, so the loop saw nothing to send and the page said "Paused"
    until some other change."""
    p = tx_personas
    push(p, 1)
    # The baseline: the pause commits between the stream's read and its render.
    request, viewer, filters, seen, _ = _agent_inbox_stream(
        p, monkeypatch, at_render=0, change=lambda: _pause_inbox(p)
    )

    async def heads() -> tuple[str, str]:
        source = await _opened(request, viewer, filters, seen)
        paused = await _head_of_inbox(source, paused=True)
        await in_thread(lambda: pauses.queue_resume(actor=p.as_human(p.admin), queue="inbox"))
        resumed = await _head_of_inbox(source, paused=False)
        await source.aclose()  # type: ignore[attr-defined]
        return paused, resumed

    paused, resumed = asyncio.run(heads())
    assert "<strong>Paused</strong>" in paused
    assert "<strong>Paused</strong>" not in resumed and 'data-tone="paused"' not in resumed


def test_a_change_a_render_showed_and_then_undone_is_sent_undone(
    tx_personas: Personas, monkeypatch: Any
) -> None:
    """The same in the stream's loop: a todo arrives (the snapshot moves), the pause commits
    while that is rendered, and is lifted before the next snapshot, which then has the very
    fingerprint the render was made for."""
    p = tx_personas
    push(p, 1)
    # The loop's first render, for the todo pushed below.
    request, viewer, filters, seen, renders = _agent_inbox_stream(
        p, monkeypatch, at_render=1, change=lambda: _pause_inbox(p)
    )

    async def heads() -> tuple[str, str]:
        source = await _opened(request, viewer, filters, seen)
        first = asyncio.ensure_future(_head_of_inbox(source, paused=True))  # drives the stream
        while not renders:  # the baseline is rendered (nothing moved: nothing is sent)
            await asyncio.sleep(0.01)
        await in_thread(lambda: push(p, 1))
        paused = await first
        await in_thread(lambda: pauses.queue_resume(actor=p.as_human(p.admin), queue="inbox"))
        resumed = await _head_of_inbox(source, paused=False)
        await source.aclose()  # type: ignore[attr-defined]
        return paused, resumed

    paused, resumed = asyncio.run(heads())
    assert "<strong>Paused</strong>" in paused
    assert "<strong>Paused</strong>" not in resumed and 'data-tone="paused"' not in resumed


def test_a_change_within_sections_renders_only_their_parts(personas: Personas) -> None:
    p = personas
    request, viewer = _viewer(p.owner)
    before = live.render_board(request, viewer, Filters(), "/", "token")
    push(p, 1)
    after = live.render_board(request, viewer, Filters(), "/", "token", before)
    assert after.list_html == "" and after.parts != before.parts
    _fresh_identity(p)
    grown = live.render_board(request, viewer, Filters(), "/", "token", after)
    assert "head-fresh--brand-new" in grown.list_html
