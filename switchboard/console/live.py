"""Live board over server-sent events: the header counts and cards follow every change.

Why polling a fingerprint, not LISTEN: most changes (claims, heartbeats, completions, sweeps,
changes made by another process through the API, MCP or the CLI) send no notification, and the
claim hot path must not grow one. So each web process reads a cheap **fleet snapshot** at most
every ``HUB_MAX_AGE`` seconds, shared by all of its viewers (``Hub``):

- per queue identity, the count and latest ``updated_at`` of its *live* todos (pending, claimed,
  failed awaiting a retry; every transition enters or leaves that set or bumps ``updated_at``),
- every pause row, every policy's ``updated_at`` and the latest change of its window counters,
  and the current window of each windowed policy (so a window rolling over is seen with no write),
- every endpoint's owner, state and scope.

Each stream (one per open board) hashes the part of the snapshot its viewer may see, narrowed by
the board's filters, every ``INTERVAL`` seconds. When the hash changes it re-renders the visible
sections with the same partials the page uses (``queues/_section.html``) and sends only the parts
whose HTML changed, as ``swap`` events (``{"target": id, "html": ...}``), plus an ``announce``
event when a section's condition changes (exhausted, paused, unavailable, admitted), which
static/js/live.js puts in the page's ``aria-live="polite"`` region. A change in which sections
exist sends the whole list once. The render reads the database after the snapshot it answers, so
it may show a later change; a snapshot begun after the render (shared, like the others) says
whether it still matches, and if not the next snapshot renders again whatever its hash: else a
change undone in between (a pause, then its resume) left the page showing it. Worst case from a commit to the browser: ``HUB_MAX_AGE`` +
``INTERVAL`` + a render, about a second.

Rings too (issue 14, item 2): with ``LIVE_BOARD_RINGS`` each stream also watches this process's
doorbell (``queues.doorbell``) and refreshes at once after a ``todo_ready`` ring (creates,
releases, reaps, requeues, reopens, resumes), at most one snapshot per ``RING_MIN_GAP``; the poll
stays, because claims, heartbeats and completions ring nothing. Off by default: measured side by
side (``python -m bench --only boardlive``, 10 boards, load 4-7), create to board p50 493 ms by the
poll and 336 ms with rings (spread 147-525 ms: the render of ten boards dominates), idle cost the
same (1.8 % of a core, ~13 transactions/s), but under a create every 0.1 s the server spent 77 %
of a core against 61 % and the database 157 transactions/s against 106: each ring is a snapshot
and a render per board that the poll batches. The gain is for the changes that ring only, the
cost grows with ring rate, so the poll alone stays the default.

A page's filters can change with no page load: the filter form swaps ``#sections`` by htmx and
pushes the address, and back restores another address. So the list carries the stream URL of the
filters it was rendered for (``data-live-follow``; the stream's own renders carry it too), and
live.js moves the subscription whenever a swap brings other filters. Otherwise a stream keeps
sending parts rendered for filters the page no longer shows: a search's one card buried under the
whole identity's cards at the next change to that queue. Until it has moved (it does once htmx's
swap settles), a part from a stream whose filters are not the shown list's is dropped. A new list
that arrives while a request that replaces the list is on its way (the filter form, a pause, a
resume) is held until that request ends. Swapped in meanwhile, htmx would put its answer into a
list no longer on the page: a search would show the unfiltered cards under its own address, a
pause would not show. It is shown if the request failed; if the request replaced the list it is
dropped, and the stream is subscribed again from the new list's fingerprint.

A stream ends after ``STREAM_SECONDS``; EventSource reconnects (``retry``) with ``Last-Event-ID``,
the fingerprint it last saw, so nothing is resent needlessly and a revoked session is noticed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import urlencode

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.middleware.csrf import get_token
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from admission import windows
from queues import selectors, sql
from queues.access import Viewer
from queues.doorbell import doorbell
from switchboard.console import board
from switchboard.console.board import Filters, Section
from switchboard.core.availability import is_outage, outage
from switchboard.core.errors import InvalidArgument
from switchboard.core.users import still_signed_in

T = TypeVar("T")
log = logging.getLogger(__name__)
# Measured by `make bench` (bench/console_bench.py): commit to browser under a second at p50.
# 0.3 s each (was 0.5 and 0.4): a change is noticed 0.3 s sooner on average, for a fleet
# snapshot (four grouped reads) at most every 0.3 s per web process while a board is open.
INTERVAL = 0.3
HUB_MAX_AGE = 0.3
# With LIVE_BOARD_RINGS, a ring (work became claimable) refreshes the snapshot at once, but a
# burst of rings costs at most one snapshot per RING_MIN_GAP per process.
RING_MIN_GAP = 0.05
STREAM_SECONDS = 300
RETRY_MS = 2000
KEEPALIVE_SECONDS = 15
# How often a stream asks whether its viewer is still signed in (a sign-out in another tab, the
# session's expiry, the account's deactivation): one small read per open board.
SESSION_CHECK_SECONDS = 15
PARTS = ("head", "controls", "cards")


# --- the fleet snapshot -------------------------------------------------------------------------


@dataclass(frozen=True)
class Fleet:
    todos: dict[tuple[str, str], tuple[Any, ...]]
    pauses: tuple[tuple[str, str], ...]
    policies: dict[tuple[str, str], tuple[Any, ...]]
    endpoints: dict[str, tuple[Any, ...]]  # id -> (slug, owner_id, state, scope)
    # The named limits (kind, name, last change, claims holding it): every board's, as a limit
    # is shared across queues.
    limits: tuple[tuple[Any, ...], ...] = ()
    # The minute, while any rate limit is declared: its holds end at the next one.
    rate_minute: str | None = None
    # The beat's sweeps that stopped running (``selectors.late_sweeps``): the board says so.
    late_sweeps: tuple[str, ...] = ()


_POLICIES_SQL = """
SELECT p.id::text, p.endpoint_id::text, p.queue, p.updated_at, p.window_period, p.window_tz,
       p.window_start, p.window_weekday,
       (SELECT max(w.updated_at) FROM admission_admissionwindow w
        WHERE w.policy_id = p.id AND w.window_start > now() - interval '8 days')
