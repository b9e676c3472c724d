"""The doorbell: one LISTEN connection per web process, fanned out to the agents' streams.

``queues.wakes`` is the one source of rings (a ``todo_ready`` NOTIFY at the commit that made work
claimable, already gated on pause and admission). Each web process runs one ``Doorbell`` on its
event loop: a single asyncio connection that LISTENs on ``todo_ready`` and hands each ring to the
streams attached for that endpoint (the REST event stream, the MCP server-to-client stream). A
stream costs an ``asyncio.Queue`` and a set entry, not a database connection, so a process holds
thousands of idle agents on one connection.

When the connection drops (a restart, ``pg_terminate_backend``), the doorbell reconnects with a
backoff of 1 s doubling to 30 s, and after reconnecting rings every attached stream for what is
claimable now (``waiting``): a NOTIFY sent while nobody listened is gone, so the rings missed in
between are re-derived from the table instead.

On attach a stream is rung for up to ``ATTACH_RINGS`` waiting claimable todos, so an agent that
connects to a full queue starts at once instead of waiting for the next commit.

The same connection LISTENs on ``endpoint_revoked`` (``queues.wakes.revoked``): a revoke ends
the endpoint's streams (``END``); after a reconnect, the endpoints revoked meanwhile are read
from the table, as the rings missed are.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from asgiref.sync import sync_to_async
from django.db import close_old_connections, connection

from queues import ring_gate, wakes
from queues.models import Endpoint, EndpointState

log = logging.getLogger(__name__)
ATTACH_RINGS = 3
APPLICATION_NAME = "switchboard-doorbell"  # how an operator (or a test) finds the LISTEN session
LISTEN_WAIT_SECONDS = 5.0
BACKOFF_MIN = 1.0
BACKOFF_MAX = 30.0
# A stream that falls this far behind loses the oldest rings (a ring is a hint; the agent claims).
QUEUE_BOUND = 100


@dataclass(frozen=True)
class Ring:
    """One notification for an agent: which todo, in which queue, why, and its event id (the
    millisecond it was dispatched, so a resumed stream can ask for what became claimable since)."""

    todo: str | None
    queue: str
    reason: str
    id: str

    def as_dict(self) -> dict[str, Any]:
        return {"todo": self.todo, "queue": self.queue, "reason": self.reason}


_last_event = (0, 0)  # the process's last event id: (milliseconds, sequence)
_event_lock = threading.Lock()


def _event_id() -> str:
    """An event id no other event of this process has: the millisecond it was made (what
    ``since_event`` replays from), then ``-N`` for the N-th more in that millisecond. A client
    that drops an id it has seen (de-duplicating after a reconnect) lost every ring but the
    first of each millisecond when several shared one (an attach rings three at once). Ids
    never go back, if the clock does."""
    global _last_event
    now = time.time_ns() // 1_000_000
    with _event_lock:
        ms, seq = _last_event
        _last_event = (now, 0) if now > ms else (ms, seq + 1)
        ms, seq = _last_event
    return f"{ms}-{seq}" if seq else str(ms)


def since_event(last_event_id: str | None) -> datetime | None:
    """The instant a ``Last-Event-ID`` names (None when absent or not one of ours)."""
    ms, dash, seq = (last_event_id or "").partition("-")
    # ASCII digits: str.isdigit() takes '²' too.
    if not (ms.isascii() and ms.isdigit()) or (dash and not (seq.isascii() and seq.isdigit())):
        return None
    try:
        return datetime.fromtimestamp(int(ms) / 1000, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None


# A stream's last ring: its endpoint was revoked, so the stream ends (``queues.events``).
END = Ring(todo=None, queue="", reason="revoked", id="")


@dataclass(eq=False)
class Subscription:
    endpoint_id: str
    rings: asyncio.Queue[Ring] = field(default_factory=lambda: asyncio.Queue(QUEUE_BOUND))

    def put(self, ring: Ring) -> None:
        if self.rings.full():
            self.rings.get_nowait()
        self.rings.put_nowait(ring)

    def end(self) -> None:
        """Nothing more for this stream: its endpoint was revoked."""
        self.put(END)


def waiting(endpoint_id: str, since: datetime | None, limit: int = ATTACH_RINGS) -> list[Ring]:
    """Up to ``limit`` claimable todos of the endpoint that every gate admits now (oldest first),
    changed after ``since`` if given. A failing gate check lets the todo through (fail open).

    Runs on an executor thread, which outlives the stream: the connection it takes is given
    back at the end (else each such thread would keep one checked out of the pool for ever)."""
    try:
        rings = _waiting(endpoint_id, since, limit)
        if not rings and since is not None:
            # Nothing changed since the event the stream last saw, yet work may wait that it was
            # never told of (an attach rings ATTACH_RINGS at most) or did not drain before it
            # left: one reminder, as an attach without Last-Event-ID would start with.
            rings = _waiting(endpoint_id, None, 1)
        return rings
    finally:
        connection.close()


def revoked_among(endpoint_ids: list[str]) -> list[str]:
    """Which of these endpoints are revoked (after a reconnect: a revoke's NOTIFY sent while
    nobody listened is gone). On an executor thread, its connection given back, as ``waiting``."""
    try:
        close_old_connections()
        revoked = Endpoint.objects.filter(id__in=endpoint_ids, state=EndpointState.REVOKED)
        return [str(pk) for pk in revoked.values_list("id", flat=True)]
    finally:
        connection.close()


def _waiting(endpoint_id: str, since: datetime | None, limit: int) -> list[Ring]:
    close_old_connections()  # an executor thread's connection may have aged or broken
    return [
        Ring(todo=todo_id, queue=queue, reason="waiting", id=_event_id())
        for todo_id, queue in ring_gate.admitted(endpoint_id, since=since, limit=limit)
    ]


class Doorbell:
    """The per-process hub (one per event loop)."""

    def __init__(self) -> None:
        self._subs: dict[str, set[Subscription]] = {}
        self._task: asyncio.Task[None] | None = None
        self.listening = asyncio.Event()
        self.connections = 0  # how many times LISTEN was established (the reconnect test reads it)
        self.backend_pid: int | None = None
        # Fleet-wide watchers (the live console board): set on every ring, whatever its endpoint.
        self._watchers: set[asyncio.Event] = set()

    def streams(self) -> int:
        return sum(len(s) for s in self._subs.values())

    def _ensure_started(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def attach(self, endpoint_id: str, since: datetime | None = None) -> Subscription:
        """Register a stream, then ring it for what already waits (registered first, so a ring
        committed meanwhile is not lost; at worst a todo is rung twice)."""
        sub = Subscription(endpoint_id=endpoint_id)
        self._subs.setdefault(endpoint_id, set()).add(sub)
        try:
            self._ensure_started()
            # Ring for what waits once LISTEN holds, so nothing committed in between is missed.
            # If the database is down, serve the stream anyway: the reconnect rings it later.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.listening.wait(), LISTEN_WAIT_SECONDS)
            if self.listening.is_set():
                await self._ring_waiting([sub], since)
        except BaseException:
            # Cancelled meanwhile (the client left while attaching): the caller never gets the
            # subscription to detach, so it is detached here.
            self.detach(sub)
            raise
        return sub

    def watch(self) -> asyncio.Event:
        """An event set by every ring of any endpoint (and by a reconnect); the watcher clears it."""
        event = asyncio.Event()
        self._watchers.add(event)
        self._ensure_started()
        return event

    def unwatch(self, event: asyncio.Event) -> None:
        self._watchers.discard(event)

    def detach(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.endpoint_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.endpoint_id]

    async def _ring_waiting(self, subs: list[Subscription], since: datetime | None) -> None:
        by_endpoint: dict[str, list[Subscription]] = {}
        for sub in subs:
            by_endpoint.setdefault(sub.endpoint_id, []).append(sub)
        for endpoint_id, group in by_endpoint.items():
            try:
                rings = await sync_to_async(waiting, thread_sensitive=False)(endpoint_id, since)
            except Exception:
                log.exception("could not read the waiting todos of %s", endpoint_id)
                continue
            for ring in rings:
                for sub in group:
                    sub.put(ring)

    def _end(self, endpoint_id: str) -> int:
        subs = self._subs.get(endpoint_id, set())
        for sub in subs:
            sub.end()
        return len(subs)

    async def _end_revoked(self) -> None:
        if not self._subs:
            return
        try:
            ended = await sync_to_async(revoked_among, thread_sensitive=False)(list(self._subs))
        except Exception:
            log.exception("could not read which endpoints were revoked")
            return
        for endpoint_id in ended:
            self._end(endpoint_id)

    def revoked(self, endpoint_id: str) -> int:
        """End the streams of a revoked endpoint; returns how many."""
        for event in self._watchers:  # the board shows the endpoint revoked
            event.set()
        return self._end(endpoint_id)

    def dispatch(self, raw: str) -> int:
        """Hand one NOTIFY payload to the streams of its endpoint; returns how many."""
        body = wakes.parse(raw)
        if body is None:
            return 0
        for event in self._watchers:
            event.set()
        subs = self._subs.get(str(body["e"]))
        if not subs:
            return 0
        ring = Ring(todo=body.get("t"), queue=str(body["q"]), reason=str(body["r"]), id=_event_id())
        for sub in subs:
            sub.put(ring)
        return len(subs)

    async def _run(self) -> None:
        backoff = BACKOFF_MIN
        # Django's parameters, less its (synchronous) cursor class.
        params = {
            k: v for k, v in connection.get_connection_params().items() if k != "cursor_factory"
        }
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    autocommit=True, **{**params, "application_name": APPLICATION_NAME}
                )
            except Exception:
                log.warning("doorbell: cannot connect; retrying in %.0f s", backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
                continue
            try:
                await conn.execute(f"LISTEN {wakes.CHANNEL}")
                await conn.execute(f"LISTEN {wakes.REVOKED_CHANNEL}")
                self.backend_pid = conn.info.backend_pid
                self.connections += 1
                if self.connections > 1:  # what became claimable while nobody listened
                    for event in self._watchers:
                        event.set()
                    await self._end_revoked()  # and who was revoked meanwhile
                    await self._ring_waiting([s for g in self._subs.values() for s in g], None)
                backoff = BACKOFF_MIN
                self.listening.set()
                async for note in conn.notifies():
                    if note.channel == wakes.REVOKED_CHANNEL:
                        self.revoked(note.payload)
                    else:
                        self.dispatch(note.payload)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning(
                    "doorbell: LISTEN connection lost; reconnecting in %.0f s",
                    backoff,
                    exc_info=True,
                )
            finally:
                self.listening.clear()
                await conn.close()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)


_DOORBELLS: dict[asyncio.AbstractEventLoop, Doorbell] = {}


def doorbell() -> Doorbell:
    """This process's doorbell (one per running event loop: uvicorn runs one)."""
    loop = asyncio.get_running_loop()
    bell = _DOORBELLS.get(loop)
    if bell is None:
        bell = _DOORBELLS[loop] = Doorbell()
    return bell