FROM admission_admissionpolicy p
"""


def read_fleet() -> Fleet:
    """The snapshot every stream of this process hashes (six small queries)."""
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(sql.LIVE_TODOS_SQL)
        todos: dict[tuple[str, str], tuple[Any, ...]] = {}
        for endpoint_id, queue, state, count, latest in cursor.fetchall():
            key = (endpoint_id, queue)
            todos[key] = (*todos.get(key, ()), state, count, latest.isoformat())
        cursor.execute("SELECT queue, paused_at FROM queues_queuepause ORDER BY queue")
        pauses = tuple((q, at.isoformat()) for q, at in cursor.fetchall())
        cursor.execute(_POLICIES_SQL)
        policies = {}
        for (
            pid,
            endpoint_id,
            queue,
            updated,
            period,
            tz,
            start,
            weekday,
            counted,
        ) in cursor.fetchall():
            spec = windows.Window(period, tz, start, weekday)
            try:
                current = windows.window_start(spec, now).isoformat() if period else None
            except windows.WindowUnavailable:
                current = "unavailable"
            policies[(endpoint_id, queue)] = (
                pid,
                updated.isoformat(),
                current,
                counted.isoformat() if counted else None,
            )
        cursor.execute("SELECT id::text, slug, owner_id, state, scope_queues FROM queues_endpoint")
        endpoints = {row[0]: (row[1], row[2], row[3], tuple(row[4])) for row in cursor.fetchall()}
        cursor.execute(sql.LIVE_LIMITS_SQL)
        limits: tuple[tuple[Any, ...], ...] = tuple(
            (kind, name, changed.isoformat(), held) for kind, name, changed, held in cursor
        )
    minute = None
    if any(kind == "rate" for kind, *_ in limits):
        minute = now.replace(second=0, microsecond=0).isoformat()
    return Fleet(
        todos=todos,
        pauses=pauses,
        policies=policies,
        endpoints=endpoints,
        limits=limits,
        rate_minute=minute,
        late_sweeps=tuple(late.name for late in selectors.late_sweeps(now)),
    )


def _closing(fn: Callable[..., T]) -> Callable[..., T]:
    """Run ``fn`` and close the thread's database connection after it.

    The hub and the streams run their reads on executor threads of their own (never the
    request's thread-sensitive one, which a stream outlives); each call closes what it opened,
    so no connection is left behind per thread.
    """

    def run(*args: Any) -> T:
        try:
            return fn(*args)
        finally:
            connection.close()

    return run


class Hub:
    """One fleet snapshot per process, refreshed at most every ``max_age`` seconds, read on a
    thread of its own whatever the number of viewers."""

    def __init__(self, max_age: float = HUB_MAX_AGE) -> None:
        self.max_age = max_age
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="live-hub")
        self._snapshot: Fleet | None = None
        self._at = 0.0
        self.reads = 0  # snapshots read (the bench's queries-per-second figure)
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def snapshot(
        self, *, rung_at: float | None = None, read_after: float | None = None
    ) -> Fleet:
        """The shared snapshot; ``rung_at`` (a ring's arrival): one read after that instant, at
        most one per ``RING_MIN_GAP``; ``read_after``: one read begun after that instant."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._lock is None:
            self._loop, self._lock = loop, asyncio.Lock()
        async with self._lock:
            age = time.monotonic() - self._at
            stale = (
                age >= self.max_age
                or (rung_at is not None and self._at < rung_at and age >= RING_MIN_GAP)
                or (read_after is not None and self._at <= read_after)
            )
            if self._snapshot is None or stale:
                self._at = time.monotonic()
                self._snapshot = await loop.run_in_executor(self._executor, _closing(read_fleet))
                self.reads += 1
            return self._snapshot


hub = Hub()


def fingerprint(fleet: Fleet, viewer: Viewer, filters: Filters) -> str:
    """A short hash of what this viewer's board shows, from the fleet snapshot."""
    user_pk = getattr(viewer.user, "pk", None)
    visible = {
        endpoint_id: row
        for endpoint_id, row in fleet.endpoints.items()
        if (viewer.sees_all or row[1] == user_pk)
        and (not filters.endpoint or row[0] == filters.endpoint)
    }

    def wanted(key: tuple[str, str]) -> bool:
        return key[0] in visible and (not filters.queue or key[1] == filters.queue)

    parts = [
        sorted(visible.items()),
        sorted((k, v) for k, v in fleet.todos.items() if wanted(k)),
        sorted((k, v) for k, v in fleet.policies.items() if wanted(k)),
        fleet.pauses,
        fleet.limits,
        fleet.rate_minute,
        fleet.late_sweeps,
    ]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:20]


def fingerprint_now(viewer: Viewer, filters: Filters) -> str:
    return fingerprint(read_fleet(), viewer, filters)


def live_url(viewer: Viewer, filters: Filters, here: str, at: str | None = None) -> str:
    """The stream URL a page subscribes to: its filters, the page it renders for, and the
    fingerprint the page was rendered at (read now unless ``at`` gives it)."""
    params = {
        "endpoint": filters.endpoint,
        "queue": filters.queue,
        "state": filters.state,
        "condition": filters.condition,
        "q": filters.q,
        "here": here,
        "at": fingerprint_now(viewer, filters) if at is None else at,
    }
    return reverse("live") + "?" + urlencode({k: v for k, v in params.items() if v})


# --- rendering ----------------------------------------------------------------------------------


@dataclass
class Rendered:
    keys: list[str]
    folded: list[bool]  # which sections show as one line (a change re-sends the list)
    parts: dict[str, str]  # "<part>-<key>" -> html
    tones: dict[str, str]
    announce: dict[str, str]
    list_html: str


def render_board(
    request: HttpRequest,
    viewer: Viewer,
    filters: Filters,
    here: str,
    csrf_token: str,
    previous: Rendered | None = None,
    *,
    at: str = "",
) -> Rendered:
    """The visible sections, rendered part by part with the page's own partials. The whole
    list is rendered too unless ``previous`` shows the same sections the same way (then only
    parts can have changed, and rendering the list would double the work of a large board).
    ``at``: the fingerprint rendered, for the list's own stream URL."""
    view = board.board_view(viewer, filters)
    found: list[Section] = view.sections
    base = {
        "viewer": viewer,
        "filters": filters,
        "here": here,
        "csrf_token": csrf_token,
        "live_url": live_url(viewer, filters, here, at),
    }
    parts: dict[str, str] = {
        "fleet-summary": render_to_string(
            "queues/_section.html#summary", {**base, "view": view}, request=request
        )
    }
    for s in found:
        for part in ("line",) if s.collapsed else PARTS:
            parts[f"{part}-{s.key}"] = render_to_string(
                f"queues/_section.html#{part}", {**base, "s": s}, request=request
            )
    keys, folded = [s.key for s in found], [s.collapsed for s in found]
    list_html = ""
    if previous is None or previous.keys != keys or previous.folded != folded:
        list_html = render_to_string(
            "queues/_section.html#list", {**base, "sections": found, "view": view}, request=request
        )
    return Rendered(
        keys=keys,
        folded=folded,
        parts=parts,
        tones={s.key: s.tone for s in found},
        announce={s.key: s.announce for s in found},
        list_html=list_html,
    )


def _event(name: str, data: dict[str, Any], event_id: str | None = None) -> str:
    lines = [f"event: {name}"]
    if event_id:
        lines.append(f"id: {event_id}")
    lines.append("data: " + json.dumps(data))
    return "\n".join(lines) + "\n\n"


def changes(before: Rendered | None, after: Rendered) -> list[tuple[str, dict[str, Any]]]:
    """The events that bring a page showing ``before`` to ``after``."""
    if before is None or before.keys != after.keys or before.folded != after.folded:
        events: list[tuple[str, dict[str, Any]]] = [
            ("swap", {"target": "sections", "html": after.list_html}),
            ("swap", {"target": "fleet-summary", "html": after.parts["fleet-summary"]}),
        ]
    else:
        events = [
            ("swap", {"target": target, "html": html})
            for target, html in after.parts.items()
            if before.parts.get(target) != html
        ]
    if before is not None:
        for key in after.keys:
            if key in before.tones and before.tones[key] != after.tones[key]:
                events.append(("announce", {"text": after.announce[key]}))
    return events


# --- the stream ---------------------------------------------------------------------------------


def _here(request: HttpRequest, filters: Filters) -> str:
    here = request.GET.get("here", "")
    if here.startswith("/") and not here.startswith("//"):
        return here
    return reverse("board") + (f"?{filters.query()}" if filters.query() else "")


def _viewer(request: HttpRequest) -> tuple[Viewer, str] | None:
    """Who is watching (None when signed out), and the CSRF token their forms carry."""
    if not request.user.is_authenticated:
        return None
    return Viewer.of(request), get_token(request)


@require_GET
async def live_view(request: HttpRequest) -> HttpResponseBase:
    """``GET /live``: the board's event stream (text/event-stream).

    Every database read runs off the event loop on a thread of the stream's own (never the
    request's thread-sensitive one, which a stream outlives), closing its connection after.
    """
    found = await _off_loop(_viewer, request)
    if found is None:
        # 204 tells EventSource to stop reconnecting; the page itself asks to sign in.
        return HttpResponse(status=204)
    viewer, csrf_token = found
    try:
        filters = Filters.from_query(request.GET)
    except InvalidArgument as exc:  # the board refused the same filters (EventSource stops)
        return HttpResponse(exc.message, status=400, content_type="text/plain; charset=utf-8")
    here = _here(request, filters)
    seen = request.headers.get("Last-Event-ID") or request.GET.get("at", "")
    response = StreamingHttpResponse(
        stream(request, viewer, filters, here, seen, csrf_token),
        content_type="text/event-stream",
    )
    response["Cache-Control"] = "no-cache, no-transform"
    response["X-Accel-Buffering"] = "no"
    return response


_renderers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="live-render")


async def _off_loop(fn: Callable[..., T], *args: Any) -> T:
    """Run a read on a render thread with that thread's own connection, closed after."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_renderers, functools.partial(_closing(fn), *args))


async def _snapshots(deadline: float, rings: asyncio.Event | None) -> AsyncIterator[Fleet]:
    """The fleet snapshot every ``INTERVAL`` (claims, heartbeats and completions send no ring),
    and with ``rings`` also at once after a ring (work became claimable somewhere)."""
    while time.monotonic() < deadline:
        rung_at = None
        if rings is None:
            await asyncio.sleep(INTERVAL)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(rings.wait(), INTERVAL)
            if rings.is_set():
                rung_at = time.monotonic()
                rings.clear()
        yield await hub.snapshot(rung_at=rung_at)


async def stream(
    request: HttpRequest,
    viewer: Viewer,
    filters: Filters,
    here: str,
    seen: str,
    csrf_token: str,
) -> AsyncIterator[str]:
    """The board's events; a dependency that stops answering (PostgreSQL down) ends the stream
    as a stream ends, in one log line: the page's reconnect meets the outage's 503 and retries
    until it passes (static/js/live.js). It was an unhandled exception of the server's, and the
    browser's read failed half-way (chaos10)."""
    try:
        async with contextlib.aclosing(
            _stream(request, viewer, filters, here, seen, csrf_token)
        ) as events:
            async for event in events:
                yield event
    except Exception as exc:
        if not is_outage(exc):
            raise
        log.warning("the live board's stream ended: %s", outage(exc).message)


async def _stream(
    request: HttpRequest,
    viewer: Viewer,
    filters: Filters,
    here: str,
    seen: str,
    csrf_token: str,
) -> AsyncGenerator[str, None]:
    yield f"retry: {RETRY_MS}\n\n"
    # The page was rendered at fingerprint ``seen``: render now as the baseline, and send it only
    # if the board moved between the page load and this connection, or during this render: a
    # change committed between the read and the render is in ``shown`` but not on the page, and
    # no later difference from ``shown`` would send it. Sent under the fingerprint read before
    # the render. What ``shown`` shows is then known only if the fleet read after the render
    # still has that fingerprint; if not, ``last_fp`` is unknown (""), and the loop renders at
    # its first snapshot. Taken as the one read before the render, a change undone before that
    # snapshot (a pause and its resume) matched it, and the page kept the change (CI on e83eca4).
    fleet = await _off_loop(read_fleet)
    last_fp = fingerprint(fleet, viewer, filters)
    shown = await _off_loop(
        functools.partial(render_board, at=last_fp), request, viewer, filters, here, csrf_token
    )
    held = fingerprint(await _off_loop(read_fleet), viewer, filters) == last_fp
    if last_fp != seen or not held:
        for name, data in changes(None, shown):
            yield _event(name, data, last_fp)
    if not held:
        last_fp = ""
    deadline = time.monotonic() + STREAM_SECONDS
    quiet_since = checked_at = time.monotonic()
    session_key = getattr(getattr(request, "session", None), "session_key", None)
    user_id = request.user.pk
    rings = doorbell().watch() if settings.LIVE_BOARD_RINGS else None
    try:
        async for fleet in _snapshots(deadline, rings):
            if time.monotonic() - checked_at > SESSION_CHECK_SECONDS:
                checked_at = time.monotonic()
                if not await _off_loop(still_signed_in, session_key, user_id):
                    # The board stops showing the fleet to someone signed out; the page's
                    # reconnect is answered 204 and says so (static/js/live.js).
                    return
            fp = fingerprint(fleet, viewer, filters)
            if fp != last_fp:
                now_shown = await _off_loop(
                    functools.partial(render_board, at=fp),
                    request,
                    viewer,
                    filters,
                    here,
                    csrf_token,
                    shown,
                )
                # As for the baseline: the render read the database after the snapshot, so it
                # may show a change the snapshot lacks; known to show ``fp`` only if a snapshot
                # begun after the render still has it (one read for the streams that rendered).
                after = await hub.snapshot(read_after=time.monotonic())
                for name, data in changes(shown, now_shown):
                    yield _event(name, data, fp)
                    quiet_since = time.monotonic()
                shown = now_shown
                last_fp = fp if fingerprint(after, viewer, filters) == fp else ""
            if time.monotonic() - quiet_since > KEEPALIVE_SECONDS:
                yield f": keepalive {datetime.now().isoformat()}\n\n"
                quiet_since = time.monotonic()
    finally:
        if rings is not None:
            doorbell().unwatch(rings)
